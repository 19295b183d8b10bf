"""Tool-call parsers (--tool-call-parser): turn a model's tool calls into OpenAI `tool_calls`.

    qwen25       <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>   (Qwen2.5, Qwen3)
    qwen3_coder  <tool_call>\\n<function=f>\\n<parameter=p>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>
                 (Qwen3-Coder, Qwen3.5; values are typed by the tool's parameter schema)

Text outside the tags is content. Streaming: text is fed in pieces; content goes out as it comes
(a tag split across pieces is held back), and each call goes out whole once its closing tag is in.
A call that does not parse, or names an unknown tool, stays content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from hybrid_sgl.server.reasoning_parser import _partial_suffix

START, END = "<tool_call>", "</tool_call>"
# parser name -> xgrammar's structural-tag model for forcing a call in this format
GRAMMAR_MODELS = {"qwen25": "qwen_3", "qwen3_coder": "qwen_3_coder"}
ALIASES = {"qwen": "qwen25", "qwen3": "qwen25"}
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self, index: int | None = None) -> dict:
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


@dataclass
class Parsed:
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


def parser_name(name: str) -> str:
    name = ALIASES.get(name, name)
    if name not in GRAMMAR_MODELS:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {', '.join(GRAMMAR_MODELS)}")
    return name


class ToolCallParser:
    def __init__(self, name: str, tools: list[dict]):
        """tools: the request's OpenAI tools ({"type": "function", "function": {name, parameters}})."""
        self.name = parser_name(name)
        self.schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
        self._buf = ""
        self._in_call = False
        self._after_call = False  # whitespace right after a call is not content

    def feed(self, delta: str) -> Parsed:
        self._buf += delta
        out = Parsed()
        while True:
            if not self._in_call:
                i = self._buf.find(START)
                if i < 0:
                    keep = _partial_suffix(self._buf, START)
                    out.content += self._content(self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    return out
                out.content += self._content(self._buf[:i])
                self._buf, self._in_call = self._buf[i + len(START):], True
            i = self._buf.find(END)
            if i < 0:
                return out
            body, self._buf, self._in_call = self._buf[:i], self._buf[i + len(END):], False
            call = self._call(body)
            if call is None:
                out.content += START + body + END
            else:
                out.calls.append(call)
                self._after_call = True

    def _content(self, text: str) -> str:
        if self._after_call:
            text = text.lstrip()
            self._after_call = not text
        return text

    def flush(self) -> Parsed:
        rest, self._buf = self._buf, ""
        if not self._in_call:
            return Parsed(content=self._content(rest))
        self._in_call = False
        call = self._call(rest)  # the output ended before the closing tag
        return Parsed(calls=[call]) if call is not None else Parsed(content=START + rest)

    def parse(self, text: str) -> Parsed:
        a, b = self.feed(text), self.flush()
        return Parsed((a.content + b.content).strip(), a.calls + b.calls)

    # ---- one call's body ---------------------------------------------------------------------------
    def _call(self, body: str) -> ToolCall | None:
        return self._json_call(body) if self.name == "qwen25" else self._xml_call(body)

    def _json_call(self, body: str) -> ToolCall | None:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in self.schemas:
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        return ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))

    def _xml_call(self, body: str) -> ToolCall | None:
        m = _FUNCTION.search(body)
        if m is None or m.group(1).strip() not in self.schemas:
            return None
        name = m.group(1).strip()
        props = self.schemas[name].get("properties") or {}
        args = {p.strip(): _typed(v, props.get(p.strip(), {})) for p, v in _PARAMETER.findall(m.group(2))}
        return ToolCall(name, json.dumps(args, ensure_ascii=False))


def _typed(value: str, schema: dict):
    """A parameter's text, without the whitespace around it, as the type its schema names."""
    value = value.strip()
    kind = schema.get("type")
    if kind in (None, "string") or (isinstance(kind, list) and "string" in kind):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value
