"""ServerArgs: every knob of the runtime in one frozen dataclass.

Flag names match SGLang's where they overlap; `--help` text comes from each field's metadata
and argparse defaults are read from the dataclass. "auto" values are resolved once by
`resolved()` before anything uses them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field

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
                    "float32 on CPU.", ["auto", "float32", "bfloat16", "float16"])
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
                                "(triton on CUDA, torch on CPU).",
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
    disable_cuda_graph: bool = _f(False, "Run decode eagerly instead of replaying captured CUDA graphs.")
    cuda_graph_max_bs: int | None = _f(None, "Largest decode batch captured in a CUDA graph (larger batches run "
                                       "eagerly). Default: max_running_requests, at most 256.")
    skip_tokenizer_init: bool = _f(False, "Load no tokenizer: requests must send input_ids; outputs carry ids "
                                   "and empty text.")
    load_format: str = _f("auto", "auto/safetensors: read the checkpoint; dummy: random weights of the "
                          "real shapes from config.json alone.", ["auto", "safetensors", "dummy"])
    tp_size: int = _f(1, "Tensor-parallel size (only 1 is supported yet).")
    # ---- prefix cache (radix tree over KV pages + recurrent-state snapshots) ----
    disable_radix_cache: bool = _f(False, "Do not reuse cached prompt prefixes (every prompt is computed from "
                                   "token 0).")
    max_mamba_cache_size: int | None = _f(None, "Recurrent-state slots in all: running requests plus prefix-cache "
                                          "snapshots. Default: from --mamba-full-memory-ratio.")
    mamba_full_memory_ratio: float = _f(0.9, "Recurrent-state memory (running slots plus snapshots) over KV "
                                        "memory when sizing the snapshot pool by default.")
    snapshot_interval: int | None = _f(None, "Snapshot the recurrent state every this many prompt tokens inside a "
                                       "long prompt (a multiple of --page-size). Default: chosen from the state "
                                       "size and the snapshot budget.")
    schedule_policy: str = _f("lpm", "Order of waiting requests: lpm = longest cached prefix first (with the "
                              "prefix cache), fcfs = arrival order.", ["lpm", "fcfs"])
    # ---- structured outputs, tools, reasoning ----
    grammar_backend: str = _f("xgrammar", "Backend for regex / JSON schema / EBNF constrained decoding.",
                              ["xgrammar", "llguidance", "none"])
    tool_call_parser: str | None = _f(None, "Parse tool calls out of chat completions in this format.")
    reasoning_parser: str | None = _f(None, "Split reasoning_content from content in chat completions.")
    chat_template: str | None = _f(None, "Chat template: a Jinja file, or the checkpoint's when unset.")
    served_model_name: str | None = _f(None, "Model name reported by the API. Default: the model path.")
    random_seed: int | None = _f(None, "Seed for dummy weights and unseeded sampling.")
    log_level: str = _f("info", "Logging level.", ["debug", "info", "warning", "error"])
    api_key: str | None = _f(None, "If set, HTTP requests must send 'Authorization: Bearer <key>'.")
    allowed_origins: str | None = _f(None, "Comma-separated origins that browsers may call the API from (CORS), "
                                     "or '*' for any. Default: none (no CORS headers).")

    def resolved(self) -> ServerArgs:
        """A copy with every 'auto' / None default replaced by its concrete value."""
        import torch

        if self.tp_size != 1:
            raise ValueError(f"tp_size={self.tp_size}: tensor parallelism is not supported yet; use 1")
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.chunked_prefill_size == 0 or self.chunked_prefill_size < -1:
            raise ValueError(f"chunked_prefill_size must be positive or -1, got {self.chunked_prefill_size}")
        device = self.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device=cuda but CUDA is not available on this machine")
        on_gpu = device == "cuda"
        model_path = self.model_path or BUNDLED_MODEL
        return dataclasses.replace(
            self,
            model_path=model_path,
            tokenizer_path=self.tokenizer_path or model_path,
            device=device,
            mem_fraction_static=self.mem_fraction_static or (0.85 if on_gpu else 0.25),
            served_model_name=self.served_model_name or model_path,
        )

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        for f in dataclasses.fields(ServerArgs):
            flag = "--" + f.name.replace("_", "-")
            if f.type == "bool":  # a bare flag switches it on, as in SGLang
                parser.add_argument(flag, action="store_true", default=f.default, help=f.metadata["help"])
                continue
            parser.add_argument(flag, type=_cli_type(f), default=f.default, help=f.metadata["help"],
                                choices=f.metadata.get("choices"))

    @staticmethod
    def from_cli_args(args: argparse.Namespace) -> ServerArgs:
        return ServerArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerArgs)})


def _cli_type(f: dataclasses.Field):
    text = str(f.type)
    if "int" in text:
        return int
    if "float" in text:
        return float
    return str
