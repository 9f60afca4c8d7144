"""What the Anthropic Messages and Responses request mappers share (``anthropic_request.py``, ``responses_request.py``):
the bad_request error, the loop that turns a body's tool list into chat function tools, and the rewrite of a chat
message path (``messages[k]…``) back into the front's own path. †: imports no torch.
"""
from __future__ import annotations

import re
from collections.abc import Callable

from ignis_client import protocol as P

from ignisd.log import get_logger

log = get_logger("srv")
_MSG_PATH = re.compile(r"^messages\[(\d+)\]")


def bad(field: str, message: str, code: str = "bad_request") -> P.ProtocolError:
    """A ProtocolError naming `field`, its message prefixed with it (as the wire's own errors are)."""
    return P.ProtocolError(code, f"{field}: {message}", field)


def function_tools(body: dict, api: str, accepted: Callable[[dict], bool],
                   parameters: Callable[[dict, int], dict]) -> list[dict] | None:
    """``body["tools"]`` as chat function tools (``{"type": "function", "function": {name, description?,
    parameters}}``, OpenAI's key order: the template prints each tool as JSON in this order), or None for none.
    A tool that `accepted` refuses is skipped with a ``tool_ignored`` log line naming `api`; `parameters(tool, i)`
    gives its JSON schema (raising ProtocolError for a bad one). Raises ProtocolError naming ``tools`` /
    ``tools[i]`` / ``tools[i].name``."""
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad("tools", "must be a list of tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise bad(f"tools[{i}]", "must be an object")
        if not accepted(t):
            log.info("tool_ignored", api=api, type=str(t.get("type"))[:64], name=str(t.get("name"))[:64])
            continue
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise bad(f"tools[{i}].name", "required (a string)")
        schema = parameters(t, i)
        fn = {"name": t["name"]}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        fn["parameters"] = schema
        out.append({"type": "function", "function": fn})
    return out or None


def message_path(field: str | None, paths: list[str]) -> str | None:
    """`field` (``messages[k]…`` of the chat body) as the front's path ``paths[k]…``; None when it names no
    mapped message."""
    m = _MSG_PATH.match(field or "")
    if m is None or int(m[1]) >= len(paths):
        return None
    return paths[int(m[1])] + field[m.end():]


def renamed(e: P.ProtocolError, new: str) -> P.ProtocolError:
    """`e` naming `new` instead of its field, in its field and its message."""
    e.message = e.message.replace(e.field, new, 1)
    e.field = new
    return e
