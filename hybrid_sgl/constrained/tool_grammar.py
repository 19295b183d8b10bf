"""Grammars that force tool calls in a model's format (tool_choice "required" or a named function),
so the calls always parse. Each call's shape comes from xgrammar's structural tag for the format;
the calls are then joined: one or more (separated by a newline) for "required", exactly one for a
named function, and nothing else after them.
"""

from __future__ import annotations

import json


def forced_tool_call_tag(model: str, tools: list[dict], tool_choice, reasoning: bool, parallel: bool = True) -> str:
    """The structural tag (JSON text, for sampling_params.structural_tag). model: xgrammar's format
    ("qwen_3": JSON in <tool_call>, "qwen_3_coder": XML); tools: OpenAI function tools; tool_choice:
    "required" or {"type": "function", "function": {"name": ...}}; reasoning: the prompt opened a
    thinking block, which the output closes before the calls; parallel: "required" allows more
    than one call."""
    import xgrammar as xgr

    from hybrid_sgl.constrained.xgrammar_backend import MAX_JSON_WHITESPACE

    required = tool_choice == "required"
    names = [t["function"]["name"] for t in tools] if required else [tool_choice["function"]["name"]]
    tags, prefix = [], None
    for name in names:
        tag = xgr.get_builtin_structural_tag(model, tools=tools, tool_choice={"type": "function",
                                                                                "function": {"name": name}},
                                             reasoning="enabled" if reasoning else "disabled",
                                             max_whitespace_cnt=MAX_JSON_WHITESPACE)
        fmt = json.loads(tag.model_dump_json())["format"]
        if fmt["type"] == "sequence":  # [the reasoning block, the call]
            prefix, fmt = fmt["elements"][0], fmt["elements"][-1]
        tags.append(fmt)
    calls = {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True,
             "stop_after_first": not (required and parallel)}
    body = calls if prefix is None else {"type": "sequence", "elements": [prefix, calls]}
    return json.dumps({"type": "structural_tag", "format": body})
