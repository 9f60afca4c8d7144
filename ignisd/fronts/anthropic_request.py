"""An Anthropic Messages body as the socket's `chat` body (DESIGN §5, HTTP fronts): the mapping, and the stripping of
Claude Code's per-request billing nonce.

``to_chat(body, strip_billing)`` → ``(chat body, paths)``: an OpenAI-shaped chat body for ``protocol.parse_request``,
and for each of its messages the Anthropic path it came from (``system``, ``messages[3]``), so an error the chat
parser or the template raises names the field the client sent (``remap``).

* ``system`` (a string or a list of text blocks) and the ``system``-role messages that open ``messages`` (recent
  Claude Code sends some there) become one system message; its content is the list of their text blocks, which the
  edge joins without a separator, as it joins every list of text parts. A system-role message after the
  conversation began becomes a user turn (chat templates such as Qwen3.5's allow a system message only first).
* Billing header: with `strip_billing`, a system text block starting ``x-anthropic-billing-header:`` (Claude Code
  puts a per-request nonce ``cch=…`` there, which would end every prompt's shared prefix at its first block) is
  dropped; a system string starting with it loses its first line.
* user content: text blocks → a user message of text parts; each ``tool_result`` → a ``tool`` message
  (``tool_call_id`` = ``tool_use_id``; string content or text blocks); images and documents → model_unsupported.
* assistant content: text blocks → content, ``thinking`` → reasoning_content, ``tool_use`` → tool_calls (arguments =
  ``input``); ``redacted_thinking`` is skipped (opaque). A final assistant message (a prefill to continue) is refused
  (model_unsupported): the chat op always opens a new assistant turn.
* ``tools``: custom tools (no ``type``, or ``"custom"``) → function tools with ``input_schema`` as parameters; server
  tools (``web_search_…``, ``bash_…``, …) are ignored with a log line. ``tool_choice`` auto / any / tool / none →
  auto / required / the named function / none. ``thinking`` enabled / adaptive / disabled → the template's
  ``enable_thinking``. ``stop_sequences`` → stop; max_tokens, temperature, top_p, top_k, stream as they are; the
  ignis fields priority, cache_prompt, seed, min_p and chat_template_kwargs pass through.

Raises ProtocolError (bad_request / model_unsupported) naming the Anthropic field. †: imports no torch.
"""
from __future__ import annotations


from ignis_client import protocol as P
from ignis_client.wire import _shown

from ignisd.fronts.chat_body import bad, function_tools, message_path, renamed

BILLING_PREFIX = "x-anthropic-billing-header:"
PASS_THROUGH = ("max_tokens", "temperature", "top_p", "top_k", "stream", "priority", "cache_prompt", "seed", "min_p")


_bad = bad


def _is_billing(text: str) -> bool:
    return text.lstrip().startswith(BILLING_PREFIX)


def _system_texts(v, field: str, strip: bool) -> list[str]:
    """The text of a system string or list of text blocks, billing blocks dropped when `strip`."""
    if v is None:
        return []
    if isinstance(v, str):
        if strip and _is_billing(v):
            _, _, v = v.lstrip().partition("\n")
        return [v] if v else []
    if not isinstance(v, list):
        raise _bad(field, "must be a string or a list of text blocks")
    out = []
    for i, b in enumerate(v):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise _bad(f"{field}[{i}]", 'must be a text block {"type": "text", "text": ...}')
        if not (strip and _is_billing(b["text"])):
            out.append(b["text"])
    return out


def _parts(texts: list[str]) -> list[dict]:
    return [{"type": "text", "text": t} for t in texts]


def _tool_result(b: dict, field: str) -> dict:
    tid = b.get("tool_use_id")
    if not isinstance(tid, str) or not tid:
        raise _bad(f"{field}.tool_use_id", "required (the id of the tool_use block it answers)")
    c = b.get("content", "")
    if isinstance(c, list):
        texts = []
        for k, part in enumerate(c):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in ("image", "document"):
                raise _bad(f"{field}.content[{k}]", f"{kind} blocks need a model that reads them; this one reads text",
                           "model_unsupported")
            if kind != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"{field}.content[{k}]", "must be a text block")
            texts.append(part["text"])
        c = _parts(texts) if texts else ""
    elif not isinstance(c, str):
        raise _bad(f"{field}.content", "must be a string or a list of text blocks")
    return {"role": "tool", "tool_call_id": tid, "content": c}


def _user(content, p: str) -> list[dict]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise _bad(f"{p}.content", "must be a string or a list of content blocks")
    out: list[dict] = []
    texts: list[str] = []
    for k, b in enumerate(content):
        q = f"{p}.content[{k}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            if not isinstance(b.get("text"), str):
                raise _bad(f"{q}.text", "must be a string")
            texts.append(b["text"])
        elif kind == "tool_result":
            if texts:
                out.append({"role": "user", "content": _parts(texts)})
                texts = []
            out.append(_tool_result(b, q))
        elif kind in ("image", "document"):
            raise _bad(q, f"{kind} blocks need a model that reads them; this one reads text", "model_unsupported")
        else:
            raise _bad(f"{q}.type", f"unsupported block type {_shown(kind)} in a user message (text, tool_result)")
    if texts or not out:
        out.append({"role": "user", "content": _parts(texts) if texts else ""})
    return out


def _assistant(content, p: str) -> dict:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise _bad(f"{p}.content", "must be a string or a list of content blocks")
    texts, thinking, calls = [], [], []
    for k, b in enumerate(content):
        q = f"{p}.content[{k}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            texts.append(b["text"])
        elif kind == "thinking" and isinstance(b.get("thinking"), str):
            thinking.append(b["thinking"])
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise _bad(q, "a tool_use block needs a string id and name")
            args = b.get("input", {})
            if not isinstance(args, dict):
                raise _bad(f"{q}.input", "must be an object")
            calls.append({"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": args}})
        else:
            raise _bad(f"{q}.type", f"unsupported block type {_shown(kind)} in an assistant message "
                                    "(text, thinking, redacted_thinking, tool_use)")
    msg: dict = {"role": "assistant", "content": _parts(texts) if texts else (None if calls else "")}
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _schema(t: dict, i: int) -> dict:
    schema = t.get("input_schema", {"type": "object", "properties": {}})
    if not isinstance(schema, dict):
        raise _bad(f"tools[{i}].input_schema", "must be a JSON schema object")
    return schema


def _tools(body: dict) -> list[dict] | None:
    return function_tools(body, "messages", lambda t: t.get("type") in (None, "custom"), _schema)


def _tool_choice(tc):
    if tc is None:
        return None
    kind = tc.get("type") if isinstance(tc, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(tc.get("name"), str):
        return {"type": "function", "function": {"name": tc["name"]}}
    raise _bad("tool_choice", 'must be {"type": "auto" | "any" | "none"} or {"type": "tool", "name": ...}')


def _thinking(v) -> bool | None:
    if v is None:
        return None
    kind = v.get("type") if isinstance(v, dict) else None
    if kind in ("enabled", "adaptive"):
        return True
    if kind == "disabled":
        return False
    raise _bad("thinking.type", "must be enabled, adaptive or disabled")


def to_chat(body: dict, strip_billing: bool) -> tuple[dict, list[str]]:
    """A Messages body → (chat body, Anthropic path of each chat message); see the module docstring."""
    msgs = body.get("messages")
    if msgs is None:
        raise _bad("messages", "required (a non-empty list of messages)")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages", f"must be a non-empty list of messages, got {_shown(msgs)}")
    for j, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise _bad(f"messages[{j}]", "must be an object")
    system = _system_texts(body.get("system"), "system", strip_billing)
    first = 0
    while first < len(msgs) and msgs[first].get("role") == "system":
        system += _system_texts(msgs[first].get("content"), f"messages[{first}].content", strip_billing)
        first += 1
    out, paths = [], []
    if system:
        out.append({"role": "system", "content": _parts(system)})
        paths.append("system")
    for j in range(first, len(msgs)):
        m, p = msgs[j], f"messages[{j}]"
        role = m.get("role")
        if role == "assistant":
            if j == len(msgs) - 1:
                raise _bad(p, "a final assistant message (a prefill to continue) is not supported; end with a user "
                              "message", "model_unsupported")
            made = [_assistant(m.get("content"), p)]
        elif role == "user":
            made = _user(m.get("content"), p)
        elif role == "system":   # after the conversation began: a user turn (templates allow system only first)
            made = [{"role": "user", "content": _parts(_system_texts(m.get("content"), f"{p}.content", False))}]
        else:
            raise _bad(f"{p}.role", f"must be user or assistant (or system), got {_shown(role)}")
        out += made
        paths += [p] * len(made)
    chat: dict = {"messages": out}
    for k in PASS_THROUGH:
        if body.get(k) is not None:
            chat[k] = body[k]
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    if (tools := _tools(body)) is not None:
        chat["tools"] = tools
    if (tc := _tool_choice(body.get("tool_choice"))) is not None:
        chat["tool_choice"] = tc
    kwargs = body.get("chat_template_kwargs")
    think = _thinking(body.get("thinking"))
    if think is not None:
        kwargs = {**(kwargs if isinstance(kwargs, dict) else {}), "enable_thinking": think}
    if kwargs is not None:
        chat["chat_template_kwargs"] = kwargs
    return chat, paths


def check_output_format(body: dict) -> None:
    """Structured output (``output_format``, or ``output_config.format``: json_schema) is refused as the chat's
    response_format is (P.check_response_format), naming the field the client used. For a generation only:
    count_tokens counts the prompt whatever format is asked."""
    name, fmt = "output_format", body.get("output_format")
    if fmt is None and isinstance(body.get("output_config"), dict):
        name, fmt = "output_config.format", body["output_config"].get("format")
    if isinstance(fmt, dict):
        try:
            P.check_response_format({"type": fmt.get("type")})
        except P.ProtocolError as e:
            raise renamed(e, f"{name}.type") from None


def remap(e: P.ProtocolError, paths: list[str]) -> P.ProtocolError:
    """`e` with a chat message path (``messages[k]…``) rewritten as the Anthropic path it came from."""
    new = message_path(e.field, paths)
    if new is None:
        if e.field == "stop" or (e.field or "").startswith("stop["):
            e.field = "stop_sequences" + e.field[4:]
        return e
    return renamed(e, new)
