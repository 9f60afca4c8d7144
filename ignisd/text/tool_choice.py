"""A chat request's ``tool_choice`` as what sampling and the output parser do about it (OpenAI chat semantics; the
Anthropic and Responses fronts map theirs onto it). †: imports no torch.

* ``"auto"`` (or absent): the model decides; calls are parsed.
* ``"none"``: no call. The tool-call opening token (``<tool_call>``, one added token in the Qwen vocabularies) is
  never sampled and the parser leaves any call markup in the text. The tools stay in the prompt, as vLLM renders
  them, so the turn shares its prefix (and its reuse) with the turns that may call them.
* ``"required"``: at least one call. The reply starts with the call's opening text, generated as forced tokens
  (the model writes the function name and arguments after it): ``<tool_call>\\n``.
* ``{"type": "function", "function": {"name": N}}``: a call of N: the forced opening names it, in the family's form
  (Qwen3.5's XML ``<tool_call>\\n<function=N>\\n``, Qwen3 / Qwen3-Next's JSON
  ``<tool_call>\\n{"name": "N", "arguments": ``; tool_calls.py parses both).

Forcing the start of the reply cannot be combined with a prompt that opens a ``<think>`` block (the reply's start is
the reasoning); such a request is refused naming ``tool_choice`` (Anthropic's API refuses forced tool use with
extended thinking the same way): turn reasoning off (``chat_template_kwargs.enable_thinking: false``) or use "auto".
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ignis_client import protocol as P

from ignisd.text.tool_calls import TOOL_OPEN


@dataclass(frozen=True)
class ToolChoice:
    """What a request's tool_choice asks of generation.

    banned: token ids never sampled. forced: token ids the reply starts with (sampled as if chosen; empty: none).
    forced_text: their text. calls: the output parser recognises tool calls."""

    banned: frozenset[int] = frozenset()
    forced: tuple[int, ...] = ()
    forced_text: str = ""
    calls: bool = True


AUTO = ToolChoice()


def _named(tool_choice) -> str | None:
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        return fn.get("name") if isinstance(fn, dict) else None
    return None


def _opening(family: str, name: str | None) -> str:
    if name is None:
        return TOOL_OPEN + "\n"
    if family == "qwen3_5":
        return f"{TOOL_OPEN}\n<function={name}>\n"
    return f'{TOOL_OPEN}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '


def resolve_tool_choice(tool_choice, tools: list | None, family: str, tokenizer,
                        prompt_in_reasoning: bool) -> ToolChoice:
    """The ToolChoice of a chat request.

    tool_choice: the request's value (None, "auto", "none", "required" or {"type": "function", "function":
    {"name"}}; its shape is checked by the protocol parser). tools: the request's tools (OpenAI shape). family: the
    model's output family ("qwen3_5", "qwen3", "qwen3_next" or "none"). tokenizer: ignisd.text.tokenizer.Tokenizer
    (encode, token_to_id). prompt_in_reasoning: the rendered prompt ends inside ``<think>``.
    Raises ProtocolError (bad_request, field ``tool_choice`` or ``tool_choice.function.name``): "required" or a
    function with no tools, a function not among the tools, forcing while the prompt opens reasoning;
    (model_unsupported, ``tool_choice``) forcing on a model whose output has no tool-call form.
    """
    if tool_choice is None or tool_choice == "auto":
        return AUTO
    if tool_choice == "none":
        tid = tokenizer.token_to_id(TOOL_OPEN)
        return ToolChoice(banned=frozenset() if tid is None else frozenset({tid}), calls=False)
    name = _named(tool_choice)
    field = "tool_choice" if name is None else "tool_choice.function.name"
    if not tools:
        raise P.ProtocolError("bad_request", f"{field}: a tool call is required but the request has no tools",
                              field)
    if name is not None:
        names = [t.get("function", {}).get("name") for t in tools if isinstance(t, dict)]
        if name not in names:
            raise P.ProtocolError("bad_request", f"{field}: no tool named {json.dumps(name)} in tools (they are "
                                  f"{', '.join(json.dumps(n) for n in names if n)})", field)
    family = {"qwen3_next": "qwen3"}.get(family, family)
    if family not in ("qwen3_5", "qwen3"):
        raise P.ProtocolError("model_unsupported", "tool_choice: this model's output has no tool-call form to "
                              "force; use \"auto\"", "tool_choice")
    if prompt_in_reasoning:
        raise P.ProtocolError("bad_request", "tool_choice: forcing a tool call cannot be combined with reasoning "
                              "(the prompt opens a <think> block, so the reply starts with reasoning); set "
                              "chat_template_kwargs.enable_thinking to false, or use \"auto\"", "tool_choice")
    text = _opening(family, name)
    return ToolChoice(forced=tuple(tokenizer.encode(text)), forced_text=text)
