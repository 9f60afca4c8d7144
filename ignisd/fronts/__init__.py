"""Fronts: one renderer per API over the same edge events (DESIGN §3). Each maps its wire body onto the edge's ops
(``ignisd.edge.Edge``) and writes the edge events in its own shape: ``ndjson`` (the Unix socket), and over HTTP
(``http``: the aiohttp listener; ``sse``: one generation's flow) ``openai``, ``anthropic`` and ``responses``."""
