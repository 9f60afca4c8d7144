"""Fronts: one renderer per API over the same edge events (DESIGN §3). Each maps its wire body onto the edge's ops
(``ignisd.edge.Edge``) and writes the edge events in its own shape; today only ``ndjson`` (the Unix socket)."""
