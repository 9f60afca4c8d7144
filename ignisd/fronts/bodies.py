"""An HTTP front's request body as the socket's chat op, front-independently: the `tokenize` op's ``api`` + ``body``
(``ignis lint``, ``ignisd lint``) renders exactly what the front would (DESIGN §5, HTTP fronts). †: imports no torch.

``chat_body(api, body, strip_billing)`` → ``(chat body, paths)``: ``api`` is one of ``ignis_client.protocol``'s
``BODY_APIS`` — ``openai`` (a chat.completions body: itself), ``anthropic`` (``anthropic_request.to_chat``),
``responses`` (``responses_request.to_chat``); ``paths`` names, for each chat message, the body field it came from.
``tokenize_body(prompts, api, body, …)`` → the `tokenize` result of that body (ignisd.prompt.Prompts.tokenize) plus
``chat``: ``{"messages", "tools"}`` of the mapped chat body (what the template was given, before the developer
policy and tool canonicalisation), so lint can compare two requests message by message. Errors raise ProtocolError
naming the field of the body as the client sent it.
"""
from __future__ import annotations

from ignis_client import protocol as P
from ignis_client.wire import _shown

from ignisd.fronts import anthropic_request, responses_request
from ignisd.fronts.sse import parse_op


def chat_body(api: str, body: dict, strip_billing: bool = True) -> tuple[dict, list[str] | None]:
    """(chat body, field path of each chat message or None for openai). Raises ProtocolError (bad_request for an
    unknown api, or the mapper's error)."""
    if api == "openai":
        return body, None
    if api == "anthropic":
        return anthropic_request.to_chat(body, strip_billing)
    if api == "responses":
        return responses_request.to_chat(body)
    raise P.ProtocolError("bad_request", f"api: must be one of {', '.join(P.BODY_APIS)}; got {_shown(api)}", "api")


def _remap(api: str, e: P.ProtocolError, paths: list[str] | None) -> P.ProtocolError:
    if api == "anthropic":
        return anthropic_request.remap(e, paths)
    if api == "responses":
        return responses_request.remap(e, paths)
    return e


def tokenize_body(prompts, api: str, body: dict, strip_billing: bool = True, add_generation_prompt: bool = True,
                  rid: str = "tokenize") -> dict:
    """The `tokenize` result of an HTTP front's `body` (see the module docstring). prompts: ignisd.prompt.Prompts.
    Raises ProtocolError naming the body's field."""
    chat, paths = chat_body(api, body, strip_billing)
    try:
        op = parse_op({**chat, "add_generation_prompt": add_generation_prompt}, "tokenize", rid)
        out = prompts.tokenize(op)
    except P.ProtocolError as e:
        raise _remap(api, e, paths) from None
    out["chat"] = {"messages": chat.get("messages"), "tools": chat.get("tools")}
    return out
