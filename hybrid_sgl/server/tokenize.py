"""/tokenize and /detokenize (also under /v1), as in SGLang: the server's own tokenizer and chat
template, for clients that count or build tokens themselves."""

from __future__ import annotations

from fastapi import APIRouter, Request

from hybrid_sgl.server.errors import ApiError, json_response, parse_body
from hybrid_sgl.server.generation import get_context
from hybrid_sgl.server.openai_chat import render_chat
from hybrid_sgl.server.openapi import body_schema
from hybrid_sgl.server.protocol import ChatCompletionRequest, DetokenizeRequest, TokenizeRequest

router = APIRouter()


@router.post("/tokenize", openapi_extra=body_schema(TokenizeRequest))
@router.post("/v1/tokenize", openapi_extra=body_schema(TokenizeRequest))
async def tokenize(request: Request):
    ctx = get_context(request)
    req = await parse_body(request, TokenizeRequest)
    if (req.prompt is None) == (req.messages is None):
        raise ApiError("give exactly one of prompt and messages", param="prompt")
    tok = ctx.tokenizer("/tokenize")
    if req.messages is not None:
        chat = ChatCompletionRequest(messages=req.messages, add_generation_prompt=req.add_generation_prompt,
                                     continue_final_message=req.continue_final_message,
                                     chat_template_kwargs=req.chat_template_kwargs)
        tokens = await ctx.off_loop(render_chat, ctx, chat)
    elif isinstance(req.prompt, str):
        ctx.check_chars([req.prompt], "prompt")
        tokens = await ctx.off_loop(tok.encode, req.prompt, add_special_tokens=req.add_special_tokens)
    else:
        ctx.check_chars(req.prompt, "prompt")
        tokens = await ctx.off_loop(lambda: [tok.encode(p, add_special_tokens=req.add_special_tokens)
                                             for p in req.prompt])
    count = len(tokens) if isinstance(req.prompt, str) or req.messages is not None else [len(t) for t in tokens]
    return json_response({"tokens": tokens, "count": count, "max_model_len": ctx.context_length})


@router.post("/detokenize", openapi_extra=body_schema(DetokenizeRequest))
@router.post("/v1/detokenize", openapi_extra=body_schema(DetokenizeRequest))
async def detokenize(request: Request):
    ctx = get_context(request)
    req = await parse_body(request, DetokenizeRequest)
    vocab = ctx.capacity.vocab_size
    lists = [req.tokens] if not req.tokens or isinstance(req.tokens[0], int) else req.tokens
    for ids in lists:
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ApiError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="tokens")
    tok = ctx.tokenizer("/detokenize")
    texts = await ctx.off_loop(lambda: [tok.decode(ids, skip_special_tokens=req.skip_special_tokens) for ids in lists])
    return json_response({"text": texts[0] if lists is not req.tokens else texts})
