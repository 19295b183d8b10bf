"""POST /v1/chat/completions: the tokenizer's chat template, then the engine; streaming and not."""

from __future__ import annotations

from fastapi import APIRouter, Request

from hybrid_sgl.outputs import OutputState
from hybrid_sgl.server.chat_parsing import ChoiceParser, chat_setup, custom_template, template_message_tool_calls
from hybrid_sgl.server.errors import ApiError, parse_body
from hybrid_sgl.server.generation import ServerContext, get_context, streaming_response
from hybrid_sgl.server.openai_common import (
    TokenText,
    chat_logprobs,
    check_request,
    finish_fields,
    max_new_tokens_for,
    new_id,
    respond,
    response_base,
    sampling_params,
    stream_events,
    submit,
)
from hybrid_sgl.server.openapi import body_schema
from hybrid_sgl.server.protocol import ChatCompletionRequest, ChatMessage
from hybrid_sgl.server.reasoning_parser import ReasoningParser

router = APIRouter()


def _message_dict(i: int, m: ChatMessage) -> dict:
    content = m.content
    if isinstance(content, list):
        texts = []
        for part in content:
            if part.type != "text" or part.text is None:
                raise ApiError(f"content parts of type {part.type!r} are not supported yet (text only)",
                               param=f"messages.{i}.content")
            texts.append(part.text)
        content = "\n".join(texts)
    message = {"role": m.role, "content": content or ""}
    if m.name is not None:
        message["name"] = m.name
    if m.tool_call_id is not None:
        message["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        message["tool_calls"] = template_message_tool_calls(i, m.tool_calls)
    if m.reasoning_content is not None:
        message["reasoning_content"] = m.reasoning_content
    return message


def chat_template_text(ctx: ServerContext) -> str | dict | None:
    """The chat template in use: --chat-template's text, else the tokenizer's (None without either)."""
    if ctx.engine.server_args.chat_template is not None:
        return custom_template(ctx.engine.server_args.chat_template)
    tok = ctx.engine.tokenizer
    return None if tok is None else tok.chat_template


def render_chat(ctx: ServerContext, req: ChatCompletionRequest, tools: list[dict] | None = None) -> list[int]:
    """Prompt token ids from the chat template (--chat-template, else the tokenizer's); tools: the
    function definitions the template renders."""
    tok = ctx.tokenizer("chat templates")
    if not tok.chat_template and ctx.engine.server_args.chat_template is None:
        raise ApiError("this model's tokenizer has no chat template; use /v1/completions with a prompt")
    messages = [_message_dict(i, m) for i, m in enumerate(req.messages)]
    ctx.check_chars([m["content"] for m in messages], "messages")
    kwargs = dict(req.chat_template_kwargs or {})
    for reserved in ("conversation", "messages", "tokenize", "add_generation_prompt", "continue_final_message"):
        if reserved in kwargs:
            raise ApiError(f"chat_template_kwargs must not set {reserved!r}", param="chat_template_kwargs")
    continue_final = bool(req.continue_final_message)
    add_prompt = req.add_generation_prompt is not False and not continue_final
    try:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_prompt,
                                       continue_final_message=continue_final, tools=tools,
                                       chat_template=custom_template(ctx.engine.server_args.chat_template),
                                       **kwargs)
    except Exception as e:  # jinja's raise_exception, bad roles/ordering, bad kwargs: the request's fault
        raise ApiError(f"the chat template rejected the messages: {e}", param="messages") from None
    return tok.encode(text, add_special_tokens=False)


@router.post("/v1/chat/completions", openapi_extra=body_schema(ChatCompletionRequest))
async def chat_completions(request: Request):
    ctx = get_context(request)
    req = await parse_body(request, ChatCompletionRequest)
    check_request(req)
    if req.stream_reasoning is False:
        raise ApiError("stream_reasoning false (reasoning held back to the end) is not supported yet",
                       param="stream_reasoning")
    args = ctx.engine.server_args
    setup = chat_setup(req, args.tool_call_parser, args.reasoning_parser, chat_template_text(ctx))
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError("top_logprobs requires logprobs to be true", param="top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(f"{field} must be at least 1, got {max_tokens}", param=field)
    ids = await ctx.off_loop(render_chat, ctx, req, setup.template_tools)
    in_reasoning = ReasoningParser.prompt_opens_block(ctx.tokenizer("chat").decode(ids[-16:]))
    params = {**sampling_params(req, max_new_tokens_for(ctx, len(ids), max_tokens)),
              **setup.grammar_params(in_reasoning)}
    rid = req.rid or new_id("chatcmpl")
    sub = await submit(ctx, ids, params, bool(req.logprobs), None, req.top_logprobs or 0, rid)
    base = response_base(ctx, req, rid, "chat.completion")
    tt: TokenText = request.app.state.token_text
    if req.stream:
        parsers = [setup.choice_parser(in_reasoning) for _ in sub.prepared]
        first = [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                 for i in range(len(parsers))]  # the first chunk of each choice carries the role
        events = stream_events(ctx, request, sub, req, {**base, "object": "chat.completion.chunk"},
                               _stream_choice(req, tt, parsers), first)
        return streaming_response(events, sub)

    def choice(i: int, out: OutputState) -> dict:
        logprobs = None
        if req.logprobs:
            logprobs = {"content": chat_logprobs(tt, out.output_logprobs, out.output_top_logprobs)}
        parser = setup.choice_parser(in_reasoning)
        message = parser.message(out.final_text())
        finish = finish_fields(out)
        return {"index": i, "message": message, "logprobs": logprobs,
                **finish, "finish_reason": parser.finish_reason(finish["finish_reason"])}

    return await respond(ctx, request, sub, req, base, choice)


def _stream_choice(req: ChatCompletionRequest, tt: TokenText, parsers: list[ChoiceParser]):
    """choice(i, out, new_text) for stream_events: the delta the choice's parser makes of the new
    text (content, reasoning, tool calls), the new tokens' logprobs, the finish reason at the end."""
    sent_lp = [0] * len(parsers)

    def choice(i: int, out: OutputState, text: str) -> dict | None:
        logprobs = None
        if req.logprobs and len(out.output_logprobs) > sent_lp[i]:
            start = sent_lp[i]
            logprobs = {"content": chat_logprobs(tt, out.output_logprobs[start:], out.output_top_logprobs[start:])}
            sent_lp[i] = len(out.output_logprobs)
        fields = parsers[i].delta(text, out.finished)
        if not fields and logprobs is None and not out.finished:
            return None
        finish = finish_fields(out)
        finish["finish_reason"] = parsers[i].finish_reason(finish["finish_reason"])
        return {"index": i, "delta": fields, "logprobs": logprobs, **finish}

    return choice
