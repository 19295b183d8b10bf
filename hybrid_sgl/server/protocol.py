"""Request bodies of the native and the OpenAI-compatible API (pydantic, strict types).

Unknown fields are rejected (never silently ignored); fields that clients send by default but
that this server cannot honour yet are accepted when unset and rejected with "not supported
yet" when set (see `unsupported_fields`). `None` in an optional field means its default.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def unsupported_fields(req: BaseModel, defaults: dict[str, Any]) -> list[str]:
    """Names of fields in `defaults` whose value differs from the given neutral value."""
    return [name for name, neutral in defaults.items() if getattr(req, name) not in (None, neutral)]


# ---- native SGLang API ---------------------------------------------------------------------------
class GenerateRequest(_Strict):
    """POST /generate, SGLang's GenerateReqInput (the fields this server implements)."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    log_metrics: bool = True
    # SGLang fields for features this server does not have; any non-empty value is rejected.
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    input_embeds: Any = None
    lora_path: Any = None
    custom_logit_processor: Any = None
    session_params: Any = None
    token_ids_logprob: Any = None
    return_hidden_states: bool = False
    modalities: Any = None
    background: bool = False
    return_bytes: bool = False
    return_entropy: bool = False
    # sglang-router re-serializes every /generate body with these two: `model` is its routing key
    # (this server serves one model), and request contents are never logged here (`no_logs`).
    model: str | None = None
    no_logs: bool = False
    data_parallel_rank: int | None = None  # set by the router's --dp-aware mode; this server has rank 0 only

    NOT_SUPPORTED: ClassVar[dict[str, Any]] = {
        "image_data": [], "video_data": [], "audio_data": [], "input_embeds": [], "lora_path": "",
        "custom_logit_processor": "", "session_params": {},
        "return_hidden_states": False, "modalities": [], "background": False, "return_bytes": False,
        "return_entropy": False, "data_parallel_rank": 0}


class AbortRequest(_Strict):
    rid: str


# ---- OpenAI API ----------------------------------------------------------------------------------
class StreamOptions(_Strict):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _OpenAISampling(_Strict):
    """Fields shared by completions and chat, incl. SGLang's sampling extensions."""

    model: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    n: int | None = Field(None, ge=1, le=128)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    # SGLang extensions
    top_k: int | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    no_stop_trim: bool | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    regex: str | None = None
    json_schema: str | None = None
    ebnf: str | None = None
    response_format: dict[str, Any] | None = None
    rid: str | None = None
    return_hidden_states: bool | None = False  # sent by sglang-router on every request; true is refused
    data_parallel_rank: int | None = None  # set by the router's --dp-aware mode; only rank 0 exists here


class CompletionRequest(_OpenAISampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default; an explicit null means up to the context length
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=5)
    best_of: int | None = None
    suffix: str | None = None


class ContentPart(_Strict):
    type: str
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    video_url: Any = None


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class ChatCompletionRequest(_OpenAISampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False
    separate_reasoning: bool | None = True  # SGLang: reasoning_content apart (with --reasoning-parser)
    stream_reasoning: bool | None = True  # reasoning streamed as it comes; false (held back) is refused


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int] | list[list[int]]
    skip_special_tokens: bool = True
