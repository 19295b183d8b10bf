"""The anchor: HF transformers `generate` on the same config, random weights (`from_config`), same
dtype and device, in the same process as our runs (after our engine is freed).

Prefill = time to the first token of the batch (`max_new_tokens=1`); decode rate =
batch * (n - 1) / (t(n tokens) - t(1 token)), so the prefill cancels out. Greedy, no early stop.
"""

from __future__ import annotations

import importlib.util
import time

import torch

FAST_PATH_MODULES = ("fla", "causal_conv1d", "mamba_ssm")  # kernels HF's hybrid models use when importable


def unavailable_reason() -> str | None:
    """None when transformers can be imported, else why not."""
    try:
        import transformers  # noqa: F401
    except Exception as e:  # an ImportError, or a broken install
        return f"transformers is not importable ({type(e).__name__}: {e})"
    return None


def fast_paths() -> dict[str, bool]:
    return {name: importlib.util.find_spec(name) is not None for name in FAST_PATH_MODULES}


def _timed(fn, device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def run_hf(config_path: str, cases: list[tuple[int, int]], decode_tokens: int, dtype: torch.dtype,
           device: torch.device, prompts) -> dict:
    """cases: (batch, prompt length); prompts(batch, length, seed) -> token id lists.
    Returns {"version", "fast_paths", "cases": {f"{batch}x{prompt}": {...} or {"error": ...}}}."""
    import transformers as tf

    cfg = tf.AutoConfig.from_pretrained(config_path)
    with torch.device(device):
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0

    def generate(ids: torch.Tensor, n: int) -> None:
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=pad)

    out = {"version": tf.__version__, "fast_paths": fast_paths(), "class": type(model).__name__, "cases": {}}
    generate(torch.tensor(prompts(1, 16, 0), device=device), 2)  # warm-up
    for batch, length in cases:
        key = f"{batch}x{length}"
        ids = torch.tensor(prompts(batch, length, batch), device=device)
        try:
            generate(ids, 2)  # warm-up at this shape
            t1 = _timed(lambda: generate(ids, 1), device)  # noqa: B023
            tn = _timed(lambda: generate(ids, decode_tokens), device)  # noqa: B023
        except torch.OutOfMemoryError as e:
            out["cases"][key] = {"error": f"out of memory: {str(e).splitlines()[0]}"}
            torch.cuda.empty_cache()
            continue
        out["cases"][key] = {"prefill_s": t1, "prefill_tok_s": batch * length / t1,
                             "decode_tok_s": batch * (decode_tokens - 1) / (tn - t1),
                             "decode_tokens": decode_tokens}
    return out
