"""Tool calls and reasoning. Parsers: on the renderings of Qwen-style chat templates (calls as JSON
in <tool_call>, or as <function=...> XML), whole and streamed in pieces cut anywhere (inside tags
too); the parser a forced call takes from the chat template when --tool-call-parser is not set.
Server: tools through the chat template, tool_choice none / auto / required / named (a grammar makes
the call parse even with random weights), streamed tool_call deltas, and reasoning_content with
enable_thinking."""

from __future__ import annotations

import json
import os

import jsonschema
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_process import launch
from transformers import AutoTokenizer

from hybrid_sgl.server.chat_parsing import ChatSetup, chat_setup
from hybrid_sgl.server.errors import ApiError
from hybrid_sgl.server.protocol import ChatCompletionRequest
from hybrid_sgl.server.reasoning_parser import ReasoningParser
from hybrid_sgl.server.tool_parser import ToolCallParser, parser_for_template
from hybrid_sgl.testing.tiny_checkpoint import CHAT_TEMPLATE

TEMPLATES = os.path.join(os.path.dirname(__file__), "templates")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 14}},
           "required": ["city", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
CALLS = [{"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}},
         {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris and the time?"},
            {"role": "assistant", "content": "Let me check.", "tool_calls": CALLS}]


def template(kind: str) -> str:
    return os.path.join(TEMPLATES, f"qwen_style_{kind}_tools.jinja")


def rendered_reply(model_path: str, kind: str) -> str:
    """The assistant turn of MESSAGES as the template renders it (what the model learns to write)."""
    tok = AutoTokenizer.from_pretrained(model_path)
    def with_dict_args(c: dict) -> dict:
        return {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}

    msgs = [{**m, "tool_calls": [with_dict_args(c) for c in m.get("tool_calls", [])]} for m in MESSAGES]
    with open(template(kind)) as f:
        text = tok.apply_chat_template(msgs, tools=[t["function"] for t in TOOLS], tokenize=False,
                                       chat_template=f.read())
    return text.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")


def stream_pieces(parser_factory, text: str, cuts: list[int]):
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    parser = parser_factory()
    deltas = [parser.delta(p, final=k == len(pieces) - 1) for k, p in enumerate(pieces)]
    return deltas


def merged(deltas: list[dict]) -> dict:
    """The deltas joined as an OpenAI client joins them: tool_calls by index, their name and arguments
    concatenated."""
    out = {"reasoning_content": "", "content": "", "tool_calls": []}
    calls: dict[int, dict] = {}
    for d in deltas:
        out["reasoning_content"] += d.get("reasoning_content", "")
        out["content"] += d.get("content", "")
        for tc in d.get("tool_calls", []):
            call = calls.setdefault(tc["index"], {"index": tc["index"], "function": {"name": "", "arguments": ""}})
            call["id"] = call.get("id") or tc.get("id")
            for key in ("name", "arguments"):
                call["function"][key] += tc["function"].get(key) or ""
    out["tool_calls"] = [calls[i] for i in sorted(calls)]
    return out


def _calls(tool_calls: list[dict]) -> list[tuple[str, dict]]:
    return [(tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in tool_calls]


# ---- parsers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, parser", [("json", "qwen25"), ("xml", "qwen3_coder")])
def test_tool_parser_on_template_renderings(model_path, kind, parser):
    reply = rendered_reply(model_path, kind)
    parsed = ToolCallParser(parser, TOOLS).parse(reply)
    assert parsed.content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in CALLS]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_streamed_tool_calls_match_whole_parse(model_path, data):
    kind, parser = data.draw(st.sampled_from([("json", "qwen25"), ("xml", "qwen3_coder")]))
    reply = rendered_reply(model_path, kind) + "\nDone."
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(reply) - 1), max_size=12))))
    setup = ChatSetup(tools=TOOLS, tool_parser=parser)
    got = merged(stream_pieces(lambda: setup.choice_parser(False), reply, cuts))
    whole = setup.choice_parser(False).message(reply)
    assert _calls(got["tool_calls"]) == _calls(whole["tool_calls"])
    assert [tc["index"] for tc in got["tool_calls"]] == [0, 1] and all(tc["id"] for tc in got["tool_calls"])
    assert got["content"].strip() == "Let me check.\nDone." and whole["content"] == "Let me check.\nDone."


def test_json_tool_call_arguments_stream_in_pieces():
    """qwen25: the call's id and name go out as soon as they are read, then its arguments' text as it
    comes; the id stays the same and the pieces join into the arguments' JSON."""
    setup = ChatSetup(tools=TOOLS, tool_parser="qwen25")
    reply = 'Ok.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 12}}\n</tool_call>'
    deltas = stream_pieces(lambda: setup.choice_parser(False), reply, list(range(1, len(reply))))
    pieces = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert pieces[0]["function"] == {"name": "get_weather", "arguments": ""} and pieces[0]["id"]
    assert len(pieces) > 10 and all(tc["index"] == 0 for tc in pieces)
    assert all("name" not in tc["function"] for tc in pieces[1:])
    got = merged(deltas)
    assert _calls(got["tool_calls"]) == [("get_weather", {"city": "Oslo", "days": 12})]
    assert got["content"] == "Ok.\n"
    # the name arrives before the arguments are complete
    first = next(k for k, d in enumerate(deltas) if d.get("tool_calls"))
    assert first < reply.index('"days"')


def test_xml_tool_call_parameters_stream_one_by_one(model_path):
    """qwen3_coder: the id and name as soon as <function=...> is read, then each parameter, typed,
    once its closing tag is in; the pieces join into the arguments' JSON."""
    setup = ChatSetup(tools=TOOLS, tool_parser="qwen3_coder")
    reply = rendered_reply(model_path, "xml")
    deltas = stream_pieces(lambda: setup.choice_parser(False), reply, list(range(1, len(reply))))
    pieces = [tc for d in deltas for tc in d.get("tool_calls", [])]
    first = [tc for tc in pieces if tc["index"] == 0]
    assert first[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert [tc["function"]["arguments"] for tc in first[1:]] == ['{"city": "Paris"', ', "days": 3', "}"]
    assert _calls(merged(deltas)["tool_calls"]) == _calls(CALLS)


def test_tool_parser_keeps_bad_calls_as_content():
    p = ToolCallParser("qwen25", TOOLS)
    text = 'Hi <tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call> and <tool_call>\n{broken\n</tool_call>'
    parsed = p.parse(text)
    assert parsed.calls == [] and "rm_rf" in parsed.content and "{broken" in parsed.content
    cut = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}'
    unfinished = ToolCallParser("qwen25", TOOLS).parse(cut)
    assert [c.name for c in unfinished.calls] == ["get_time"]  # the output ended before the closing tag


def read_template(kind: str) -> str:
    with open(template(kind)) as f:
        return f.read()


def test_parser_for_template():
    assert parser_for_template(read_template("json")) == "qwen25"
    assert parser_for_template(read_template("xml")) == "qwen3_coder"
    assert parser_for_template({"default": CHAT_TEMPLATE, "tool_use": read_template("xml")}) == "qwen3_coder"
    assert parser_for_template(CHAT_TEMPLATE) is None and parser_for_template(None) is None


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_choice_takes_the_parser_from_the_template(choice):
    req = ChatCompletionRequest(messages=MESSAGES[:1], tools=TOOLS, tool_choice=choice)
    for kind, parser in (("json", "qwen25"), ("xml", "qwen3_coder")):
        setup = chat_setup(req, None, None, read_template(kind))
        assert setup.tool_parser == parser and setup.forced == choice
        assert "structural_tag" in setup.grammar_params(False)
    assert chat_setup(req, "qwen3_coder", None, read_template("json")).tool_parser == "qwen3_coder"  # the flag wins
    with pytest.raises(ApiError, match="start the server with --tool-call-parser"):
        chat_setup(req, None, None, CHAT_TEMPLATE)  # a template without <tool_call>
    auto = chat_setup(ChatCompletionRequest(messages=MESSAGES[:1], tools=TOOLS), None, None, read_template("json"))
    assert auto.tool_parser is None  # auto without the flag: calls stay content, as before


REASONING = "<think>\nThe user wants 2 + 2. That is 4.\n</think>\n\nThe answer is 4."


@pytest.mark.parametrize("text, opened, reasoning, content", [
    (REASONING, False, "The user wants 2 + 2. That is 4.", "The answer is 4."),
    ("The user wants 2 + 2.\n</think>\n\nFour.", True, "The user wants 2 + 2.", "Four."),
    ("No thinking here.", False, "", "No thinking here."),
    ("<think>\nStill thinking when the tokens ran out", False, "Still thinking when the tokens ran out", ""),
])
def test_reasoning_parser(text, opened, reasoning, content):
    split = ReasoningParser("qwen3", in_reasoning=opened).parse(text)
    assert (split.reasoning, split.content) == (reasoning, content)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, len(REASONING) - 1), max_size=10))
def test_streamed_reasoning_matches_whole_parse(cuts):
    setup = ChatSetup(reasoning_parser="qwen3")
    got = merged(stream_pieces(lambda: setup.choice_parser(False), REASONING, sorted(set(cuts))))
    assert got["reasoning_content"].strip() == "The user wants 2 + 2. That is 4."
    assert got["content"] == "The answer is 4."


def test_prompt_opens_block():
    assert ReasoningParser.prompt_opens_block("<|im_start|>assistant\n<think>\n")
    assert not ReasoningParser.prompt_opens_block("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not ReasoningParser.prompt_opens_block("<|im_start|>assistant\n")


# ---- server --------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=[("json", "qwen25"), ("xml", "qwen3_coder")], ids=["qwen25", "qwen3_coder"])
def tool_server(request, model_path, tmp_path_factory):
    kind, parser = request.param
    srv = launch(model_path, tmp_path_factory.mktemp("tool-server"), "--tool-call-parser", parser,
                 "--reasoning-parser", "qwen3", "--chat-template", template(kind), name=parser)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(tool_server):
    return openai.OpenAI(base_url=tool_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def check_call(call) -> None:
    schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)


def test_required_and_named_tool_choice(client, tool_server):
    model = tool_server.model_path
    r = client.chat.completions.create(model=model, messages=MESSAGES[:1], tools=TOOLS, tool_choice="required",
                                       max_tokens=300, n=2, temperature=1.0, parallel_tool_calls=False)
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls", choice
        assert len(choice.message.tool_calls) == 1 and choice.message.content is None
        check_call(choice.message.tool_calls[0])
    r = client.chat.completions.create(model=model, messages=MESSAGES[:1], tools=TOOLS, tool_choice="required",
                                       max_tokens=300, n=2, temperature=1.0)
    for choice in r.choices:  # parallel calls: as many as the model likes, each of them valid
        assert choice.message.tool_calls, choice
        for call in choice.message.tool_calls:
            check_call(call)
    r = client.chat.completions.create(model=model, messages=MESSAGES[:1], tools=TOOLS, max_tokens=300,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and [c.function.name for c in calls] == ["get_time"]
    check_call(calls[0])


def test_streamed_tool_call_deltas(client, tool_server):
    stream = client.chat.completions.create(model=tool_server.model_path, messages=MESSAGES[:1], tools=TOOLS,
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                            max_tokens=300, stream=True)
    calls, finish = {}, None
    for chunk in stream:
        for choice in chunk.choices:
            for tc in choice.delta.tool_calls or []:
                calls.setdefault(tc.index, {"name": "", "arguments": ""})
                calls[tc.index]["name"] += tc.function.name or ""
                calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and calls[0]["name"] == "get_weather"
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)


def test_tools_rendered_and_history_with_calls(client, tool_server):
    history = MESSAGES + [{"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}]
    r = client.chat.completions.create(model=tool_server.model_path, messages=history, tools=TOOLS,
                                       tool_choice="none", max_tokens=8, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        client.chat.completions.create(model=tool_server.model_path, messages=MESSAGES[:1], tools=TOOLS,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})


def test_reasoning_with_enable_thinking(client, tool_server):
    kwargs = dict(model=tool_server.model_path, messages=MESSAGES[:1], max_tokens=12, temperature=0)
    r = client.chat.completions.create(**kwargs, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    plain = client.chat.completions.create(**kwargs, extra_body={"chat_template_kwargs": {"enable_thinking": True},
                                                                 "separate_reasoning": False})
    message = r.choices[0].message
    text = plain.choices[0].message.content
    if "</think>" in text:  # the model closed its thinking: the answer follows
        assert message.reasoning_content == text.split("</think>")[0].strip()
    else:  # still thinking when the tokens ran out: all of it is reasoning
        assert message.reasoning_content == text.strip() and not message.content
    stream = client.chat.completions.create(**kwargs, stream=True,
                                            extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    streamed = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in stream if c.choices)
    assert streamed.strip() == message.reasoning_content
