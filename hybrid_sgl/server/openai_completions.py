"""POST /v1/completions (OpenAI's legacy completions), streaming and not."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hybrid_sgl.server.errors import ApiError, parse_body
from hybrid_sgl.server.generation import (
    SSE_DONE,
    ClientDisconnected,
    ServerContext,
    check_fanout,
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
    check_request,
    completion_logprobs,
    finish_fields,
    max_new_tokens_for,
    merge_completion_logprobs,
    new_id,
    now,
    sampling_params,
    stream_usage_chunk,
    usage,
)
from hybrid_sgl.server.openapi import body_schema
from hybrid_sgl.server.protocol import CompletionRequest
from hybrid_sgl.server.structured import grammars_compiled
from hybrid_sgl.submission import Submission

router = APIRouter()


def _prompts(ctx: ServerContext, prompt) -> tuple[list[list[int]], list[str]]:
    """Token ids and echo text of each prompt (a string, strings, token ids, or lists of ids)."""
    tok = ctx.tokenizer("/v1/completions")
    if isinstance(prompt, str):
        ctx.check_chars([prompt], "prompt")
        return [tok.encode(prompt)], [prompt]
    if not prompt:
        raise ApiError("prompt must not be empty", param="prompt")
    if isinstance(prompt[0], str):
        for p in prompt:
            ctx.check_chars([p], "prompt")
        return [tok.encode(p) for p in prompt], list(prompt)
    if isinstance(prompt[0], int):
        prompt = [prompt]
    vocab = ctx.engine.model_config.vocab_size
    for ids in prompt:
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ApiError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="prompt")
    return [list(ids) for ids in prompt], [tok.decode(ids, skip_special_tokens=True) for ids in prompt]


@router.post("/v1/completions", openapi_extra=body_schema(CompletionRequest))
async def completions(request: Request):
    ctx = get_context(request)
    req = await parse_body(request, CompletionRequest)
    check_request(req)
    n = req.n or 1
    if req.suffix:
        raise ApiError("suffix is not supported yet", param="suffix")
    if req.best_of is not None and req.best_of != n:
        raise ApiError("best_of different from n is not supported yet", param="best_of")
    if req.max_tokens is not None and (req.max_tokens < 0 or (req.max_tokens == 0 and not req.echo)):
        raise ApiError(f"max_tokens must be at least 1 (0 only with echo), got {req.max_tokens}", param="max_tokens")
    check_fanout(n * (len(req.prompt) if isinstance(req.prompt, list) and req.prompt
                      and not isinstance(req.prompt[0], int) else 1))
    ids_list, echo_texts = await ctx.off_loop(_prompts, ctx, req.prompt)
    want_lp = req.logprobs is not None
    params = [sampling_params(req, max_new_tokens_for(ctx, len(ids), req.max_tokens))
              for ids in ids_list]
    rid = req.rid or new_id("cmpl")
    prepared, _ = await ctx.off_loop(ctx.engine.prepare, None, params, ids_list, want_lp,
                                     0 if (req.echo and want_lp) else None, req.logprobs, True, rid)
    await grammars_compiled(ctx.engine.scheduler.grammars, prepared)
    sub = ctx.engine.submit(prepared)
    base = {"id": rid, "object": "text_completion", "created": now(), "model": req.model or ctx.served_model_name}
    tt: TokenText = request.app.state.token_text
    if req.stream:
        events = _stream(ctx, request, sub, req, base, tt, echo_texts if req.echo else None)
        return streaming_response(events, sub)
    try:
        outputs = await run_to_end(ctx, request, sub)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)

    def body() -> dict:
        choices = []
        for i, out in enumerate(outputs):
            echo = echo_texts[i // n] if req.echo else ""
            logprobs = None
            if want_lp:
                logprobs = _logprobs(tt, out, req, include_input=bool(req.echo), offset=0, start=0)
            choices.append({"index": i, "text": echo + out.final_text(), "logprobs": logprobs,
                            **finish_fields(out)})
        return {**base, "choices": choices, "usage": usage(outputs, n)}

    return await json_off_loop(ctx, lambda: [body()], single=True)


def _logprobs(tt: TokenText, out, req: CompletionRequest, include_input: bool, offset: int, start: int) -> dict:
    tops = req.logprobs > 0
    result = None
    if include_input:
        result = completion_logprobs(tt, out.input_logprobs, out.input_top_logprobs if tops else None, offset)
        offset += sum(len(t) for t in result["tokens"])
    pairs = out.output_logprobs[start:]
    output = completion_logprobs(tt, pairs, out.output_top_logprobs[start:] if tops else None, offset)
    return merge_completion_logprobs(result, output)


async def _stream(ctx: ServerContext, request: Request, sub: Submission, req: CompletionRequest, base: dict,
                  tt: TokenText, echo_texts: list[str] | None):
    n = req.n or 1
    count = len(sub.prepared)
    sent_text = [0] * count
    sent_lp = [0] * count
    text_offset = [0] * count
    started = [False] * count
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
    outputs = sub.outputs
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
                first = not started[i]
                if first and echo_texts is not None:
                    delta = echo_texts[i // n] + delta
                logprobs = None
                echo_input = first and echo_texts is not None and bool(out.input_logprobs)
                if req.logprobs is not None and (len(out.output_logprobs) > sent_lp[i] or echo_input):
                    logprobs = _logprobs(tt, out, req, echo_input, text_offset[i], sent_lp[i])
                    sent_lp[i] = len(out.output_logprobs)
                    text_offset[i] += sum(len(t) for t in logprobs["tokens"])
                if not delta and logprobs is None and not out.finished:
                    continue
                started[i] = True
                chunk = {**base, "choices": [{"index": i, "text": delta, "logprobs": logprobs, **finish_fields(out)}]}
                if include_usage:
                    chunk["usage"] = stream_usage_chunk(base, [out], 1)["usage"] if continuous else None
                yield sse(chunk)
        except ClientDisconnected:
            return
    if include_usage:
        yield sse(stream_usage_chunk(base, outputs, n))
    yield SSE_DONE
