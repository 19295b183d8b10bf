"""Tool-call parsers (--tool-call-parser): turn a model's tool calls into OpenAI `tool_calls`.

    qwen25       <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>   (Qwen2.5, Qwen3)
    qwen3_coder  <tool_call>\\n<function=f>\\n<parameter=p>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>
                 (Qwen3-Coder, Qwen3.5; values are typed by the tool's parameter schema)

Text outside the tags is content. Streaming: text is fed in pieces; content goes out as it comes
(a tag split across pieces is held back). A call of a known tool streams as SGLang and vLLM stream
one: a first delta with its id and name, then its arguments in pieces whose concatenation (as a
client joins them) is the arguments' JSON: qwen25 sends the arguments' text as it arrives (a last
closing brace, which may be the call's own, is held back until more follows); qwen3_coder sends each
parameter once its closing tag is in, typed by the tool's schema. A qwen25 call whose arguments are
not an object goes out whole once its closing tag is in. A call that does not parse, or names an
unknown tool, stays content (unless its start already streamed: then its arguments stop there).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from hybrid_sgl.server.reasoning_parser import _partial_suffix

START, END = "<tool_call>", "</tool_call>"
# parser name -> xgrammar's structural-tag model for forcing a call in this format
GRAMMAR_MODELS = {"qwen25": "qwen_3", "qwen3_coder": "qwen_3_coder"}
ALIASES = {"qwen": "qwen25", "qwen3": "qwen25"}
# the start of a qwen25 call up to its arguments object: {"name": "f", "arguments": {
_JSON_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
_XML_HEAD = re.compile(r"\s*<function=([^>\n]+)>")  # the start of a qwen3_coder call
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
    """content: text outside calls; calls: the calls completed in this piece; deltas: the OpenAI
    streaming `tool_calls` entries for this piece (whole calls, or a call's start and argument text)."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    deltas: list[dict] = field(default_factory=list)


def parser_name(name: str) -> str:
    name = ALIASES.get(name, name)
    if name not in GRAMMAR_MODELS:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {', '.join(GRAMMAR_MODELS)}")
    return name


def parser_for_template(template: str | dict | None) -> str | None:
    """The parser whose call format a chat template writes, or None when it shows neither: <function=...>
    inside <tool_call> is qwen3_coder's, any other <tool_call> (JSON) qwen25's."""
    if isinstance(template, dict):  # named templates: the tool-use one, else all of them
        template = template.get("tool_use") or "\n".join(t for t in template.values() if isinstance(t, str))
    if not isinstance(template, str) or START not in template:
        return None
    return "qwen3_coder" if "<function=" in template else "qwen25"


class ToolCallParser:
    def __init__(self, name: str, tools: list[dict]):
        """tools: the request's OpenAI tools ({"type": "function", "function": {name, parameters}})."""
        self.name = parser_name(name)
        self.schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
        self._buf = ""
        self._in_call = False
        self._after_call = False  # whitespace right after a call is not content
        self._count = 0  # calls started so far (their OpenAI index)
        self._streaming: ToolCall | None = None  # the call whose arguments are streaming
        self._args_at = 0  # where in the call's body (self._buf) the part not sent yet starts

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
                self._stream_arguments(out)
                return out
            body, self._buf, self._in_call = self._buf[:i], self._buf[i + len(END):], False
            self._end_call(body, out, closed=True)

    def _stream_arguments(self, out: Parsed) -> None:
        """Inside a call without its closing tag yet: send its start once the tool's name is read,
        then its arguments as they come."""
        if self._streaming is None:
            m = (_JSON_HEAD if self.name == "qwen25" else _XML_HEAD).match(self._buf)
            name = m and (_unescaped(m.group(1)) if self.name == "qwen25" else m.group(1).strip())
            if not name or name not in self.schemas:
                return
            self._streaming, self._args_at = ToolCall(name, ""), m.end()
            out.deltas.append(self._streaming.to_openai(self._count))
            self._count += 1
        if self.name == "qwen25":
            self._send_json_text(out)
        else:
            self._send_parameters(_PARAMETER.finditer(self._buf, self._args_at), out)

    def _send_json_text(self, out: Parsed) -> None:
        """The arguments' text so far, less a last '}' with only whitespace (or the start of the closing
        tag) after it, which may close the call rather than the arguments, and less a partial tag."""
        brace = self._buf.rfind("}", self._args_at)
        tail = self._buf[brace + 1:].strip() if brace >= 0 else None
        safe = brace if tail is not None and END.startswith(tail) else len(self._buf) - _partial_suffix(self._buf, END)
        if safe > self._args_at:
            self._send(self._buf[self._args_at:safe], out)
            self._args_at = safe

    def _send_parameters(self, found: Iterator[re.Match], out: Parsed) -> None:
        """qwen3_coder: each complete <parameter> in `found` (those not sent yet), as '{"p": value' or
        ', "p": value', typed by the tool's schema."""
        props = self.schemas[self._streaming.name].get("properties") or {}
        for m in found:
            key = m.group(1).strip()
            value = json.dumps(_typed(m.group(2), props.get(key, {})), ensure_ascii=False)
            sep = ", " if self._streaming.arguments else "{"
            self._send(f"{sep}{json.dumps(key, ensure_ascii=False)}: {value}", out)
            self._args_at = m.end()

    def _send(self, text: str, out: Parsed) -> None:
        self._streaming.arguments += text
        out.deltas.append({"index": self._count - 1, "function": {"arguments": text}})

    def _end_call(self, body: str, out: Parsed, closed: bool) -> None:
        """A call's whole body (closed: its closing tag came; else the output ended inside it)."""
        call = self._call(body)
        if call is None:  # as content (a streamed start stays sent: its arguments stop here)
            self._streaming = None
            out.content += START + body + (END if closed else "")
            return
        if self._streaming is None:  # nothing of it went out yet: whole
            out.deltas.append(call.to_openai(self._count))
            self._count += 1
        elif self.name == "qwen25":  # the rest of its arguments' text, less the call's closing brace
            rest = body[self._args_at:].rstrip()
            if rest.endswith("}") and rest[:-1]:
                self._send(rest[:-1], out)
        else:  # the parameters not sent yet, and the closing brace
            m = _FUNCTION.search(body)
            self._send_parameters(_PARAMETER.finditer(body, self._args_at, m.end(2)), out)
            self._send("}" if self._streaming.arguments else "{}", out)
        out.calls.append(call if self._streaming is None else ToolCall(call.name, call.arguments, self._streaming.id))
        self._streaming, self._after_call = None, True

    def _content(self, text: str) -> str:
        if self._after_call:
            text = text.lstrip()
            self._after_call = not text
        return text

    def flush(self) -> Parsed:
        rest, self._buf = self._buf, ""
        if not self._in_call:
            return Parsed(content=self._content(rest))
        self._in_call = False  # the output ended before the closing tag
        out = Parsed()
        self._end_call(rest, out, closed=False)
        return out

    @property
    def started(self) -> int:
        """Calls that went out so far (whole or started), in a stream."""
        return self._count

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


def _unescaped(name: str) -> str:
    try:
        return json.loads(f'"{name}"')
    except json.JSONDecodeError:
        return name


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
