"""The model's chat template, rendered the way transformers renders it, and request messages made ready for it.

Rendering follows transformers 5.24 ``utils/chat_template_utils.py`` (``_cached_compile_jinja_template``,
``render_jinja_template``) and ``tokenization_utils_base.apply_chat_template``: an
``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with ``jinja2.ext.loopcontrols``; a
``tojson`` filter that is ``json.dumps(x, ensure_ascii=False, ...)`` (jinja's own escapes HTML characters);
globals ``raise_exception`` (raises ``jinja2.TemplateError``), ``strftime_now``, ``dict`` and ``namespace``;
messages with their None-valued keys dropped and the reasoning aliases filled (``reasoning_content`` and
``thinking`` from the first of ``reasoning_content``/``thinking``/``reasoning`` that is set); the template
variables ``messages``, ``tools``, ``documents`` (None), ``add_generation_prompt``, ``bos_token``, ``eos_token``
and the caller's keyword arguments. The ``{% generation %}`` tag (assistant-mask tracking) renders its body.

No torch here.
"""

from __future__ import annotations

import json
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.utils
from ignis_client.wire import _shown
from jinja2.sandbox import ImmutableSandboxedEnvironment

DEVELOPER_POLICIES = ("keep", "into-system", "after-system")
ROLES = ("system", "user", "assistant", "tool", "developer")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """The template refused the conversation (its ``raise_exception``) or failed while rendering."""


class MessageError(ValueError):
    """A request message is malformed. ``field`` is its path (``messages[1].content[0].type``);
    ``str(err)`` is ``"field: message"``."""

    def __init__(self, field: str, message: str, code: str = "bad_request"):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.code = code      # the wire error code: bad_request, or model_unsupported for a part no model here reads


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: transformers tracks assistant spans with it; rendering
    outputs the body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class _TemplateDict:
    """``dict(...)`` inside templates, without exposing the dict type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """``namespace(...)`` refusing underscore names (no reaching CPython internals)."""

    def __init__(*args, **kwargs):  # same signature trick as jinja2.utils.Namespace
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} may not start with '_'")


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env


def _plain(value):
    """A copy built of plain JSON types (dict/list/str/int/float/bool/None)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class ChatTemplate:
    """A compiled chat template.

    Args:
        source: the jinja source (GGUF ``tokenizer.chat_template``, tokenizer_config.json, chat_template.jinja).
        bos_token, eos_token: the strings passed to the template as ``bos_token`` / ``eos_token``.
    Raises:
        jinja2.TemplateSyntaxError: the source does not parse.
    """

    def __init__(self, source: str, bos_token: str | None, eos_token: str | None):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = _environment()
        self._template = env.from_string(source)
        ast = env.parse(source)
        self.variables: frozenset[str] = frozenset(jinja2.meta.find_undeclared_variables(ast))
        names = {n.attr for n in ast.find_all(jinja2.nodes.Getattr)}
        names |= {n.arg.value for n in ast.find_all(jinja2.nodes.Getitem)
                  if isinstance(n.arg, jinja2.nodes.Const) and isinstance(n.arg.value, str)}
        self.attributes: frozenset[str] = frozenset(names)

    def uses(self, name: str) -> bool:
        """Whether the template reads the variable ``name`` (``"tools"``, ``"enable_thinking"``, ...): the
        undeclared variables of its AST. A request field whose variable is not used would be ignored silently."""
        return name in self.variables

    def reads(self, key: str) -> bool:
        """Whether the template reads a field ``key`` of some object (``message.tool_calls``,
        ``message['tool_calls']``): the attribute and constant-subscript names of its AST. A message field it never
        reads would be dropped silently."""
        return key in self.attributes

    def render(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True,
               **template_kwargs) -> str:
        """The prompt text, byte-identical to transformers'
        ``apply_chat_template(messages, tools=tools, add_generation_prompt=..., tokenize=False, **kwargs)``.

        ``messages`` should come from ``prepare_messages``. Keyword arguments (``enable_thinking=False``, ...)
        become template variables and override ``bos_token``/``eos_token``.
        Raises:
            ChatTemplateError (a ValueError): the template raised (``raise_exception('...')``) or failed (undefined
                value used in an expression, wrong type); ``str(err)`` is the template's message, unprefixed.
        """
        chat = []
        for message in messages:
            message = {k: v for k, v in _plain(message).items() if v is not None}
            reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
            if reasoning is not None:
                message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
            chat.append(message)
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **_plain(template_kwargs)}
        try:
            return self._template.render(messages=chat, tools=_plain(tools), documents=None,
                                         add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.exceptions.TemplateError as err:
            raise ChatTemplateError(err.message or type(err).__name__) from err
        except (TypeError, AttributeError, KeyError, IndexError, ValueError) as err:
            raise ChatTemplateError(f"{type(err).__name__}: {err}") from err


def _content_text(content, field: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise MessageError(field, "must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        where = f"{field}[{j}]"
        if not isinstance(part, dict):
            raise MessageError(where, "must be an object")
        kind = part.get("type")
        if kind == "image_url":
            _check_image_part(part, where)
            raise MessageError(where, "image parts need a model with a vision tower; this model reads text only",
                               code="model_unsupported")
        if kind != "text":
            raise MessageError(f"{where}.type",
                               f"unsupported content part type {_shown(kind)} (allowed: text, image_url)")
        text = part.get("text")
        if not isinstance(text, str):
            raise MessageError(f"{where}.text", "must be a string")
        texts.append(text)
    return "".join(texts)


def _check_image_part(part: dict, where: str) -> None:
    """An OpenAI image part: ``{"type": "image_url", "image_url": {"url": "data:image/...;base64,..." | "https://...",
    "detail"?: "auto" | "low" | "high"}}`` (OpenAI Chat Completions API, content parts). Raises MessageError naming the
    bad field."""
    img = part.get("image_url")
    if not isinstance(img, dict):
        raise MessageError(f"{where}.image_url", "must be an object with a url")
    url = img.get("url")
    if not isinstance(url, str) or not url:
        raise MessageError(f"{where}.image_url.url", "must be a non-empty string (a data: URL or an http(s) URL)")
    if not url.startswith(("data:image/", "http://", "https://")):
        raise MessageError(f"{where}.image_url.url", "must be a data:image/... URL or an http(s) URL")
    if img.get("detail") not in (None, "auto", "low", "high"):
        raise MessageError(f"{where}.image_url.detail", "must be one of auto, low, high")


def _tool_calls(calls, field: str) -> list:
    if not isinstance(calls, list):
        raise MessageError(field, "must be a list")
    out = []
    for k, call in enumerate(calls):
        where = f"{field}[{k}]"
        if not isinstance(call, dict):
            raise MessageError(where, "must be an object")
        call = dict(call)
        function = call.get("function")
        if isinstance(function, dict) and "arguments" in function:
            function = dict(function)
            args = function["arguments"]
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError as err:
                    raise MessageError(f"{where}.function.arguments", f"invalid JSON: {err}") from None
            if not isinstance(args, dict):
                raise MessageError(f"{where}.function.arguments", "must be a JSON object")
            function["arguments"] = args
            call["function"] = function
        out.append(call)
    return out


def prepare_messages(messages: list[dict], developer_policy: str) -> list[dict]:
    """Request messages (OpenAI chat shape) → the messages the template renders. The input is not modified.

    * ``content``: a string, or a list of ``{"type": "text", "text": ...}`` parts joined with no separator (what
      templates that walk parts, e.g. Qwen's, print); ``None``/absent only for an assistant message.
    * assistant ``tool_calls[k].function.arguments``: a JSON string is parsed; it must give an object.
    * role ``developer`` per ``developer_policy``:
      ``"keep"``: passed through as role developer;
      ``"into-system"``: its content is appended to the system message's, separated by a blank line
      (``"\\n\\n"``; empty contents are left out); with no system message one is created at the front;
      ``"after-system"``: it becomes a system message placed right after the system message (at the front
      when there is none), developer messages keeping their order.
      "The system message" is the first message with role system.

    Raises:
        MessageError (a ValueError): ``"field: message"`` naming the bad field, e.g.
            ``messages[1].content[0].type``, ``messages[2].tool_calls[0].function.arguments``,
            ``messages[0].role``; ``developer_message_policy`` for an unknown policy.
    """
    if developer_policy not in DEVELOPER_POLICIES:
        raise MessageError("developer_message_policy",
                           f"unknown policy {developer_policy!r} (allowed: {', '.join(DEVELOPER_POLICIES)})")
    if not isinstance(messages, list):
        raise MessageError("messages", "must be a list")
    out: list[dict] = []
    developers: list[dict] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise MessageError(where, "must be an object")
        role = message.get("role")
        if role not in ROLES:
            raise MessageError(f"{where}.role", f"unknown role {_shown(role)} (allowed: {', '.join(ROLES)})")
        message = dict(message)
        content = message.get("content")
        if content is None:
            if role != "assistant":
                raise MessageError(f"{where}.content", "is required")
        else:
            message["content"] = _content_text(content, f"{where}.content")
        if message.get("tool_calls") is not None:
            message["tool_calls"] = _tool_calls(message["tool_calls"], f"{where}.tool_calls")
        if role == "developer" and developer_policy != "keep":
            developers.append(message)
        else:
            out.append(message)
    if not developers:
        return out
    system_at = next((i for i, m in enumerate(out) if m["role"] == "system"), None)
    if developer_policy == "into-system":
        parts = [d["content"] for d in developers]
        if system_at is None:
            out.insert(0, {"role": "system", "content": "\n\n".join(p for p in parts if p)})
        else:
            system = dict(out[system_at])
            system["content"] = "\n\n".join(p for p in [system["content"], *parts] if p)
            out[system_at] = system
    else:  # after-system
        moved = [{**d, "role": "system"} for d in developers]
        at = 0 if system_at is None else system_at + 1
        out[at:at] = moved
    return out
