"""Question: what does one sampling step cost on the device (the served draw against the torch path and
greedy's argmax), and which of its parts costs it?

One sampling step at the 9B vocabulary: the Triton draw against the torch path and against greedy's
argmax, at batch 1 / 32 / 64, with the parts of the Triton draw timed alone.

    PYTHONPATH=$PWD python bench/sampler_kernels.py [--vocab 248320] [--batch 1 32 64]

Device time: the calls are queued behind a 50 ms sleep kernel, so the GPU runs them back to back and
the host's launch time does not count (in serving, the overlap schedule launches sampling while the
forward still runs, so device time is what a step pays). "served" is the kernel path as runner/sampler.py's
settings are; the next columns change one setting: the top_k candidates by torch.topk or through the group
maxima (top_logits) at every batch size, and 16 race candidates for top_p rows without top_k instead of
TOP_P_RACE_CANDIDATES (--scale 0.5 gives flat rows, whose top_p boundary lies past any few hundred tokens).
The bytes column is the least the kernel path moves: the logits read three times (row statistics,
torch.topk's candidates, draw), the noise written and read; % copy is against a device-to-device copy in the same
run.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hybrid_sgl.runner import sampler as sampler_module  # noqa: E402
from hybrid_sgl.runner.sampler import Sampler  # noqa: E402
from hybrid_sgl.sampling_params import SamplingParams  # noqa: E402
from hybrid_sgl.scheduler.request import Req  # noqa: E402
from triton_kernels.sampling import GROUP, draw_kept, row_stats, top_logits  # noqa: E402

KNOBS = {
    "temperature 0.7": {"temperature": 0.7},
    "+ top_k 50, top_p 0.9": {"temperature": 0.7, "top_k": 50, "top_p": 0.9},
    "+ top_p 0.9 only": {"temperature": 0.7, "top_p": 0.9},
    "all four": {"temperature": 0.7, "top_k": 50, "top_p": 0.9, "min_p": 0.05},
}


def time_ms(fn, calls: int = 20) -> float:
    """Device ms per call of fn, queued behind a sleep."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(100_000_000)  # ~50 ms at 2 GHz: longer than the host takes to queue the calls
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * nbytes / time_ms(lambda: dst.copy_(src)) / 1e9  # TB/s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=248_320)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32, 64])
    p.add_argument("--scale", type=float, default=3.0, help="logit scale: 3 is peaked (top_p within the candidates)")
    a = p.parse_args()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw:.2f} TB/s, vocabulary {a.vocab}, logits ~ N(0, {a.scale}^2)\n")
    print("| batch | knobs | greedy argmax ms | torch path ms | served ms | served / torch | "
          + " | ".join(f"{name} ms" for name in VARIANTS)
          + " | row_stats ms | topk ms | top_logits ms | noise ms | draw ms | bytes MB | served % copy |")
    print("|---|---|---|---|---|---|" + "---|" * len(VARIANTS) + "---|---|---|---|---|---|---|")
    for batch in a.batch:
        logits = torch.randn(batch, a.vocab, device="cuda") * a.scale
        greedy = time_ms(lambda: logits.argmax(dim=-1))  # noqa: B023 (timed before the loop moves on)
        for name, knobs in KNOBS.items():
            print(row(logits, name, knobs, greedy, bw))


# the served sampler with one of runner/sampler.py's settings changed
VARIANTS = {"torch.topk candidates": {"GROUP_CANDIDATES_MIN_ROWS": 1 << 30},
            "group candidates": {"GROUP_CANDIDATES_MIN_ROWS": 1},
            "race of 16": {"TOP_P_RACE_CANDIDATES": 16}}


def switched(sampler: Sampler, setting: dict, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
    """sampler's draw with runner/sampler.py's module settings changed as `setting` says."""
    served = {name: getattr(sampler_module, name) for name in setting}
    for name, value in setting.items():
        setattr(sampler_module, name, value)
    try:
        return sampler(logits, reqs, ())
    finally:
        for name, value in served.items():
            setattr(sampler_module, name, value)


def row(logits: torch.Tensor, name: str, knobs: dict, greedy: float, bw: float) -> str:
    batch = logits.shape[0]
    reqs = [Req(rid=str(i), prompt_ids=[0], params=SamplingParams.from_dict(knobs)) for i in range(batch)]
    torch_path, kernels = Sampler(kernels=False), Sampler(kernels=True)
    t_torch = time_ms(lambda: torch_path(logits, reqs, ()))
    t_kernels = time_ms(lambda: kernels(logits, reqs, ()))
    # each setting changed around the same Sampler, whose batch parameters stay built (a fresh Sampler per call
    # would copy them to the device each call, and that copy waits for the queue)
    t_variants = [time_ms(lambda v=v: switched(kernels, v, logits, reqs)) for v in VARIANTS.values()]
    t = torch.full((batch,), knobs["temperature"], device="cuda")
    m, _ = row_stats(logits=logits, temperature=t)
    t_stats = time_ms(lambda: row_stats(logits=logits, temperature=t))
    t_topk = time_ms(lambda: logits.topk(50, dim=-1)) if "top_k" in knobs else 0.0
    group_max = torch.empty(batch, -(-logits.shape[1] // GROUP), device="cuda")
    row_stats(logits=logits, temperature=t, group_max=group_max)
    t_top_logits = time_ms(lambda: top_logits(logits=logits, group_max=group_max, k=50)) if "top_k" in knobs else 0.0
    noise = torch.empty_like(logits)
    t_noise = time_ms(lambda: noise.exponential_())
    bound = torch.full((batch,), float("-inf"), device="cuda")
    need = torch.zeros(batch, dtype=torch.int64, device="cuda")
    zeros = torch.zeros(batch, device="cuda")
    t_draw = time_ms(lambda: draw_kept(logits=logits, noise=noise, temperature=t, row_max=m, bound=bound, need=need,
                                       min_p=zeros, ties=False))
    nbytes = 5 * logits.numel() * 4
    return (f"| {batch} | {name} | {greedy:.3f} | {t_torch:.3f} | {t_kernels:.3f} | {t_kernels / t_torch:.2f} | "
            + "".join(f"{t_v:.3f} | " for t_v in t_variants) + f"{t_stats:.3f} | {t_topk:.3f} | {t_top_logits:.3f} | "
            f"{t_noise:.3f} | {t_draw:.3f} | "
            f"{nbytes / 1e6:.0f} | "
            f"{100 * nbytes / (t_kernels * 1e-3) / (bw * 1e12):.0f} |")


if __name__ == "__main__":
    main()
