"""Parsing one generated tool call, incrementally: the text after ``<tool_call>`` up to ``</tool_call>``.

Two forms are accepted, whatever the model family (which one follows ``<tool_call>`` tells them apart):

* Qwen3.5's XML form, the inverse of its chat template's render::

      <tool_call>\\n<function=NAME>\\n<parameter=K>\\nVALUE\\n</parameter>\\n…</function>\\n</tool_call>

  The template writes a value with ``tojson`` when it is a mapping or a list and with jinja's ``string``
  otherwise (so Python's ``True``/``False``/``None`` for booleans and null), framed by one newline on each
  side. The parse strips exactly one newline on each side, then decides the JSON value from the tool's
  parameter schema: type exactly "string" keeps the text; a non-string type parses it as JSON (also
  accepting ``True``/``False``/``None``), falling back to the text; no usable schema parses it when it is
  a JSON number, boolean, object or array, else keeps the text. A value ends only at ``</parameter>``.
* Qwen3 / Qwen3-Next's JSON form: ``<tool_call>\\n{"name": NAME, "arguments": {…}}\\n</tool_call>``. When the
  object starts ``{"name": "…", "arguments": {`` the arguments are streamed as the model writes them (the
  final ``arguments`` string is the model's own JSON text); any other key order is parsed whole at
  ``</tool_call>``.

Streaming: the call's header delta (index, id, type, name, arguments "") is emitted as soon as the name is
known; then argument pieces, e.g. for XML ``{"city": `` + ``"Par`` + ``is"`` + ``, "days": 3`` + ``}``.
Values of schema type string stream character by character; other values are emitted when complete.
The pieces always concatenate to the call's final ``arguments``.

A call whose form is wrong becomes ``failed``; the caller then shows its text as content. Failures after
the header was streamed (bad JSON arguments, a call cut off by the end of generation) cannot take back
the pieces already sent. No torch here.
"""

from __future__ import annotations

import json
import re
from json.encoder import encode_basestring as _json_string  # what json.dumps(str, ensure_ascii=False) uses
from typing import Callable

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
_FUNCTION = "<function="
_FUNCTION_END = "</function>"
_PARAM = "<parameter="
_PARAM_END = "</parameter>"
_PARAM_VALUE_HOLD = ("\n" + _PARAM_END, _PARAM_END)
_XML_TAG = re.compile(r"<(?:function|parameter)=([^>\n]*)>")
# {"name": "…", "arguments": followed by "{": the form whose arguments can be streamed as they come.
_JSON_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
_PY_LITERALS = {"True": True, "False": False, "None": None}


def held_suffix(text: str, patterns) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``patterns`` (text that
    must be held back because the next piece could complete the pattern)."""
    best, n = 0, len(text)
    for p in patterns:
        j = text.find(p[0], max(0, n - len(p) + 1))
        while 0 <= j and n - j > best:
            if p.startswith(text[j:]):
                best = n - j
                break
            j = text.find(p[0], j + 1)
    return best


def _schema_types(schema) -> frozenset[str]:
    """The JSON types a parameter schema allows (``type`` as a string or list, ``anyOf``/``oneOf``,
    ``enum``/``const`` values); empty when the schema says nothing usable."""
    if not isinstance(schema, dict):
        return frozenset()
    kinds = schema.get("type")
    out = {kinds} if isinstance(kinds, str) else {k for k in kinds if isinstance(k, str)} \
        if isinstance(kinds, list) else set()
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            sub_types = _schema_types(sub)
            if not sub_types:
                return frozenset()  # one branch allows anything
            out |= sub_types
    values = list(schema.get("enum") or []) + ([schema["const"]] if "const" in schema else [])
    if not kinds and values:
        out |= {"string" if isinstance(v, str) else "other" for v in values}
    return frozenset(out)


def parameter_types(tools: list | None) -> dict[str, dict[str, frozenset[str]]]:
    """Function name → parameter name → allowed JSON types, from OpenAI-shaped ``tools``
    (``{"type": "function", "function": {"name", "parameters": {"properties": …}}}``, or the bare function)."""
    out: dict[str, dict[str, frozenset[str]]] = {}
    for tool in tools or []:
        if not isinstance(tool, dict):
            continue
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name, params = fn.get("name"), fn.get("parameters")
        if isinstance(name, str) and isinstance(params, dict) and isinstance(params.get("properties"), dict):
            out[name] = {k: _schema_types(v) for k, v in params["properties"].items()}
    return out


def _reject_constant(name):
    raise ValueError(name)  # NaN / Infinity: not JSON


def _json_value(text: str):
    """(True, value) when ``text`` is one JSON value, else (False, None)."""
    try:
        return True, json.loads(text, parse_constant=_reject_constant)
    except ValueError:
        return False, None


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def xml_value_json(value: str, types: frozenset[str]) -> str:
    """The JSON text of one XML parameter value (already stripped of its framing newlines); see the module
    docstring for the rules."""
    if types == {"string"}:
        return _dumps(value)
    ok, parsed = _json_value(value)
    if types and "string" not in types:
        if ok:
            return _dumps(parsed)
        if value.strip() in _PY_LITERALS:
            return _dumps(_PY_LITERALS[value.strip()])
        return _dumps(value)
    if ok and isinstance(parsed, (bool, int, float, dict, list)):
        return _dumps(parsed)
    return _dumps(value)


class ToolCallParser:
    """One call: ``feed`` the text that follows ``<tool_call>`` in pieces, get OpenAI delta pieces back.

    Args:
        allocate: called once, when the call is first shown to the client; returns (index, id).
        types: ``parameter_types(tools)``.
    Attributes:
        status: "open", "done" (``</tool_call>`` consumed; ``rest`` is the text after it) or "failed"
            (not a valid call; ``body`` is every character fed, for the caller to show as content).
        committed: the header was emitted (a delta piece with this call's index was returned).
        index, id, name: the call's.
    """

    def __init__(self, allocate: Callable[[], tuple[int, str]], types: dict[str, dict[str, frozenset[str]]]):
        self._allocate = allocate
        self._types = types
        self.status = "open"
        self.committed = False
        self.index: int | None = None
        self.id: str | None = None
        self.name: str | None = None
        self._arguments: list[str] = []  # the JSON text emitted so far, in pieces
        self._body: list[str] = []       # every character fed, in pieces
        self.rest = ""
        self._buf = ""
        self._state = "head"
        self._fn_types: dict[str, frozenset[str]] = {}
        self._n_params = 0
        self._stream_value = False  # the current XML value is a schema string, emitted as it comes
        self._value_types: frozenset[str] = frozenset()  # the current XML parameter's schema types
        self._value: list[str] = []  # the current XML value so far, when not streamed
        self._depth = 0             # JSON arguments scanner
        self._in_string = False
        self._escaped = False
        self._outer_closed = False

    @property
    def arguments(self) -> str:
        """The arguments' JSON text emitted so far."""
        return "".join(self._arguments)

    @property
    def body(self) -> str:
        """Every character fed (what follows ``<tool_call>``)."""
        return "".join(self._body)

    def call(self) -> dict:
        """The finished call in the shape of ``message.tool_calls[i]``."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def feed(self, text: str) -> list[dict]:
        """Add text; return the delta pieces it completes ([] while waiting)."""
        out: list[dict] = []
        if self.status != "open":
            return out
        self._body.append(text)
        self._buf += text
        while self.status == "open" and getattr(self, "_step_" + self._state)(out):
            pass
        return out

    def finish(self) -> None:
        """The generation ended: a call still open is cut off, so it fails."""
        if self.status == "open":
            self.status = "failed"

    # -- shared -----------------------------------------------------------------------------------------
    def _fail(self) -> bool:
        self.status = "failed"
        return False

    def _commit(self, name: str, out: list[dict]) -> None:
        self.index, self.id = self._allocate()
        self.name, self.committed = name, True
        self._fn_types = self._types.get(name, {})
        out.append({"index": self.index, "id": self.id, "type": "function",
                    "function": {"name": name, "arguments": ""}})

    def _emit(self, piece: str, out: list[dict]) -> None:
        if piece:
            self._arguments.append(piece)
            out.append({"index": self.index, "function": {"arguments": piece}})

    def _done(self, rest: str) -> bool:
        self.status, self.rest, self._buf = "done", rest, ""
        return False

    def _step_head(self, out) -> bool:
        s = self._buf.lstrip()
        self._buf = s
        if not s:
            return False
        if s[0] == "{":
            self._state = "json_head"
            return True
        if not s.startswith(_FUNCTION):
            return False if _FUNCTION.startswith(s) else self._fail()
        m = _XML_TAG.match(s)
        if m is None:
            return self._fail() if ("\n" in s or ">" in s) else False
        name = m[1].strip()
        if not name:
            return self._fail()
        self._commit(name, out)
        self._buf = s[m.end():]
        self._state = "xml_body"
        return True

    # -- XML form ---------------------------------------------------------------------------------------
    def _step_xml_body(self, out) -> bool:
        """Between parameters: whitespace, then <parameter=K>, </function> or (leniently) </tool_call>."""
        s = self._buf.lstrip()
        self._buf = s
        if not s:
            return False
        if s.startswith(_PARAM):
            m = _XML_TAG.match(s)
            if m is None:
                return self._fail() if ("\n" in s or ">" in s) else False
            key = m[1].strip()
            if not key:
                return self._fail()
            types = self._fn_types.get(key, frozenset())
            self._stream_value = types == {"string"}
            self._emit(("{" if self._n_params == 0 else ", ") + _dumps(key) + ": "
                       + ('"' if self._stream_value else ""), out)
            self._n_params += 1
            self._value_types = types
            self._value = []
            self._buf = s[m.end():]
            self._state = "xml_value_start"
            return True
        for tag, state in ((_FUNCTION_END, "xml_after"), (TOOL_CLOSE, None)):
            if s.startswith(tag):
                self._emit("}" if self._n_params else "{}", out)
                if state is None:
                    return self._done(s[len(tag):])
                self._buf, self._state = s[len(tag):], state
                return True
        return False if any(t.startswith(s) for t in (_PARAM, _FUNCTION_END, TOOL_CLOSE)) else self._fail()

    def _step_xml_value_start(self, out) -> bool:
        if not self._buf:
            return False
        if self._buf[0] == "\n":  # the template's newline after <parameter=K>
            self._buf = self._buf[1:]
        self._state = "xml_value"
        return True

    def _step_xml_value(self, out) -> bool:
        buf = self._buf
        end = buf.find(_PARAM_END)
        if end < 0:  # all but a possible "\n</parameter>" start is value: stream it or keep it
            cut = len(buf) - held_suffix(buf, _PARAM_VALUE_HOLD)
            if self._stream_value:
                self._emit(_json_string(buf[:cut])[1:-1], out)
            elif cut:
                self._value.append(buf[:cut])
            self._buf = buf[cut:]
            return False
        value = buf[:end - 1] if buf[:end].endswith("\n") else buf[:end]
        if self._stream_value:
            self._emit(_json_string(value)[1:], out)
        else:
            self._emit(xml_value_json("".join(self._value) + value, self._value_types), out)
        self._buf = buf[end + len(_PARAM_END):]
        self._state = "xml_body"
        return True

    def _step_xml_after(self, out) -> bool:
        s = self._buf.lstrip()
        self._buf = s
        if s.startswith(TOOL_CLOSE):
            return self._done(s[len(TOOL_CLOSE):])
        return False if TOOL_CLOSE.startswith(s) else self._fail()

    # -- JSON form --------------------------------------------------------------------------------------
    def _step_json_head(self, out) -> bool:
        close = self._buf.find(TOOL_CLOSE)
        head = self._buf if close < 0 else self._buf[:close]
        m = _JSON_HEAD.match(head)
        if m is not None:
            ok, name = _json_value('"' + m[1] + '"')
            if not ok or not name.strip():
                return self._fail()
            self._commit(name.strip(), out)
            self._buf = self._buf[m.end():]
            self._state = "json_args"
            return True
        if close < 0:
            return False
        return self._json_whole(head, self._buf[close + len(TOOL_CLOSE):], out)

    def _json_whole(self, text: str, rest: str, out) -> bool:
        """A complete JSON call in another shape: parse it at once."""
        ok, obj = _json_value(text)
        if not ok or not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"].strip():
            return self._fail()
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            ok, args = _json_value(args) if args.strip() else (True, {})
        if not ok or not isinstance(args, dict):
            return self._fail()
        self._commit(obj["name"].strip(), out)
        self._emit(_dumps(args), out)
        return self._done(rest)

    def _step_json_args(self, out) -> bool:
        """Stream the arguments object as written, scanning JSON strings and nesting to find its end."""
        buf, depth, in_string, escaped = self._buf, self._depth, self._in_string, self._escaped
        end = -1
        for i, ch in enumerate(buf):
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    end = i + 1
                    break
            elif ch == "<":  # markup outside a JSON string: not a JSON call
                return self._fail()
        self._depth, self._in_string, self._escaped = depth, in_string, escaped
        if end < 0:
            self._emit(buf, out)
            self._buf = ""
            return False
        self._emit(buf[:end], out)
        self._buf = buf[end:]
        self._state = "json_tail"
        return True

    def _step_json_tail(self, out) -> bool:
        """After the arguments: the object's closing brace, then </tool_call>."""
        s = self._buf.lstrip()
        if not self._outer_closed and s.startswith("}"):
            self._outer_closed = True
            s = s[1:].lstrip()
        self._buf = s
        if s.startswith(TOOL_CLOSE):
            ok, args = _json_value(self.arguments)
            return self._done(s[len(TOOL_CLOSE):]) if ok and isinstance(args, dict) else self._fail()
        return False if TOOL_CLOSE.startswith(s) else self._fail()
