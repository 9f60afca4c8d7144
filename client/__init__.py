"""ignis_client: the wire protocol of ignisd (``ignis_client.protocol``) and its clients. No torch."""
from .client import AsyncClient, AsyncEventStream, Client, DaemonNotRunning, IgnisError, ReplyTimeout
from .protocol import ProtocolError, resolve_socket_path

__all__ = ["AsyncClient", "AsyncEventStream", "Client", "DaemonNotRunning", "IgnisError", "ProtocolError",
           "ReplyTimeout", "resolve_socket_path"]
