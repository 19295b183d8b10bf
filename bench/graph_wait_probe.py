"""Does a stream of our own, made with torch.cuda.Stream(), wait for work the caller's stream still has queued?
DecodeGraphs.capture() makes its warm-up stream wait for the caller's because the answer is no (2026-12-03 on the
H200). The caller's stream sleeps ~0.1 s, then zero-fills x; a new stream clones x at once. Stale (-1) values in
the clone mean the new stream did not wait. Run with the caller on the default stream, then on a stream of its own.

    PYTHONPATH=. python bench/graph_wait_probe.py
"""

import os

import torch


def probe(stream: torch.cuda.Stream, label: str) -> None:
    x = torch.full((1 << 20,), -1, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)
    x.zero_()
    with torch.cuda.stream(stream):
        y = x.clone()
    torch.cuda.synchronize()
    seen = "stale values (no implicit wait)" if (y == -1).any() else "the fill (it waited)"
    print(f"{label}: the new stream read {seen}")


def main() -> None:
    print("CUDA_MODULE_LOADING =", os.environ.get("CUDA_MODULE_LOADING"), "| current stream:",
          torch.cuda.current_stream(), "| torch", torch.__version__)
    torch.zeros(1, device="cuda").clone()  # load the fill and copy kernels first
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    probe(torch.cuda.Stream(), "torch.cuda.Stream()")
    side = torch.cuda.Stream()
    torch.cuda.set_stream(side)  # the caller on a non-default stream, as the engine's overlap thread may be
    probe(torch.cuda.Stream(), "caller on a side stream, torch.cuda.Stream()")
    torch.cuda.set_stream(torch.cuda.default_stream())


if __name__ == "__main__":
    main()
