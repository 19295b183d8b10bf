"""Question: what does the conv1d of a speculative verify step cost with the short-row kernel
(causal_conv1d_rows, token by token) against the prefill kernel's 64-token tiles, at the 9B shape?

    PYTHONPATH=$PWD python bench/conv_rows.py

Qwen3.5-9B's GDN conv: 8,192 channels, width 4, bf16. A verify row is 4 tokens with snapshot cuts after
tokens 1, 2, 3 (16 cut slots a row, as the step builder lays them out). Both kernels run on the same
inputs; outputs, final states and snapshots are compared, then each is timed with CUDA events (median of
5 runs of 100 calls). Reported per call and for the 24 GDN layers of a step.
"""

import statistics

import torch

from triton_kernels.causal_conv1d import causal_conv1d_prefill, causal_conv1d_rows

D, W, RUN, CUTS, LAYERS = 8192, 4, 4, 16, 24


def inputs(n: int, dev) -> dict:
    g = torch.Generator(device="cpu").manual_seed(n)
    x = torch.randn(n * RUN, D, generator=g).to(dev, torch.bfloat16)
    weight = torch.randn(D, W, generator=g).to(dev, torch.bfloat16)
    states = torch.randn(n * 4 + 1, W - 1, D, generator=g).to(dev, torch.bfloat16)
    snap_pos = torch.full((n, CUTS), -1, dtype=torch.int32)
    snap_pos[:, :3] = torch.tensor([1, 2, 3], dtype=torch.int32)
    snap_slots = torch.full((n, CUTS), -1, dtype=torch.int32)
    snap_slots[:, :3] = n + torch.arange(3 * n, dtype=torch.int32).view(n, 3)
    return dict(x=x, weight=weight, bias=None, conv_states=states,
                cu_seqlens=torch.arange(0, n * RUN + 1, RUN, dtype=torch.int32, device=dev),
                state_slots=torch.arange(n, dtype=torch.int32, device=dev),
                has_initial_state=torch.ones(n, dtype=torch.bool, device=dev),
                snap_pos=snap_pos.to(dev), snap_slots=snap_slots.to(dev))


def timed(fn, reps: int = 100) -> float:
    runs = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        runs.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(runs)


def main() -> None:
    dev = torch.device("cuda")
    print(f"# conv1d of a verify step (4 tokens a row, 3 cuts), {torch.cuda.get_device_name()}\n")
    print("| rows | prefill kernel us | short-row kernel us | ratio | 24 layers: prefill / short-row ms | equal |")
    print("|---|---|---|---|---|---|")
    for n in (1, 32, 64):
        a, b = inputs(n, dev), inputs(n, dev)
        ya = causal_conv1d_prefill(**a)
        yb = causal_conv1d_rows(**b, pad_slot=-1)
        equal = torch.equal(ya, yb) and torch.equal(a["conv_states"], b["conv_states"])
        close = equal or (torch.allclose(ya.float(), yb.float(), atol=1e-2, rtol=1e-2)
                          and torch.equal(a["conv_states"], b["conv_states"]))
        t_prefill = timed(lambda a=a: causal_conv1d_prefill(**a))
        t_rows = timed(lambda b=b: causal_conv1d_rows(**b, pad_slot=-1))
        print(f"| {n} | {t_prefill:.1f} | {t_rows:.1f} | {t_prefill / t_rows:.2f}x | "
              f"{t_prefill * LAYERS / 1e3:.3f} / {t_rows * LAYERS / 1e3:.3f} | "
              f"{'bitwise' if equal else 'within bf16 rounding' if close else 'NO'} |")


if __name__ == "__main__":
    main()
