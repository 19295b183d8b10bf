"""ServerArgs: every knob of the runtime in one frozen dataclass.

Flag names match SGLang's where they overlap; `--help` text comes from each field's metadata
and argparse defaults are read from the dataclass. `check()` refuses, naming the flag, every value
that cannot serve and needs no model to tell; "auto" values are resolved once by `resolved()` (which
runs `check()` first) before anything uses them.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import os
from dataclasses import dataclass, field

from hybrid_sgl.server.reasoning_parser import PARSERS as REASONING_PARSERS
from hybrid_sgl.server.tool_parser import ALIASES as TOOL_PARSER_ALIASES
from hybrid_sgl.server.tool_parser import GRAMMAR_MODELS as TOOL_PARSERS

logger = logging.getLogger(__name__)

# decode batches of this many requests or more skip speculative decoding (--speculative-disable-by-batch-size),
# the 9B shape on one H100 (bench/README.md, 3 drafts, accept length ~2.95): on the host path verify steps gain
# 1.10x at 48 rows and lose at 56 (0.975x) and 64 (0.94x); chained iterations gain 1.272x at 64, the largest
# batch measured, so they draft up to 64
SPEC_DISABLE_BY_BATCH_SIZE = 56
SPEC_DISABLE_BY_BATCH_SIZE_CHAINED = 65
BUNDLED_MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "configs", "default-model")


def _f(default, help: str, choices=None):
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class ServerArgs:
    model_path: str | None = _f(None, "Checkpoint directory (HF layout). Default: the bundled default model "
                                 "(configs/default-model).")
    tokenizer_path: str | None = _f(None, "Tokenizer directory. Default: the model path.")
    host: str = _f("127.0.0.1", "HTTP host to bind.")
    port: int = _f(30000, "HTTP port to bind.")
    dtype: str = _f("auto", "Weight and activation dtype. auto: the checkpoint's dtype on CUDA, "
                    "float32 on CPU. SGLang's half / float mean float16 / float32.",
                    ["auto", "float32", "bfloat16", "float16"])
    device: str = _f("auto", "cuda or cpu. auto: cuda when available.", ["auto", "cuda", "cpu"])
    context_length: int | None = _f(None, "Longest prompt + output in tokens. Default: the model's "
                                    "max_position_embeddings.")
    mem_fraction_static: float | None = _f(None, "Fraction of device memory for weights + KV pages + "
                                           "state slots. Default 0.85 on CUDA, 0.25 of free RAM on CPU.")
    max_running_requests: int | None = _f(None, "State slots = most requests running at once. Default: "
                                          "from the memory budget (at most 256 on CUDA, 32 on CPU).")
    max_total_tokens: int | None = _f(None, "Cap on KV-cache tokens over all requests. Default: all the "
                                      "budget left after state slots.")
    chunked_prefill_size: int = _f(8192, "Most prompt tokens computed in one step; longer prompts are "
                                   "split into chunks. -1 disables chunking.")
    page_size: int = _f(16, "Tokens per KV-cache page.")
    attention_backend: str = _f("auto", "Full-attention kernels. auto: the fastest available on the device "
                                "(triton on CUDA, torch on CPU). SGLang's torch_native means torch; flashinfer "
                                "and fa3 are not built here and mean auto (the start-up log names the choice).",
                                ["auto", "torch", "triton", "vllm"])
    linear_attn_backend: str = _f("auto", "Recurrent-layer kernels (GDN, Mamba2, Mamba-1, conv1d). auto: "
                                  "triton on CUDA, torch on CPU.", ["auto", "torch", "triton"])
    moe_runner_backend: str = _f("auto", "Fused MoE kernels. auto: triton on CUDA, torch on CPU.",
                                 ["auto", "torch", "triton"])
    mamba_ssm_dtype: str = _f("float32", "dtype of recurrent (SSM / GDN) states.",
                              ["float32", "bfloat16", "float16"])
    disable_overlap_schedule: bool = _f(False, "Do not overlap the host's work for the next decode step with the "
                                        "device's work on the current one (overlap applies to decode batches "
                                        "without logprobs, penalties or min_new_tokens).")
    disable_cuda_graph: bool = _f(False, "Run every step eagerly instead of replaying captured CUDA graphs.")
    cuda_graph_max_tokens: int = _f(2048, "Largest extend / prefill step (in tokens) replayed from a CUDA graph; "
                                    "larger steps run eagerly (snapshot cuts inside a prompt are graph inputs). "
                                    "0: extend steps always run eagerly.")
    cuda_graph_max_bs: int | None = _f(None, "Largest decode batch captured in a CUDA graph (larger batches run "
                                       "eagerly). Default: max_running_requests, at most 256.")
    skip_tokenizer_init: bool = _f(False, "Load no tokenizer: requests must send input_ids; outputs carry ids "
                                   "and empty text.")
    load_format: str = _f("auto", "auto/safetensors: read the checkpoint; dummy: random weights of the "
                          "real shapes from config.json alone.", ["auto", "safetensors", "dummy"])
    tp_size: int = _f(1, "Tensor-parallel size: ranks (one process and one GPU each) that split every layer's "
                      "heads; head counts that do not divide are refused at start-up.")
    ep_size: int = _f(1, "Expert-parallel size: 1 (every routed expert's intermediate size splits over the "
                      "--tp-size ranks) or --tp-size (each rank holds num_experts / tp whole experts; the shared "
                      "expert and the other layers stay tensor-parallel).")
    dp_size: int = _f(1, "Data-parallel replicas; only 1 is supported (run one server per GPU behind a load "
                      "balancer).")
    quantization: str | None = _f(None, "Weight quantization. fp8: quantize an unquantized checkpoint's linear "
                                  "layers to e4m3 with 128x128 block scales at load. Default: as the checkpoint "
                                  "stores them (FP8 checkpoints in the DeepSeek/Qwen block layout are read "
                                  "as such).", ["fp8"])
    enable_fp8_experts: bool = _f(False, "With an FP8 checkpoint or --quantization fp8: keep the routed MoE "
                                  "experts in e4m3 with 128x128 block scales too (halving their memory) and run "
                                  "the fused MoE on them, weight-only. Off: FP8 experts are dequantized into "
                                  "--dtype. Experimental: not yet run on a GPU.")
    kv_cache_dtype: str = _f("auto", "KV-cache dtype. Only auto yet: the KV cache is kept in the model dtype.")
    max_prefill_tokens: int | None = _f(None, "Most prompt tokens computed in one step over all requests. One "
                                        "budget serves this and --chunked-prefill-size here: the smaller wins.")
    trust_remote_code: bool = _f(False, "Accepted for compatibility with SGLang's commands. No remote code ever "
                                 "runs here: every model is built from this package's own implementation.")
    enable_metrics: bool = _f(False, "Accepted for compatibility with SGLang's commands: /metrics is always on.")
    # ---- prefix cache (radix tree over KV pages + recurrent-state snapshots) ----
    disable_radix_cache: bool = _f(False, "Do not reuse cached prompt prefixes (every prompt is computed from "
                                   "token 0).")
    max_mamba_cache_size: int | None = _f(None, "Recurrent-state slots in all: running requests plus prefix-cache "
                                          "snapshots. Default: from --mamba-full-memory-ratio.")
    mamba_full_memory_ratio: float = _f(0.9, "Prefix-cache snapshot memory over KV memory, splitting what the "
                                        "running requests' state slots leave, when sizing the snapshots by default.")
    snapshot_interval: int | None = _f(None, "Snapshot the recurrent state every this many tokens inside a prompt "
                                       "(written by the prefill kernels). Default: at 64, 96, 128, 192, then "
                                       "four a doubling (256, 320, 384, 448, 512, 640, ...).")
    schedule_policy: str = _f("lpm", "Order of waiting requests: lpm = longest cached prefix first (with the "
                              "prefix cache), fcfs = arrival order.", ["lpm", "fcfs"])
    # ---- speculative decoding (the model's own MTP layer drafts, the model verifies) ----
    speculative_algorithm: str | None = _f(None, "Speculative decoding: NEXTN (or EAGLE, as SGLang resolves it for a "
                                           "model with an MTP layer) drafts with the checkpoint's `mtp.*` layer "
                                           "(Qwen3.5, Qwen3-Next). Greedy requests take drafts; others decode as "
                                           "usual in the same steps.", ["NEXTN", "EAGLE"])
    speculative_num_steps: int = _f(3, "Draft tokens proposed per request and step (the MTP layer run this often).")
    speculative_eagle_topk: int = _f(1, "Draft branches per step: only 1 (a chain; tree drafting is not built).")
    speculative_num_draft_tokens: int | None = _f(None, "Tokens verified per request and step: num_steps + 1 "
                                                  "(the only value a chain allows). Default: that.")
    speculative_rollback: str = _f("snapshots", "How a verify step rolls back the gated-delta-rule state: "
                                   "'snapshots' writes the state after each draft and copies the kept one back; "
                                   "'replay' writes none and runs the kept tokens again from the untouched slot "
                                   "(less device time in its kernels from about 16 rows, yet slower end to end: "
                                   "1.08x plain decoding against 1.29x at 16 requests on one H100).",
                                   ["snapshots", "replay"])
    disable_speculative_overlap: bool = _f(False, "Run every verify step on the host path (the host reads each "
                                           "iteration's accepted tokens before the next). By default, verify steps "
                                           "whose rows have no grammar, logprobs, logit adjustments or seed of "
                                           "their own run as chained iterations beside the overlap schedule: "
                                           "verify, accept (speculative sampling for sampled rows), rollback and "
                                           "the drafts on the device, the next iteration launched before the host "
                                           "reads this one (runner/spec_chain.py; one CUDA graph per row count). "
                                           "--disable-overlap-schedule turns them off too.")
    speculative_disable_by_batch_size: int | None = _f(None, "While this many requests or more run or wait (up to "
                                                       "--max-running-requests), decode steps run without drafts "
                                                       "(plain decode steps, overlapped unless "
                                                       "--disable-overlap-schedule), as vLLM's option of this name: "
                                                       "at high concurrency a verify step costs more than its extra "
                                                       "tokens give. 0: never. Default: 65 with chained iterations "
                                                       "(they gain up to 64 requests, the most measured), 56 on the "
                                                       "host path (its measured crossover; bench/README.md).")
    speculative_token_map: str | None = _f(None, "The drafts' small vocabulary (FR-Spec): a file of frequent token "
                                           "ids (torch.save of a list or 1-D tensor, as SGLang reads it, or a JSON "
                                           "list; tools/token_map.py writes one). Drafts choose among these ids "
                                           "only, reading that many lm_head rows a draft pass instead of the whole "
                                           "vocabulary; verification keeps the whole vocabulary, so greedy output "
                                           "is unchanged. Default: the whole vocabulary.")
    # ---- structured outputs, tools, reasoning ----
    grammar_backend: str = _f("xgrammar", "Backend for regex / JSON schema / EBNF constrained decoding; none: "
                              "constrained requests are refused.", ["xgrammar", "none"])
    tool_call_parser: str | None = _f(None, "Parse tool calls out of chat completions in this format ("
                                      + ", ".join(f"{a} means {n}" for a, n in TOOL_PARSER_ALIASES.items())
                                      + "). Default: unset, tool calls stay in the content.",
                                      [*TOOL_PARSERS, *TOOL_PARSER_ALIASES])
    reasoning_parser: str | None = _f(None, "Split reasoning_content from content in chat completions. Default: "
                                      "unset, reasoning stays in the content.", list(REASONING_PARSERS))
    chat_template: str | None = _f(None, "Chat template: a Jinja file used instead of the tokenizer's. Default: "
                                   "the tokenizer's own template.")
    served_model_name: str | None = _f(None, "Model name reported by the API (/v1/models, responses, metrics). "
                                       "Default: the model folder's name (the model path's last part).")
    random_seed: int | None = _f(None, "Seed for dummy weights and unseeded sampling.")
    log_level: str = _f("info", "Logging level.", ["debug", "info", "warning", "error", "critical"])
    decode_log_interval: int = _f(40, "Log a 'Decode batch.' line every this many decode steps (at info level).")
    enable_access_log: bool = _f(False, "Log one line per HTTP request (uvicorn's access log, at info level).")
    api_key: str | None = _f(None, "If set, HTTP requests must send 'Authorization: Bearer <key>'.")
    allowed_origins: str | None = _f(None, "Comma-separated origins that browsers may call the API from (CORS), "
                                     "or '*' for any. Default: none (no CORS headers).")

    @property
    def chains_verify_steps(self) -> bool:
        """Whether verify steps run as chained iterations (they need the overlap schedule)."""
        return not (self.disable_speculative_overlap or self.disable_overlap_schedule)

    def resolved(self) -> ServerArgs:
        """A copy with every 'auto' / None default and every SGLang spelling replaced by its concrete
        value. Refuses, before any heavy work, what cannot run here, naming what to use instead."""
        import torch

        from hybrid_sgl.layers.backends import check_backend_device

        self.check()
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda, but CUDA is not available on this machine: use --device cpu (or auto)")
        on_gpu = device == "cuda"
        attention = _sglang_attention_backend(self.attention_backend, device)
        for flag, name in (("--attention-backend", attention), ("--linear-attn-backend", self.linear_attn_backend),
                           ("--moe-runner-backend", self.moe_runner_backend)):
            check_backend_device(flag, name, device)
        model_path = self.model_path or BUNDLED_MODEL
        fp8_weights = _check_checkpoint(model_path, self.load_format) or self.quantization == "fp8"
        if self.enable_fp8_experts and not fp8_weights:
            raise ValueError("--enable-fp8-experts needs FP8 weights: an FP8 checkpoint, or --quantization fp8")
        if self.tp_size > 1:
            _check_tensor_parallel(model_path, self.tp_size, device, self.ep_size > 1)
        chunk = self.chunked_prefill_size
        if self.max_prefill_tokens is not None:
            chunk = min(chunk, self.max_prefill_tokens)
        return dataclasses.replace(
            self,
            model_path=model_path,
            tokenizer_path=self.tokenizer_path or model_path,
            device=device,
            dtype=DTYPE_ALIASES.get(self.dtype, self.dtype),
            attention_backend=attention,
            chunked_prefill_size=chunk,
            mem_fraction_static=self.mem_fraction_static or (0.85 if on_gpu else 0.25),
            served_model_name=self.served_model_name or os.path.basename(os.path.normpath(model_path)),
            speculative_num_draft_tokens=None if self.speculative_algorithm is None
            else self.speculative_num_draft_tokens or self.speculative_num_steps + 1,
            speculative_disable_by_batch_size=_spec_batch_limit(self),
        )

    def check(self) -> None:
        """Refuse (ValueError naming the flag) every value that cannot start a working server and needs no
        model to tell: choices, ranges, features SGLang has and this runtime does not, the chat template.
        resolved() runs it first; the launcher runs it before it binds the port."""
        if self.quantization not in (None, "fp8"):
            raise ValueError(f"--quantization {self.quantization}: only fp8 is supported (e4m3 weights, 128x128 block "
                             "scales); use --quantization fp8, or serve the unquantized checkpoint without "
                             "--quantization")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            low = AT_LEAST.get(f.name)
            if low is not None and value is not None and value < low:
                raise ValueError(f"{_flag(f.name)} must be >= {low}, got {value}")
            allowed = _allowed_values(f)
            if allowed is not None and value is not None and value not in allowed:
                raise ValueError(f"{_flag(f.name)} {value}: choose one of {', '.join(allowed)}")
        if self.port > 65535:
            raise ValueError(f"--port must be <= 65535, got {self.port}")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static <= 1:
            raise ValueError(f"--mem-fraction-static is a fraction of device memory and must lie in (0, 1], got "
                             f"{self.mem_fraction_static}")
        if not self.mamba_full_memory_ratio > 0:
            raise ValueError(f"--mamba-full-memory-ratio must be > 0, got {self.mamba_full_memory_ratio}")
        if self.chunked_prefill_size == 0 or self.chunked_prefill_size < -1:
            raise ValueError(f"--chunked-prefill-size must be positive or -1 (no chunking), got "
                             f"{self.chunked_prefill_size}")
        if self.ep_size not in (1, self.tp_size):
            raise ValueError(f"--ep-size {self.ep_size} with --tp-size {self.tp_size}: expert parallelism runs over "
                             "the tensor-parallel ranks; use --ep-size 1 or --ep-size equal to --tp-size")
        if self.dp_size != 1:
            raise ValueError(f"--dp-size {self.dp_size}: data parallelism is not supported; use --dp-size 1 and run "
                             "one server per GPU (CUDA_VISIBLE_DEVICES, its own --port) behind a load balancer")
        if self.kv_cache_dtype != "auto":
            raise ValueError(f"--kv-cache-dtype {self.kv_cache_dtype}: the KV cache is kept in the model dtype; use "
                             "--kv-cache-dtype auto (a bfloat16 / float16 --dtype gives a 2-byte cache)")
        if self.max_prefill_tokens is not None and self.chunked_prefill_size == -1:
            raise ValueError(f"--max-prefill-tokens {self.max_prefill_tokens} caps a step by chunking long prompts, "
                             "but --chunked-prefill-size -1 turns chunking off: drop one of the two")
        if self.max_total_tokens is not None and self.max_total_tokens < self.page_size:
            raise ValueError(f"--max-total-tokens {self.max_total_tokens} is less than one KV page "
                             f"(--page-size {self.page_size}): use --max-total-tokens {self.page_size} or more, "
                             "or a smaller --page-size")
        _check_speculative(self)
        if self.chat_template is not None:
            tokenizer = None if self.skip_tokenizer_init else self.tokenizer_path or self.model_path or BUNDLED_MODEL
            _check_chat_template(self.chat_template, tokenizer)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(ServerArgs):
            flags = ["--" + f.name.replace("_", "-"), *FLAG_ALIASES.get(f.name, ())]
            if f.type == "bool":  # a bare flag switches it on, as in SGLang
                parser.add_argument(*flags, dest=f.name, action="store_true", default=f.default, help=_help(f))
                continue
            # choices are shown, and checked by check(), which names what to use instead
            allowed = _allowed_values(f)
            parser.add_argument(*flags, dest=f.name, type=_cli_type(f), default=f.default, help=_help(f),
                                metavar="{" + ",".join(allowed) + "}" if allowed else None)

    @staticmethod
    def from_cli_args(args: argparse.Namespace) -> ServerArgs:
        return ServerArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerArgs)})


# SGLang's other spellings, as a table: extra flag names for a field, and SGLang's values for a field
# that names them differently here (resolved() maps them; attention backends by device, with a log line).
FLAG_ALIASES = {"model_path": ("--model",), "tp_size": ("--tensor-parallel-size", "--tp"),
                "dp_size": ("--data-parallel-size", "--dp"), "ep_size": ("--expert-parallel-size", "--ep"),
                "cuda_graph_max_tokens": ("--piecewise-cuda-graph-max-tokens",)}
DTYPE_ALIASES = {"half": "float16", "float": "float32"}
ATTENTION_ALIASES = {"torch_native": "torch", "flashinfer": "auto", "fa3": "auto"}
VALUE_ALIASES = {"dtype": DTYPE_ALIASES, "attention_backend": ATTENTION_ALIASES}
# counts (and the port) below which no request can run; None (the default) is always allowed
AT_LEAST = {"port": 1, "context_length": 1, "max_running_requests": 1, "max_total_tokens": 1, "page_size": 1,
            "cuda_graph_max_tokens": 0, "cuda_graph_max_bs": 1, "tp_size": 1, "ep_size": 1, "dp_size": 1,
            "max_prefill_tokens": 1, "max_mamba_cache_size": 1, "snapshot_interval": 1, "decode_log_interval": 1}
# what a chat template must render: one of these two-message conversations (with add_generation_prompt)
TEMPLATE_PROBES = (([{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"}], True),
                   ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], False))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _allowed_values(f: dataclasses.Field) -> list[str] | None:
    """A field's choices with SGLang's spellings of them, or None when any value parses."""
    choices = f.metadata.get("choices")
    return None if choices is None else [*choices, *VALUE_ALIASES.get(f.name, ())]


def _help(f: dataclasses.Field) -> str:
    """The field's help, ending with its default where the text does not already say it."""
    text = f.metadata["help"]
    if "Default" in text:
        return text
    if f.default is None:
        shown = "unset"
    elif isinstance(f.default, bool):
        shown = "on" if f.default else "off"
    else:
        shown = f.default
    return f"{text} Default: {shown}."


@functools.lru_cache(maxsize=8)
def _check_chat_template(path: str, tokenizer_path: str | None) -> None:
    """The --chat-template file reads and renders a two-message conversation with the tokenizer the server
    will load (checked once a process for a given pair)."""
    try:
        with open(path) as f:
            template = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ValueError(f"--chat-template {path}: cannot read the template file ({reason})") from None
    if tokenizer_path is None or not os.path.isdir(tokenizer_path):
        return  # no tokenizer to render with: no chat requests, or a start that fails on the path itself
    from hybrid_sgl.tokenizer import load_tokenizer

    try:
        tokenizer = load_tokenizer(tokenizer_path)
    except Exception:  # the start-up names an unloadable tokenizer itself
        return
    errors = []
    for messages, add_prompt in TEMPLATE_PROBES:
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_prompt,
                                                 chat_template=template)
        except Exception as e:  # jinja syntax, undefined names, raise_exception: all the template's fault
            errors.append(" ".join(str(e).split()) or type(e).__name__)
            continue
        if text.strip():
            return
        errors.append("it renders an empty prompt")
    raise ValueError(f"--chat-template {path}: the template renders neither a system + user nor a user + assistant "
                     f"conversation ({errors[0]})")


def _spec_batch_limit(args: ServerArgs) -> int:
    """--speculative-disable-by-batch-size, or its default for the path verify steps take."""
    if args.speculative_disable_by_batch_size is not None:
        return args.speculative_disable_by_batch_size
    return SPEC_DISABLE_BY_BATCH_SIZE_CHAINED if args.chains_verify_steps else SPEC_DISABLE_BY_BATCH_SIZE


def _check_speculative(args: ServerArgs) -> None:
    """The speculative-decoding flags this engine can run (a chain of MTP drafts), before any heavy work."""
    if args.speculative_algorithm is None:
        if args.speculative_token_map is not None:
            raise ValueError("--speculative-token-map narrows the drafts' vocabulary and needs "
                             "--speculative-algorithm NEXTN (or EAGLE)")
        return
    if args.speculative_token_map is not None and not os.path.isfile(args.speculative_token_map):
        raise ValueError(f"--speculative-token-map {args.speculative_token_map}: no such file (a local .pt or .json "
                         "list of token ids)")
    if args.speculative_disable_by_batch_size is not None and args.speculative_disable_by_batch_size < 0:
        raise ValueError(f"--speculative-disable-by-batch-size must be >= 0 (0: never), got "
                         f"{args.speculative_disable_by_batch_size}")
    if args.speculative_eagle_topk != 1:
        raise ValueError(f"--speculative-eagle-topk {args.speculative_eagle_topk}: only 1 (a chain of drafts) is "
                         "supported; tree drafting is not built")
    if not 1 <= args.speculative_num_steps <= 8:
        raise ValueError(f"--speculative-num-steps must lie in [1, 8], got {args.speculative_num_steps}")
    draft = args.speculative_num_draft_tokens
    if draft is not None and draft != args.speculative_num_steps + 1:
        raise ValueError(f"--speculative-num-draft-tokens {draft}: a chain of {args.speculative_num_steps} drafts "
                         f"verifies {args.speculative_num_steps + 1} tokens; use that or leave it unset")
    if args.tp_size > 1:
        raise ValueError("--speculative-algorithm with --tp-size > 1 is not supported yet: use --tp-size 1")
    if args.speculative_rollback == "replay" and args.speculative_num_steps + 1 > _short_row_tokens():
        raise ValueError(f"--speculative-rollback replay runs verify steps of at most {_short_row_tokens()} tokens a "
                         f"request: use --speculative-num-steps {_short_row_tokens() - 1} or fewer")


def _short_row_tokens() -> int:
    from hybrid_sgl.batch import SHORT_ROW_TOKENS  # (torch: imported only when asked)

    return SHORT_ROW_TOKENS


def _sglang_attention_backend(name: str, device: str) -> str:
    if name not in ATTENTION_ALIASES:
        return name
    from hybrid_sgl.layers.backends import PREFERENCE

    ours = ATTENTION_ALIASES[name]
    if ours == "auto":
        ours = PREFERENCE[device][0]
    logger.info("--attention-backend %s is SGLang's name; the closest backend here on %s: %s", name, device, ours)
    return ours


def _check_checkpoint(model_path: str, load_format: str) -> dict | None:
    """The model folder exists and holds weights (unless dummy ones were asked for), quantized in a format
    we serve if at all; returns its quantization_config."""
    if not os.path.isfile(os.path.join(model_path, "config.json")):
        hint = ("" if os.path.isdir(model_path) else
                f"; nothing is downloaded here: fetch the model first (huggingface-cli download {model_path} "
                "--local-dir DIR) and pass --model-path DIR")
        raise FileNotFoundError(f"no config.json in {model_path}{hint}")
    with open(os.path.join(model_path, "config.json")) as f:
        hf = json.load(f)
    from hybrid_sgl.config import quantization_config_of

    quant = quantization_config_of(hf)
    if quant:
        from hybrid_sgl.layers.quantization import check_quantization_config

        try:
            check_quantization_config(quant)
        except ValueError as e:
            raise ValueError(f"{model_path} holds quantized weights ({quant.get('quant_method', '?')}): {e}") from None
    if load_format != "dummy":
        from hybrid_sgl.models.loader import checkpoint_files

        checkpoint_files(model_path)
    return quant


def _check_tensor_parallel(model_path: str, size: int, device: str, expert_parallel: bool) -> None:
    """The model's family and head counts (and experts) split over `size` ranks, and there are `size` GPUs."""
    import torch

    from hybrid_sgl.config import ModelConfig
    from hybrid_sgl.models.registry import check_tensor_parallel

    if device == "cuda" and torch.cuda.device_count() < size:
        raise ValueError(f"--tp-size {size} needs {size} GPUs; this machine has {torch.cuda.device_count()}: "
                         "lower --tp-size")
    check_tensor_parallel(ModelConfig.from_hf(model_path), size, expert_parallel)


def _cli_type(f: dataclasses.Field):
    text = str(f.type)
    if "int" in text:
        return int
    if "float" in text:
        return float
    return str
