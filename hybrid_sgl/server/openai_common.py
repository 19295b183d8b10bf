"""Shared by the OpenAI-compatible routes: request checks, sampling params for the engine, usage,
logprob formats, /v1/models."""

from __future__ import annotations

import json
import time
import uuid
from functools import lru_cache

from fastapi import APIRouter, Request
from transformers import PreTrainedTokenizerBase

from hybrid_sgl.outputs import OutputState
from hybrid_sgl.server.errors import ApiError, json_response
from hybrid_sgl.server.generation import ServerContext, get_context
from hybrid_sgl.server.protocol import _OpenAISampling
from hybrid_sgl.server.structured import response_format_params

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
        "no_stop_trim": req.no_stop_trim, "ignore_eos": req.ignore_eos,
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


def stream_usage_chunk(base: dict, outputs: list[OutputState], n: int) -> dict:
    return {**base, "choices": [], "usage": usage(outputs, n)}


def now() -> int:
    return int(time.time())


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
            "owned_by": "hybrid_sgl", "root": ctx.engine.server_args.model_path,
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
