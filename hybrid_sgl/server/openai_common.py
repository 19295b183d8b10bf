"""Shared by the OpenAI-compatible routes: request checks, sampling params for the engine, one
request's way through the engine (submit, the JSON answer, the SSE stream), usage, logprob formats,
/v1/models. Each route adds only its own choice objects."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Sequence
from functools import lru_cache

from fastapi import APIRouter, Request
from fastapi.responses import Response
from transformers import PreTrainedTokenizerBase

from hybrid_sgl.outputs import OutputState
from hybrid_sgl.server.errors import ApiError, json_response
from hybrid_sgl.server.generation import (
    CLIENT_CLOSED,
    SSE_DONE,
    ClientDisconnected,
    ServerContext,
    engine_error,
    get_context,
    run_to_end,
    sse,
    sse_error,
    stream_outputs,
)
from hybrid_sgl.server.protocol import _OpenAISampling
from hybrid_sgl.server.structured import grammars_compiled, response_format_params
from hybrid_sgl.submission import Submission

router = APIRouter()
LOGIT_BIAS_LIMIT = 100.0


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def check_request(req: _OpenAISampling) -> None:
    """Checks OpenAI documents that the engine's own validation does not cover."""
    if req.stream_options is not None and not req.stream:
        raise ApiError("stream_options is only allowed when stream is true", param="stream_options")
    if req.return_hidden_states:
        raise ApiError("return_hidden_states is not supported yet", param="return_hidden_states")
    if req.data_parallel_rank not in (None, 0):
        raise ApiError(f"data_parallel_rank {req.data_parallel_rank}: this server has one data-parallel rank, 0",
                       param="data_parallel_rank")
    if req.temperature is not None and not 0.0 <= req.temperature <= 2.0:
        raise ApiError(f"temperature must be between 0 and 2, got {req.temperature}", param="temperature")
    for key, bias in (req.logit_bias or {}).items():
        if not key.lstrip("-").isdigit():
            raise ApiError(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
        if not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
            raise ApiError(f"logit_bias values must be in [-100, 100], got {bias} for token {key}",
                           param="logit_bias")


def sampling_params(req: _OpenAISampling, max_new_tokens: int) -> dict:
    """The engine's sampling_params for one prompt (None = the engine's default)."""
    params = {
        "max_new_tokens": max_new_tokens, "temperature": req.temperature, "top_p": req.top_p, "n": req.n,
        "stop": req.stop, "frequency_penalty": req.frequency_penalty, "presence_penalty": req.presence_penalty,
        "sampling_seed": req.seed, "top_k": req.top_k, "min_p": req.min_p, "min_new_tokens": req.min_tokens,
        "repetition_penalty": req.repetition_penalty, "stop_token_ids": req.stop_token_ids,
        "stop_regex": req.stop_regex, "no_stop_trim": req.no_stop_trim, "ignore_eos": req.ignore_eos,
        "skip_special_tokens": req.skip_special_tokens,
        "spaces_between_special_tokens": req.spaces_between_special_tokens,
        "regex": req.regex, "json_schema": req.json_schema, "ebnf": req.ebnf,
        **response_format_params(req.response_format),
        "logit_bias": {int(k): v for k, v in req.logit_bias.items()} if req.logit_bias else None,
    }
    return {k: v for k, v in params.items() if v is not None}


def max_new_tokens_for(ctx: ServerContext, prompt_len: int, max_tokens: int | None) -> int:
    """max_tokens, or all the room the context leaves when it is null."""
    if max_tokens is None:
        if prompt_len >= ctx.context_length:
            raise ApiError(f"the prompt has {prompt_len} tokens; the context length is {ctx.context_length}")
        return ctx.context_length - prompt_len
    return max_tokens


def usage(outputs: list[OutputState], n: int) -> dict:
    """OpenAI usage; prompt_tokens counts each prompt once, cached_tokens (prefix-cache hits) every
    sequence's, as SGLang reports them."""
    prompt = sum(out.prompt_tokens for out in outputs[::n])
    completion = sum(out.completion_tokens for out in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(out.cached_tokens for out in outputs)}}


def finish_fields(out: OutputState) -> dict:
    reason = out.finish_reason
    if reason is None:
        return {"finish_reason": None}
    return {"finish_reason": reason["type"], "matched_stop": reason.get("matched")}


def response_base(ctx: ServerContext, req: _OpenAISampling, rid: str, kind: str) -> dict:
    """The fields every response object (and stream chunk) of the request starts with."""
    return {"id": rid, "object": kind, "created": int(time.time()), "model": req.model or ctx.served_model_name}


# ---- one request through the engine -------------------------------------------------------------
async def submit(ctx: ServerContext, ids: list, params, logprobs: bool, logprob_start_len: int | None,
                 top_logprobs: int | None, rid: str) -> Submission:
    """Prepare the sequences on the text worker (token ids: one prompt or a list of them; params:
    one dict or one per prompt), refuse a grammar that does not compile (400) and hand them to the
    engine, all before any response starts."""
    prepared, _ = await ctx.off_loop(ctx.engine.prepare, None, params, ids, logprobs, logprob_start_len,
                                     top_logprobs, True, rid)
    await grammars_compiled(ctx.engine, prepared)
    return ctx.engine.submit(prepared)


async def respond(ctx: ServerContext, request: Request, sub: Submission, req: _OpenAISampling, base: dict,
                  choice: Callable[[int, OutputState], dict]) -> Response:
    """The whole answer once every sequence finished: `base` with choice(i, out) of each sequence
    and the usage, built on the text worker; 499 when the client left first."""
    try:
        outputs = await run_to_end(ctx, request, sub)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)

    def body() -> dict:
        choices = [choice(i, out) for i, out in enumerate(outputs)]
        return {**base, "choices": choices, "usage": usage(outputs, req.n or 1)}

    return await ctx.json_off_loop(lambda: [body()], single=True)


async def stream_events(ctx: ServerContext, request: Request, sub: Submission, req: _OpenAISampling, base: dict,
                        choice: Callable[[int, OutputState, str], dict | None], first: Sequence[dict] = ()):
    """The SSE events of a streamed answer: a chunk for each of `first` (choice i of `first` before
    any update), then after each update of sequence i a chunk for choice(i, out, new_text), or none
    when it returns None (nothing to send yet). Each chunk carries the usage stream_options asks
    for; an engine error ends the stream with an error event; the total usage (include_usage) and
    [DONE] close it."""
    sent_text = [0] * len(sub.prepared)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
    outputs = sub.outputs

    def chunk(body: dict, out: OutputState) -> str:
        event = {**base, "choices": [body]}
        if include_usage:
            event["usage"] = usage([out], 1) if continuous else None
        return sse(event)

    for i, body in enumerate(first):
        yield chunk(body, outputs[i])
    async with contextlib.aclosing(stream_outputs(ctx, request, sub)) as updates:
        try:
            async for i, out in updates:
                error = engine_error(out)
                if error is not None:
                    yield sse_error(*error)
                    break
                text = await ctx.off_loop(out.streaming_text) if out.finished else out.streaming_text()
                body = choice(i, out, text[sent_text[i]:])
                sent_text[i] = len(text)
                if body is not None:
                    yield chunk(body, out)
        except ClientDisconnected:
            return
    if include_usage:
        yield sse({**base, "choices": [], "usage": usage(outputs, req.n or 1)})
    yield SSE_DONE


# ---- logprobs ------------------------------------------------------------------------------------
class TokenText:
    """Token id -> display text and raw bytes (byte-level BPE pieces decode to their true bytes)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.byte_level = _is_byte_level(tokenizer)
        self.text = lru_cache(maxsize=65536)(self._text)
        self.bytes = lru_cache(maxsize=65536)(self._bytes)

    def _text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def _bytes(self, token_id: int) -> list[int]:
        if self.byte_level:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            decoder = _byte_decoder()
            if piece is not None and all(ch in decoder for ch in piece):
                return [decoder[ch] for ch in piece]
        return list(self.text(token_id).encode("utf-8"))


def completion_logprobs(tt: TokenText, pairs: list, tops: list | None, offset: int) -> dict:
    """OpenAI's legacy logprobs object for (logprob, id) pairs; `tops` holds top pairs per token."""
    tokens = [tt.text(tid) for _, tid in pairs]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    top = [] if tops is None else [None if t is None else {tt.text(i): lp for lp, i in t} for t in tops]
    return {"tokens": tokens, "token_logprobs": [lp for lp, _ in pairs], "top_logprobs": top,
            "text_offset": offsets}


def merge_completion_logprobs(a: dict | None, b: dict) -> dict:
    if a is None:
        return b
    return {key: a[key] + b[key] for key in b}


def chat_logprobs(tt: TokenText, pairs: list, tops: list | None) -> list[dict]:
    """OpenAI chat `logprobs.content` entries."""
    entries = []
    for j, (lp, tid) in enumerate(pairs):
        top = (tops[j] if tops is not None and j < len(tops) else None) or []
        entries.append({"token": tt.text(tid), "logprob": lp, "bytes": tt.bytes(tid),
                        "top_logprobs": [{"token": tt.text(i), "logprob": v, "bytes": tt.bytes(i)} for v, i in top]})
    return entries


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable stand-in for each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _is_byte_level(tokenizer: PreTrainedTokenizerBase) -> bool:
    if not tokenizer.is_fast:  # only fast (Rust) tokenizers expose their pipeline
        return False
    decoder = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder") or {}
    kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders", [])]
    return "ByteLevel" in kinds


# ---- /v1/models ----------------------------------------------------------------------------------
def _card(ctx: ServerContext) -> dict:
    return {"id": ctx.served_model_name, "object": "model", "created": int(ctx.metrics.start_time),
            "owned_by": "hybrid_sgl", "root": ctx.served_model_name,
            "max_model_len": ctx.context_length}


@router.get("/v1/models")
async def list_models(request: Request):
    return json_response({"object": "list", "data": [_card(get_context(request))]})


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request):
    ctx = get_context(request)
    if model not in (ctx.served_model_name, "default"):
        raise ApiError(f"the model {model!r} does not exist; this server serves {ctx.served_model_name!r}",
                       status=404, param="model", code="model_not_found")
    return json_response(_card(ctx))
