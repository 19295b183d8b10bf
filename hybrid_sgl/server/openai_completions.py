"""POST /v1/completions (OpenAI's legacy completions), streaming and not."""

from __future__ import annotations

from fastapi import APIRouter, Request

from hybrid_sgl.outputs import OutputState
from hybrid_sgl.server.errors import ApiError, parse_body
from hybrid_sgl.server.generation import ServerContext, check_fanout, get_context, streaming_response
from hybrid_sgl.server.openai_common import (
    TokenText,
    check_request,
    completion_logprobs,
    finish_fields,
    max_new_tokens_for,
    merge_completion_logprobs,
    new_id,
    respond,
    response_base,
    sampling_params,
    stream_events,
    submit,
)
from hybrid_sgl.server.openapi import body_schema
from hybrid_sgl.server.protocol import CompletionRequest

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
    vocab = ctx.capacity.vocab_size
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
    sub = await submit(ctx, ids_list, params, want_lp, 0 if (req.echo and want_lp) else None, req.logprobs, rid)
    base = response_base(ctx, req, rid, "text_completion")
    tt: TokenText = request.app.state.token_text
    if req.stream:
        events = stream_events(ctx, request, sub, req, base,
                               _stream_choice(req, tt, echo_texts if req.echo else None, len(sub.prepared)))
        return streaming_response(events, sub)

    def choice(i: int, out: OutputState) -> dict:
        echo = echo_texts[i // n] if req.echo else ""
        logprobs = None
        if want_lp:
            logprobs = _logprobs(tt, out, req, include_input=bool(req.echo), offset=0, start=0)
        return {"index": i, "text": echo + out.final_text(), "logprobs": logprobs, **finish_fields(out)}

    return await respond(ctx, request, sub, req, base, choice)


def _logprobs(tt: TokenText, out, req: CompletionRequest, include_input: bool, offset: int, start: int) -> dict:
    tops = req.logprobs > 0
    result = None
    if include_input:
        result = completion_logprobs(tt, out.input_logprobs, out.input_top_logprobs if tops else None, offset)
        offset += sum(len(t) for t in result["tokens"])
    pairs = out.output_logprobs[start:]
    output = completion_logprobs(tt, pairs, out.output_top_logprobs[start:] if tops else None, offset)
    return merge_completion_logprobs(result, output)


def _stream_choice(req: CompletionRequest, tt: TokenText, echo_texts: list[str] | None, count: int):
    """choice(i, out, new_text) for stream_events: the new text (after the echoed prompt in the
    first chunk of a choice) with its tokens' logprobs, text offsets running on across chunks."""
    n = req.n or 1
    sent_lp = [0] * count
    text_offset = [0] * count
    started = [False] * count

    def choice(i: int, out: OutputState, text: str) -> dict | None:
        first = not started[i]
        if first and echo_texts is not None:
            text = echo_texts[i // n] + text
        logprobs = None
        echo_input = first and echo_texts is not None and bool(out.input_logprobs)
        if req.logprobs is not None and (len(out.output_logprobs) > sent_lp[i] or echo_input):
            logprobs = _logprobs(tt, out, req, echo_input, text_offset[i], sent_lp[i])
            sent_lp[i] = len(out.output_logprobs)
            text_offset[i] += sum(len(t) for t in logprobs["tokens"])
        if not text and logprobs is None and not out.finished:
            return None
        started[i] = True
        return {"index": i, "text": text, "logprobs": logprobs, **finish_fields(out)}

    return choice
