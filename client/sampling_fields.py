"""The sampling fields of the ignis wire protocol (DESIGN §5): the ``Sampling`` dataclass that chat and completion
ops carry, and ``parse_sampling`` (a request body's sampling fields → Sampling), with OpenAI's ``logit_bias`` and the
``response_format`` refusal.

Every validation failure raises ``ProtocolError`` naming the field path. Re-exported by ``protocol``, the one import
point. Standard library and orjson only (†: no torch).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .wire import (MAX_STOP, MAX_TOKENS_LIMIT, ProtocolError, _bad, _bool, _int, _json_type, _num, _obj, _opt,
                   _shown)

MAX_TEMPERATURE = 2.0   # the temperature field's upper bound (OpenAI's); 0 is greedy
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1   # the seed field's range (what JSON's 64-bit integers carry); taken mod 2^64


@dataclass(frozen=True)
class Sampling:
    """Sampling fields shared by chat and completion. temperature 0 = greedy; top_k 0 = off; seed None = random;
    max_tokens None = the server's default_max_tokens; stop: up to 16 non-empty strings. ignore_eos: the model's
    end-of-sequence tokens do not end generation (it runs to max_tokens or a stop string), as vLLM's and
    llama.cpp's ``ignore_eos``: for benchmarks that need a fixed number of tokens. logit_bias: {token id: bias added to
    its logit, -100..100} (OpenAI's; the keys are token ids as strings on the wire). presence_penalty /
    frequency_penalty: OpenAI's, -2..2 (a generated token's logit loses presence once and frequency per time it
    was generated)."""
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0



def parse_sampling(obj: dict) -> Sampling:
    """The sampling fields of a chat or completion body (``max_completion_tokens`` is OpenAI's newer name). A
    ``response_format`` asking for structured output is refused (``check_response_format``)."""
    check_response_format(obj.get("response_format"))
    mt = _opt(obj, "max_tokens", None, _int, 1, MAX_TOKENS_LIMIT)
    mct = _opt(obj, "max_completion_tokens", None, _int, 1, MAX_TOKENS_LIMIT)
    if mt is not None and mct is not None and mt != mct:
        raise _bad("max_completion_tokens", f"conflicts with max_tokens ({mct} != {mt}); send one of them")
    if "n" in obj and obj["n"] is not None and obj["n"] != 1:
        raise _bad("n", f"only n=1 is supported, got {_shown(obj['n'])}")
    stop = obj.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        if not stop:
            raise _bad("stop", "must not be an empty string")
        stops = [stop]
    else:
        if not isinstance(stop, list):
            raise _bad("stop", f"must be a string or an array of strings, got {_json_type(stop)}")
        if len(stop) > MAX_STOP:
            raise _bad("stop", f"at most {MAX_STOP} stop strings, got {len(stop)}")
        for i, s in enumerate(stop):
            if not isinstance(s, str) or not s:
                raise _bad(f"stop[{i}]", f"must be a non-empty string, got {_shown(s)}")
        stops = list(stop)
    return Sampling(
        max_tokens=mt if mt is not None else mct,
        temperature=_opt(obj, "temperature", 1.0, _num, 0.0, MAX_TEMPERATURE),
        top_p=_opt(obj, "top_p", 1.0, _num, 0.0, 1.0, True),
        top_k=_opt(obj, "top_k", 0, _int, 0, MAX_TOKENS_LIMIT),
        min_p=_opt(obj, "min_p", 0.0, _num, 0.0, 1.0),
        seed=_opt(obj, "seed", None, _int, SEED_MIN, SEED_MAX),
        stop=stops,
        ignore_eos=_opt(obj, "ignore_eos", False, _bool),
        logit_bias=_logit_bias(obj.get("logit_bias")),
        presence_penalty=_opt(obj, "presence_penalty", 0.0, _num, -2.0, 2.0),
        frequency_penalty=_opt(obj, "frequency_penalty", 0.0, _num, -2.0, 2.0),
    )


MAX_LOGIT_BIAS = 1024
"""Most entries a logit_bias may hold."""


def _logit_bias(v) -> dict[int, float]:
    """OpenAI's logit_bias: an object of token id (a decimal string; an int from the Python client) -> bias in
    [-100, 100]. Raises ProtocolError naming ``logit_bias`` or ``logit_bias.<key>``."""
    if v is None:
        return {}
    _obj(v, "logit_bias")
    if len(v) > MAX_LOGIT_BIAS:
        raise _bad("logit_bias", f"at most {MAX_LOGIT_BIAS} entries, got {len(v)}")
    out = {}
    for k, b in v.items():
        key = str(k)
        if not key.isascii() or not key.isdigit():
            raise _bad(f"logit_bias.{key[:40]}", f"a key must be a token id (a non-negative integer), got {_shown(k)}")
        out[int(key)] = _num(b, f"logit_bias.{key}", -100.0, 100.0)
    return out


RESPONSE_FORMATS_SERVED = ("text",)


def check_response_format(v) -> None:
    """OpenAI's response_format: {"type": "text"} is what every reply is; json_object and json_schema (structured
    output) need constrained decoding, which this server does not do: refused (model_unsupported, naming the field)
    rather than answered with free text. Raises ProtocolError naming response_format(.type); a front that takes the
    format under another name renames it (chat_body.renamed)."""
    if v is None:
        return
    t = _obj(v, "response_format").get("type")
    if t in RESPONSE_FORMATS_SERVED:
        return
    if t in ("json_object", "json_schema"):
        f = "response_format.type"
        raise ProtocolError("model_unsupported", f"{f}: {t} (structured output) is not supported; ask for JSON in "
                            "the prompt, or force a tool call with tools and tool_choice naming a function whose "
                            "parameters are the schema", f)
    raise _bad("response_format.type", f"must be text, json_object or json_schema; got {_shown(t)}")
