"""An OpenAI Responses body (what Codex CLI sends) as the socket's `chat` body (DESIGN §5, HTTP fronts).

``to_chat(body)`` → ``(chat body, paths)``: an OpenAI-shaped chat body for ``protocol.parse_request`` and, for each of
its messages, the Responses path it came from (``instructions``, ``input[4]``) for error messages (``remap``).

* ``instructions`` → the first system message. ``input``: a string (one user message) or a list of items:
  messages (``{"type": "message", "role", "content"}`` or without ``type``; content a string or parts
  ``input_text`` / ``output_text`` / ``text``, joined without a separator; ``input_image`` / ``input_file`` →
  model_unsupported), ``function_call`` (``call_id``, ``name``, ``arguments`` JSON string: joins the assistant
  message right before it, or opens one), ``function_call_output`` (a ``tool`` message, ``tool_call_id`` =
  ``call_id``), ``reasoning`` (its ``content`` reasoning_text, else its ``summary`` texts, become the next assistant
  message's reasoning_content). Items of other types (the calls of tools ignis does not run: ``local_shell_call``,
  ``custom_tool_call``, ``web_search_call``, ``item_reference``, …) are ignored with a log line.
* An empty input (``[]`` or ``""``, e.g. a probe with ``max_output_tokens: 1``) is one empty user message.
* ``tools``: ``function`` tools → chat function tools; every other type (``local_shell``, ``web_search``, ``custom``,
  …) is ignored with a log line. ``tool_choice`` auto / none / required / ``{"type": "function", "name"}``.
* ``max_output_tokens`` → max_tokens; temperature, top_p, stream as they are; ``reasoning.effort`` none or minimal
  → the template's ``enable_thinking`` false; the ignis fields priority, cache_prompt, seed, top_k, min_p and
  chat_template_kwargs pass through. ``previous_response_id`` is refused: ignis keeps no response store. A
  ``text.format`` other than text (structured output) is the chat's ``response_format``, refused naming
  ``text.format.type``.

Raises ProtocolError naming the Responses field. †: imports no torch.
"""
from __future__ import annotations


import orjson
from ignis_client import protocol as P
from ignis_client.wire import _shown

from ignisd.fronts.chat_body import bad, function_tools, message_path, renamed
from ignisd.log import get_logger

log = get_logger("srv")
PASS_THROUGH = ("temperature", "top_p", "stream", "priority", "cache_prompt", "seed", "top_k", "min_p")
TEXT_PARTS = ("input_text", "output_text", "text")


_bad = bad


def _text(content, field: str):
    """A message item's content as a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(field, "must be a string or a list of content parts")
    parts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_image", "input_file", "input_audio"):
            raise _bad(f"{field}[{k}]", f"{kind} parts need a model that reads them; this one reads text",
                       "model_unsupported")
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
            continue
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise _bad(f"{field}[{k}]", f"must be a text part ({', '.join(TEXT_PARTS)})")
        parts.append({"type": "text", "text": part["text"]})
    return parts


def _reasoning(item: dict) -> str:
    texts = [c.get("text") for c in item.get("content") or [] if isinstance(c, dict)]
    if not any(isinstance(t, str) and t for t in texts):
        texts = [s.get("text") for s in item.get("summary") or [] if isinstance(s, dict)]
    return "\n\n".join(t for t in texts if isinstance(t, str) and t)


def _output(v, field: str):
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return _text(v, field)
    raise _bad(field, "must be a string or a list of text parts")


def _items(items: list, out: list[dict], paths: list[str]) -> None:
    reasoning: list[str] = []
    for i, it in enumerate(items):
        p = f"input[{i}]"
        if not isinstance(it, dict):
            raise _bad(p, "must be an object")
        kind = it.get("type", "message" if "role" in it else None)
        if kind == "message":
            role = it.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise _bad(f"{p}.role", f"must be user, assistant, system or developer, got {_shown(role)}")
            msg = {"role": role, "content": _text(it.get("content"), f"{p}.content")}
            if role == "assistant" and reasoning:
                msg["reasoning_content"], reasoning = "\n\n".join(reasoning), []
            out.append(msg)
            paths.append(p)
        elif kind == "function_call":
            for k in ("call_id", "name"):
                if not isinstance(it.get(k), str) or not it[k]:
                    raise _bad(f"{p}.{k}", "required (a string)")
            args = it.get("arguments", "{}")
            if isinstance(args, str):
                try:
                    args = orjson.loads(args) if args.strip() else {}
                except orjson.JSONDecodeError as e:
                    raise _bad(f"{p}.arguments", f"is not valid JSON: {e}") from None
            if not isinstance(args, dict):
                raise _bad(f"{p}.arguments", "must be a JSON object (or a string holding one)")
            call = {"id": it["call_id"], "type": "function", "function": {"name": it["name"], "arguments": args}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if reasoning:
                    last["reasoning_content"], reasoning = "\n\n".join(reasoning), []
            else:
                msg = {"role": "assistant", "content": None, "tool_calls": [call]}
                if reasoning:
                    msg["reasoning_content"], reasoning = "\n\n".join(reasoning), []
                out.append(msg)
                paths.append(p)
        elif kind == "function_call_output":
            if not isinstance(it.get("call_id"), str) or not it["call_id"]:
                raise _bad(f"{p}.call_id", "required (the call_id of the function_call it answers)")
            out.append({"role": "tool", "tool_call_id": it["call_id"],
                        "content": _output(it.get("output", ""), f"{p}.output")})
            paths.append(p)
        elif kind == "reasoning":
            if text := _reasoning(it):
                reasoning.append(text)
        else:
            log.info("input_item_ignored", api="responses", type=str(kind)[:64])


def _tools(body: dict) -> list[dict] | None:
    return function_tools(body, "responses", lambda t: t.get("type") == "function",
                          lambda t, i: t.get("parameters") or {"type": "object", "properties": {}})


def _tool_choice(tc):
    if tc is None or tc in ("auto", "none", "required"):
        return tc
    if isinstance(tc, dict) and tc.get("type") == "function" and isinstance(tc.get("name"), str):
        return {"type": "function", "function": {"name": tc["name"]}}
    if isinstance(tc, dict):   # a built-in tool's choice: that tool is ignored, so is the choice
        log.info("tool_choice_ignored", api="responses", type=str(tc.get("type"))[:64])
        return None
    raise _bad("tool_choice", 'must be "auto", "none", "required" or {"type": "function", "name": ...}')


def to_chat(body: dict) -> tuple[dict, list[str]]:
    """A Responses body → (chat body, Responses path of each chat message); see the module docstring."""
    if body.get("previous_response_id") is not None:
        raise _bad("previous_response_id", "ignis keeps no response store; send the whole conversation in `input` "
                                           "(prompt reuse is by content, so resending it costs no prefill)")
    out: list[dict] = []
    paths: list[str] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _bad("instructions", "must be a string")
        out.append({"role": "system", "content": instructions})
        paths.append("instructions")
    if "input" not in body:
        raise _bad("input", "required: a string or a list of input items ([] or \"\" for an empty probe)")
    inp = body["input"]
    if isinstance(inp, str):
        if inp:
            out.append({"role": "user", "content": inp})
            paths.append("input")
    elif isinstance(inp, list):
        _items(inp, out, paths)
    else:
        raise _bad("input", f"must be a string or a list of input items, got {_shown(inp)}")
    if not any(m["role"] != "system" for m in out):   # an empty probe: one empty user message
        out.append({"role": "user", "content": ""})
        paths.append("input")
    chat: dict = {"messages": out}
    for k in PASS_THROUGH:
        if body.get(k) is not None:
            chat[k] = body[k]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if (tools := _tools(body)) is not None:
        chat["tools"] = tools
    if (tc := _tool_choice(body.get("tool_choice"))) is not None:
        chat["tool_choice"] = tc
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type", "text") != "text":   # structured output: refused by the chat parse
        chat["response_format"] = {"type": fmt.get("type")}
    kwargs = body.get("chat_template_kwargs")
    effort = (body.get("reasoning") or {}).get("effort") if isinstance(body.get("reasoning"), dict) else None
    if effort in ("none", "minimal"):
        kwargs = {**(kwargs if isinstance(kwargs, dict) else {}), "enable_thinking": False}
    if kwargs is not None:
        chat["chat_template_kwargs"] = kwargs
    return chat, paths


def remap(e: P.ProtocolError, paths: list[str]) -> P.ProtocolError:
    """`e` with a chat path rewritten as the Responses field (``messages[k]`` → its item, ``messages`` → input,
    max_tokens → max_output_tokens)."""
    new = message_path(e.field, paths) or {"max_tokens": "max_output_tokens", "messages": "input",
                                           "response_format.type": "text.format.type"}.get(e.field)
    return e if new is None else renamed(e, new)
