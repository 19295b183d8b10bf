"""POST /v1/chat/completions: the tokenizer's chat template, then the engine; streaming and not."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hybrid_sgl.server.chat_parsing import ChoiceParser, chat_setup, custom_template, template_message_tool_calls
from hybrid_sgl.server.errors import ApiError, parse_body
from hybrid_sgl.server.generation import (
    SSE_DONE,
    ClientDisconnected,
    ServerContext,
    engine_error,
    get_context,
    run_to_end,
    sse,
    sse_error,
    stream_outputs,
    streaming_response,
)
from hybrid_sgl.server.native import CLIENT_CLOSED, json_off_loop
from hybrid_sgl.server.openai_common import (
    TokenText,
    chat_logprobs,
    check_request,
    finish_fields,
    max_new_tokens_for,
    new_id,
    now,
    sampling_params,
    stream_usage_chunk,
    usage,
)
from hybrid_sgl.server.openapi import body_schema
from hybrid_sgl.server.protocol import ChatCompletionRequest, ChatMessage
from hybrid_sgl.server.reasoning_parser import ReasoningParser
from hybrid_sgl.server.structured import grammars_compiled
from hybrid_sgl.submission import Submission

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
    setup = chat_setup(req, args.tool_call_parser, args.reasoning_parser)
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError("top_logprobs requires logprobs to be true", param="top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(f"{field} must be at least 1, got {max_tokens}", param=field)
    ids = await ctx.off_loop(render_chat, ctx, req, setup.template_tools)
    n = req.n or 1
    in_reasoning = ReasoningParser.prompt_opens_block(ctx.tokenizer("chat").decode(ids[-16:]))
    params = {**sampling_params(req, max_new_tokens_for(ctx, len(ids), max_tokens)),
              **setup.grammar_params(in_reasoning)}
    rid = req.rid or new_id("chatcmpl")
    want_lp = bool(req.logprobs)
    prepared, _ = await ctx.off_loop(ctx.engine.prepare, None, params, ids, want_lp, None, req.top_logprobs or 0,
                                     True, rid)
    await grammars_compiled(ctx.engine.scheduler.grammars, prepared)
    sub = ctx.engine.submit(prepared)
    base = {"id": rid, "object": "chat.completion", "created": now(), "model": req.model or ctx.served_model_name}
    tt: TokenText = request.app.state.token_text
    if req.stream:
        return streaming_response(_stream(ctx, request, sub, req, {**base, "object": "chat.completion.chunk"}, tt,
                                          [setup.choice_parser(in_reasoning) for _ in sub.prepared]), sub)
    try:
        outputs = await run_to_end(ctx, request, sub)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)

    def body() -> dict:
        choices = []
        for i, out in enumerate(outputs):
            logprobs = None
            if want_lp:
                logprobs = {"content": chat_logprobs(tt, out.output_logprobs, out.output_top_logprobs)}
            parser = setup.choice_parser(in_reasoning)
            message = parser.message(out.final_text())
            finish = finish_fields(out)
            choices.append({"index": i, "message": message, "logprobs": logprobs,
                            **finish, "finish_reason": parser.finish_reason(finish["finish_reason"])})
        return {**base, "choices": choices, "usage": usage(outputs, n)}

    return await json_off_loop(ctx, lambda: [body()], single=True)


async def _stream(ctx: ServerContext, request: Request, sub: Submission, req: ChatCompletionRequest, base: dict,
                  tt: TokenText, parsers: list[ChoiceParser]):
    n = req.n or 1
    count = len(sub.prepared)
    sent_text = [0] * count
    sent_lp = [0] * count
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
    outputs = sub.outputs

    def chunk(i: int, delta: dict, logprobs, finish: dict, out) -> str:
        body = {**base, "choices": [{"index": i, "delta": delta, "logprobs": logprobs, **finish}]}
        if include_usage:
            body["usage"] = stream_usage_chunk(base, [out], 1)["usage"] if continuous else None
        return sse(body)

    for i, out in enumerate(outputs):  # the first chunk of each choice carries the role
        yield chunk(i, {"role": "assistant", "content": ""}, None, {"finish_reason": None}, out)
    async with contextlib.aclosing(stream_outputs(ctx, request, sub)) as updates:
        try:
            async for i, out in updates:
                error = engine_error(out)
                if error is not None:
                    yield sse_error(*error)
                    break
                text = await ctx.off_loop(out.streaming_text) if out.finished else out.streaming_text()
                delta = text[sent_text[i]:]
                sent_text[i] = len(text)
                logprobs = None
                if req.logprobs and len(out.output_logprobs) > sent_lp[i]:
                    start = sent_lp[i]
                    logprobs = {"content": chat_logprobs(tt, out.output_logprobs[start:],
                                                         out.output_top_logprobs[start:])}
                    sent_lp[i] = len(out.output_logprobs)
                fields = parsers[i].delta(delta, out.finished)
                if not fields and logprobs is None and not out.finished:
                    continue
                finish = finish_fields(out)
                finish["finish_reason"] = parsers[i].finish_reason(finish["finish_reason"])
                yield chunk(i, fields, logprobs, finish, out)
        except ClientDisconnected:
            return
    if include_usage:
        yield sse(stream_usage_chunk(base, outputs, n))
    yield SSE_DONE
