"""Clients of ignisd over its Unix socket: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

Standard library + orjson only (no torch). One connection carries any number of in-flight requests; replies are
matched to requests by id. Generating ops return the ``done`` reply (or, with ``stream=True``, an iterator of
events that ends with ``done``); the other ops return their ``result`` object. An ``error`` reply raises
``IgnisError``; a daemon that is not listening raises ``DaemonNotRunning`` naming the socket path tried; no reply
within the client's timeout raises ``ReplyTimeout`` (a TimeoutError).

The blocking client lives in ``sync_client``, the asyncio one in ``async_client`` and what they share (request framing,
reply decoding, the errors) in ``framing``; everything is re-exported here.
"""
from __future__ import annotations

from .async_client import AsyncClient, AsyncEventStream
from .framing import TERMINAL, DaemonNotRunning, IgnisError, ReplyTimeout
from .sync_client import Client

__all__ = ["AsyncClient", "AsyncEventStream", "Client", "DaemonNotRunning", "IgnisError", "ReplyTimeout", "TERMINAL"]
