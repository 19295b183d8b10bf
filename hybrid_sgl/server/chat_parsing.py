"""Chat completions with tools and reasoning: the request's tools checked and prepared for the
chat template and the grammar, and each choice's text split into reasoning_content, content and
tool_calls (whole, or as streamed deltas).

tool_choice: "none" (tools are neither rendered nor parsed), "auto" (rendered; calls parsed when
--tool-call-parser is set), "required" or {"type": "function", "function": {"name": ...}} (a
grammar forces the call, so it always parses; in --tool-call-parser's format, else in the one the
chat template writes when it shows one: tool_parser.parser_for_template).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache

from hybrid_sgl.constrained.tool_grammar import forced_tool_call_tag
from hybrid_sgl.server.errors import ApiError
from hybrid_sgl.server.reasoning_parser import ReasoningParser
from hybrid_sgl.server.tool_parser import GRAMMAR_MODELS, ToolCallParser, parser_for_template, parser_name


@dataclass
class ChatSetup:
    tools: list[dict] = field(default_factory=list)  # OpenAI function tools in use (none for "none")
    template_tools: list[dict] | None = None  # for apply_chat_template(tools=...)
    forced: str | dict | None = None  # "required" or a named choice
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    parallel_calls: bool = True

    def grammar_params(self, in_reasoning: bool) -> dict:
        """sampling_params that force the call, when tool_choice asks for one."""
        if self.forced is None:
            return {}
        tag = forced_tool_call_tag(GRAMMAR_MODELS[self.tool_parser], self.tools, self.forced, in_reasoning,
                                   self.parallel_calls)
        return {"structural_tag": tag}

    def choice_parser(self, in_reasoning: bool) -> ChoiceParser:
        return ChoiceParser(self, in_reasoning)


def chat_setup(req, tool_call_parser: str | None, reasoning_parser: str | None,
               template: str | dict | None = None) -> ChatSetup:
    """Check tools / tool_choice / separate_reasoning of a ChatCompletionRequest; 400 naming the problem.
    template: the chat template's text, where a forced call without tool_call_parser finds its format."""
    tools = [_check_tool(i, t) for i, t in enumerate(req.tools or [])]
    choice = req.tool_choice if req.tool_choice is not None else "auto"
    setup = ChatSetup(reasoning_parser=reasoning_parser if req.separate_reasoning is not False else None)
    if choice == "none" or not tools:
        if choice not in ("none", "auto"):
            raise ApiError(f"tool_choice {choice!r} needs tools", param="tool_choice")
        return setup
    names = [t["function"]["name"] for t in tools]
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in names:
            raise ApiError(f"tool_choice names function {name!r}, which is not among the tools {names}",
                           param="tool_choice")
    elif choice not in ("auto", "required"):
        raise ApiError(f"tool_choice must be none, auto, required or a named function, got {choice!r}",
                       param="tool_choice")
    setup.tools, setup.template_tools = tools, [t["function"] for t in tools]
    setup.parallel_calls = req.parallel_tool_calls is not False
    if tool_call_parser is not None:
        setup.tool_parser = parser_name(tool_call_parser)
    if choice != "auto":
        if setup.tool_parser is None:
            setup.tool_parser = parser_for_template(template)
        if setup.tool_parser is None:
            raise ApiError(f"tool_choice {choice!r} needs a tool-call format, and the chat template shows none "
                           "(no <tool_call>): start the server with --tool-call-parser (qwen25 or qwen3_coder)",
                           param="tool_choice")
        setup.forced = choice
    return setup


def _check_tool(i: int, tool) -> dict:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict) \
            or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ApiError('each tool must be {"type": "function", "function": {"name": ..., "parameters": {...}}}',
                       param=f"tools.{i}")
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise ApiError("a tool's parameters must be a JSON schema object", param=f"tools.{i}.function.parameters")
    return {"type": "function", "function": {k: v for k, v in fn.items() if k != "strict"}}


def template_message_tool_calls(i: int, calls: list) -> list[dict]:
    """An assistant message's tool_calls as chat templates expect them (arguments as an object)."""
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ApiError('tool_calls entries must be {"type": "function", "function": {"name", "arguments"}}',
                           param=f"messages.{i}.tool_calls")
        args = fn.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                raise ApiError(f"tool call arguments must be JSON, got {args[:80]!r}",
                               param=f"messages.{i}.tool_calls") from None
        out.append({**call, "type": "function", "function": {"name": fn["name"], "arguments": args}})
    return out


class ChoiceParser:
    """One choice's text -> reasoning_content, content, tool_calls."""

    def __init__(self, setup: ChatSetup, in_reasoning: bool):
        self.reasoning = (ReasoningParser(setup.reasoning_parser, in_reasoning)
                          if setup.reasoning_parser else None)
        self.tools = ToolCallParser(setup.tool_parser, setup.tools) if setup.tool_parser and setup.tools else None
        self.num_calls = 0

    def message(self, text: str) -> dict:
        """The assistant message of a finished choice."""
        msg = {"role": "assistant", "content": text}
        if self.reasoning is not None:
            split = self.reasoning.parse(text)
            msg["reasoning_content"], msg["content"] = split.reasoning or None, split.content
        if self.tools is not None:
            parsed = self.tools.parse(msg["content"])
            msg["content"] = parsed.content or None
            if parsed.calls:
                msg["tool_calls"] = [c.to_openai() for c in parsed.calls]
                self.num_calls = len(parsed.calls)
        return msg

    def delta(self, text: str, final: bool) -> dict:
        """The delta fields for `text`, the next piece of the choice (final: nothing follows)."""
        reasoning, content = "", text
        if self.reasoning is not None:
            a = self.reasoning.feed(text)
            b = self.reasoning.flush() if final else a.__class__()
            reasoning, content = a.reasoning + b.reasoning, a.content + b.content
        delta, calls = {}, []
        if self.tools is not None:
            p = self.tools.feed(content)
            q = self.tools.flush() if final else p.__class__()
            content, calls = p.content + q.content, p.deltas + q.deltas
            self.num_calls = self.tools.started
        if reasoning:
            delta["reasoning_content"] = reasoning
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        return delta

    def finish_reason(self, reason: str | None) -> str | None:
        return "tool_calls" if reason == "stop" and self.num_calls else reason


@lru_cache(maxsize=4)
def custom_template(path: str | None) -> str | None:
    """The --chat-template file's text (None: the tokenizer's own template)."""
    if path is None:
        return None
    with open(path) as f:
        return f.read()
