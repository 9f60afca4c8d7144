"""Tool canonicalisation (``server.canonicalize_tools``, DESIGN §6): the tools a request sends, in one order whatever
order the harness sent them in. †: imports no torch.

``canonical_tools(tools)`` returns a new list (the input is not modified): tools sorted by function name (stable:
tools without a name keep their relative order, after the named ones), each tool rebuilt as ``{"type", "function":
{"name", "description", "parameters", …other keys sorted}}`` with every key inside ``parameters`` (the JSON schema)
sorted recursively. Lists keep their order (``required``, ``enum``, ``anyOf``: their order can carry meaning).

What the model sees changes only in order: the tools block lists the tools alphabetically and each schema's keys
(``properties`` included) alphabetically. Names, descriptions and schemas are unchanged, so two requests whose tools
differ only in order or key order render the same bytes and share the prefix up to the end of the tools block.
"""
from __future__ import annotations

from typing import Any

from ignis_client.divergence import sort_keys, tool_name

FUNCTION_KEYS = ("name", "description", "parameters")


def _canonical_tool(tool: Any) -> Any:
    if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
        return sort_keys(tool)
    fn = tool["function"]
    out_fn = {k: (sort_keys(fn[k]) if k == "parameters" else fn[k]) for k in FUNCTION_KEYS if k in fn}
    out_fn.update({k: sort_keys(fn[k]) for k in sorted(fn) if k not in FUNCTION_KEYS})
    out = {"type": tool.get("type", "function"), "function": out_fn}
    out.update({k: sort_keys(tool[k]) for k in sorted(tool) if k not in ("type", "function")})
    return out


def canonical_tools(tools: list | None) -> list | None:
    """The tools sorted by name with schema keys sorted recursively (see the module docstring); None stays None."""
    if not tools:
        return tools
    named = sorted((t for t in tools if tool_name(t) is not None), key=tool_name)
    unnamed = [t for t in tools if tool_name(t) is None]
    return [_canonical_tool(t) for t in named + unnamed]
