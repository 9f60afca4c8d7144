"""Request ops of the ignis wire protocol (DESIGN §5): the ``*Op`` dataclasses and ``parse_request`` (dict → op).

Every validation failure raises ``ProtocolError`` naming the field path. Re-exported by ``protocol``, the one import
point. Standard library and orjson only (†: no torch).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

import orjson

from .sampling_fields import Sampling, parse_sampling
from .wire import (MAX_ID_CHARS, MAX_TOP_LOGPROBS, OPS, PRIORITIES, ROLES, ProtocolError,
                   _bad, _bool, _choice, _int, _json_type, _list, _obj, _opt, _shown, _str, _token_ids)


# ---------------------------------------------------------------- ops

@dataclass(frozen=True)
class ChatOp:
    """``chat``: messages are the validated OpenAI message dicts, passed through unmodified (tool_calls arguments
    may still be JSON strings; content may be a list of parts)."""
    op: ClassVar[str] = "chat"
    id: str
    messages: list[dict]
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    sampling: Sampling = field(default_factory=Sampling)
    stream: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    chat_template_kwargs: dict = field(default_factory=dict)
    priority: str = "interactive"
    cache_prompt: bool = True
    api_key: str | None = None


@dataclass(frozen=True)
class CompletionOp:
    """``completion``: prompt is text or a non-empty list of token ids; prompt_logprobs K (0..20) or None."""
    op: ClassVar[str] = "completion"
    id: str
    prompt: str | list[int]
    sampling: Sampling = field(default_factory=Sampling)
    stream: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: int | None = None
    priority: str = "interactive"
    cache_prompt: bool = True
    api_key: str | None = None


@dataclass(frozen=True)
class CancelOp:
    """``cancel``: target is the id of an in-flight request of the same connection."""
    op: ClassVar[str] = "cancel"
    id: str
    target: str
    api_key: str | None = None


@dataclass(frozen=True)
class TokenizeOp:
    """``tokenize``: exactly one of text (tokenize as is), chat (a chat body to render with the template), or an HTTP
    front's body: ``api`` (one of ``BODY_APIS``) and ``body`` (the request body as that front takes it; the daemon
    maps it with the front's own request mapper, so the rendering equals the front's; for ``openai`` ``chat`` is
    also set)."""
    op: ClassVar[str] = "tokenize"
    id: str
    text: str | None = None
    chat: ChatOp | None = None
    add_generation_prompt: bool = True
    api_key: str | None = None
    api: str | None = None
    body: dict | None = None


BODY_APIS = ("openai", "anthropic", "responses")   # tokenize's `api`: the HTTP fronts' body shapes


@dataclass(frozen=True)
class DetokenizeOp:
    """``detokenize``: tokens → text."""
    op: ClassVar[str] = "detokenize"
    id: str
    tokens: list[int]
    api_key: str | None = None


@dataclass(frozen=True)
class SimpleOp:
    """``health`` / ``status`` / ``metrics`` / ``reset``: no fields besides the envelope."""
    id: str
    op: str
    api_key: str | None = None


Op = Union[ChatOp, CompletionOp, CancelOp, TokenizeOp, DetokenizeOp, SimpleOp]


def parse_envelope(obj: dict) -> tuple[str, str]:
    """Check ``id`` (string of 1..128 chars) and ``op`` (a known op) and return them.

    Raises ProtocolError bad_request field "id" (id None) or, with the id, bad_request/unknown_op field "op".
    """
    rid = obj.get("id")
    if not isinstance(rid, str) or not 1 <= len(rid) <= MAX_ID_CHARS:
        what = "missing" if rid is None else f"got {_json_type(rid)}" if not isinstance(rid, str) \
            else f"got {len(rid)} characters"
        raise ProtocolError("bad_request", f"id: must be a string of 1 to {MAX_ID_CHARS} characters; {what}", "id")
    op = obj.get("op")
    if not isinstance(op, str):
        raise ProtocolError("bad_request", f"op: must be a string naming the operation, one of {', '.join(OPS)}",
                            "op", rid)
    if op not in OPS:
        raise ProtocolError("unknown_op", f"op: unknown operation {_shown(op, 64)}; known: {', '.join(OPS)}", "op", rid)
    return rid, op


def parse_request(obj: dict) -> Op:
    """Validate a decoded request and return its op dataclass. Unknown fields are ignored.

    Raises ProtocolError (bad_request / unknown_op) naming the field path; its id is the request's id when the
    envelope was valid.
    """
    rid, op = parse_envelope(obj)
    try:
        key = obj.get("api_key")
        api_key = None if key is None else _str(key, "api_key")
        if op == "chat":
            return _parse_chat(rid, obj, api_key)
        if op == "completion":
            return _parse_completion(rid, obj, api_key)
        if op == "cancel":
            t = obj.get("target")
            if not isinstance(t, str) or not 1 <= len(t) <= MAX_ID_CHARS:
                raise _bad("target", f"must be the id (string of 1 to {MAX_ID_CHARS} characters) of an in-flight "
                                     f"request, got {_shown(t)}")
            return CancelOp(rid, t, api_key)
        if op == "tokenize":
            return _parse_tokenize(rid, obj, api_key)
        if op == "detokenize":
            if "tokens" not in obj:
                raise _bad("tokens", "required (a list of token ids)")
            return DetokenizeOp(rid, _token_ids(obj["tokens"], "tokens", non_empty=False), api_key)
        return SimpleOp(rid, op, api_key)
    except ProtocolError as e:
        e.id = rid
        raise


def _logprob_fields(obj: dict, legacy_int: bool) -> tuple[bool, int]:
    lp = obj.get("logprobs")
    top = _opt(obj, "top_logprobs", None, _int, 0, MAX_TOP_LOGPROBS)
    if legacy_int and isinstance(lp, int) and not isinstance(lp, bool):  # legacy completions: logprobs = top count
        n = _int(lp, "logprobs", 0, MAX_TOP_LOGPROBS)
        return True, n if top is None else top
    logprobs = False if lp is None else _bool(lp, "logprobs")
    if top and not logprobs:
        raise _bad("top_logprobs", "requires logprobs: true")
    return logprobs, top or 0


def _common(obj: dict) -> dict:
    return dict(stream=_opt(obj, "stream", False, _bool),
                priority=_opt(obj, "priority", "interactive", _choice, PRIORITIES),
                cache_prompt=_opt(obj, "cache_prompt", True, _bool))


def parse_messages(v: Any) -> list[dict]:
    """Validate an OpenAI ``messages`` array (field paths ``messages[i].role`` etc.) and return it unchanged."""
    if v is None:
        raise _bad("messages", "required (a non-empty array of messages)")
    _list(v, "messages")
    if not v:
        raise _bad("messages", "must not be empty")
    for i, m in enumerate(v):
        p = f"messages[{i}]"
        _obj(m, p)
        role = m.get("role")
        if role is None:
            raise _bad(f"{p}.role", f"required; one of {', '.join(ROLES)}")
        _choice(role, f"{p}.role", ROLES)
        tool_calls = m.get("tool_calls")
        if tool_calls is not None:
            if role != "assistant":
                raise _bad(f"{p}.tool_calls", "only assistant messages carry tool_calls")
            _check_tool_calls(tool_calls, f"{p}.tool_calls")
        content = m.get("content")
        if content is None:
            if not (role == "assistant" and tool_calls):
                raise _bad(f"{p}.content", "required (a string or a list of content parts); may be null only for "
                                           "an assistant message with tool_calls")
        elif isinstance(content, list):
            for j, part in enumerate(content):
                q = f"{p}.content[{j}]"
                _obj(part, q)
                _str(part.get("type"), f"{q}.type")
                if part["type"] == "text":
                    _str(part.get("text"), f"{q}.text")
        elif not isinstance(content, str):
            raise _bad(f"{p}.content", f"must be a string, a list of content parts or null, got {_json_type(content)}")
        for k in ("name", "tool_call_id", "reasoning_content"):
            if m.get(k) is not None:
                _str(m[k], f"{p}.{k}")
    return v


def _check_tool_calls(v: Any, p: str) -> None:
    _list(v, p)
    for j, tc in enumerate(v):
        q = f"{p}[{j}]"
        _obj(tc, q)
        fn = _obj(tc.get("function"), f"{q}.function")
        _str(fn.get("name"), f"{q}.function.name")
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = orjson.loads(args) if args.strip() else {}
            except orjson.JSONDecodeError as e:
                raise _bad(f"{q}.function.arguments", f"is a string but not valid JSON: {e}") from None
        if args is not None and not isinstance(args, dict):
            raise _bad(f"{q}.function.arguments", "must be a JSON object or a string holding one")


def _parse_tools(obj: dict) -> list[dict] | None:
    tools = obj.get("tools")
    if tools is None:
        return None
    _list(tools, "tools")
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        _obj(t, p)
        if t.get("type", "function") != "function":
            raise _bad(f"{p}.type", f"must be \"function\", got {_shown(t.get('type'))}")
        fn = _obj(t.get("function"), f"{p}.function")
        _str(fn.get("name"), f"{p}.function.name")
        if fn.get("parameters") is not None:
            _obj(fn["parameters"], f"{p}.function.parameters")
    return tools


def _parse_chat(rid: str, obj: dict, api_key: str | None) -> ChatOp:
    messages = parse_messages(obj.get("messages"))
    tools = _parse_tools(obj)
    tc = obj.get("tool_choice")
    if tc is not None and not (isinstance(tc, str) and tc in ("none", "auto", "required")):
        if not isinstance(tc, dict):
            raise _bad("tool_choice", f'must be "none", "auto", "required" or {{"type": "function", "function": '
                                      f'{{"name": ...}}}}, got {_shown(tc)}')
        fn = _obj(tc, "tool_choice").get("function")
        _str(_obj(fn, "tool_choice.function").get("name"), "tool_choice.function.name")
    logprobs, top = _logprob_fields(obj, legacy_int=False)
    return ChatOp(id=rid, messages=messages, tools=tools, tool_choice=tc, sampling=parse_sampling(obj),
                  logprobs=logprobs, top_logprobs=top,
                  chat_template_kwargs=_opt(obj, "chat_template_kwargs", {}, _obj), api_key=api_key, **_common(obj))


def _parse_completion(rid: str, obj: dict, api_key: str | None) -> CompletionOp:
    prompt = obj.get("prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("prompt", "must not be empty")
    elif isinstance(prompt, list):
        if prompt and isinstance(prompt[0], (str, list)):     # OpenAI's batch forms: several prompts in one request
            raise _bad("prompt", f"a list of prompts (a batch of {len(prompt)}) is not served: send one prompt a "
                                 "request, a string or a list of token ids")
        _token_ids(prompt, "prompt", non_empty=True)
    else:
        raise _bad("prompt", "required: a non-empty string or a non-empty list of token ids"
                   + ("" if prompt is None else f", got {_json_type(prompt)}"))
    if obj.get("echo") not in (None, False):
        raise ProtocolError("model_unsupported", "echo: the prompt is not echoed back; ask for prompt_logprobs "
                            "to get its tokens' log-probabilities", "echo")
    if obj.get("suffix") not in (None, ""):
        raise ProtocolError("model_unsupported", "suffix: insertion (fill-in-the-middle) is not supported", "suffix")
    if obj.get("best_of") not in (None, 1):
        raise _bad("best_of", f"only best_of=1 is supported, got {_shown(obj['best_of'])}")
    logprobs, top = _logprob_fields(obj, legacy_int=True)
    return CompletionOp(id=rid, prompt=prompt, sampling=parse_sampling(obj), logprobs=logprobs, top_logprobs=top,
                        prompt_logprobs=_opt(obj, "prompt_logprobs", None, _int, 0, MAX_TOP_LOGPROBS),
                        api_key=api_key, **_common(obj))


def _parse_tokenize(rid: str, obj: dict, api_key: str | None) -> TokenizeOp:
    text, messages = obj.get("text"), obj.get("messages")
    if text is not None and messages is not None:
        raise _bad("text", "give either text or messages (a chat body), not both")
    agp = _opt(obj, "add_generation_prompt", True, _bool)
    if obj.get("api") is not None:
        api = _choice(obj["api"], "api", BODY_APIS)
        if text is not None or messages is not None:
            raise _bad("api", "give either api + body (an HTTP front's body), or text / messages, not both")
        body = _obj(obj.get("body"), "body")
        chat = None
        if api == "openai":
            try:
                chat = _parse_chat(rid, body, api_key)
            except ProtocolError as e:
                e.field = f"body.{e.field}" if e.field else "body"
                raise
        return TokenizeOp(rid, chat=chat, add_generation_prompt=agp, api_key=api_key, api=api, body=body)
    if text is not None:
        return TokenizeOp(rid, text=_str(text, "text"), add_generation_prompt=agp, api_key=api_key)
    if messages is None:
        raise _bad("text", "required: text, or messages (a chat body)")
    return TokenizeOp(rid, chat=_parse_chat(rid, obj, api_key), add_generation_prompt=agp, api_key=api_key)

