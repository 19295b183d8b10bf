"""Question: what does the host pay to queue a small host-to-device copy (a page-table row, an index)
while the device is busy, per way of making it?

    PYTHONPATH=$PWD python bench/h2d_copy.py [--n 2000]

Each way makes an int64/int32 tensor of 4 values on the host and queues its copy to the device, n times,
behind a queued device sleep long enough to keep the stream busy; the host time per copy is reported
and whether the host waited for the stream (wall >= the sleep).
"""

import argparse
import time

import torch


def ways(dev):
    dst = torch.zeros(4, dtype=torch.int32, device=dev)
    values = [1, 2, 3, 4]
    return {
        "pinned tensor a call, non_blocking": lambda: dst.copy_(torch.tensor(values, dtype=torch.int32,
                                                                            pin_memory=True), non_blocking=True),
        "pageable, non_blocking": lambda: dst.copy_(torch.tensor(values, dtype=torch.int32), non_blocking=True),
        "torch.tensor(device=cuda) (blocking)": lambda: torch.tensor(values, dtype=torch.int32, device=dev),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2000)
    a = p.parse_args()
    dev = torch.device("cuda")
    print(f"| way ({torch.cuda.get_device_name()}) | host us a copy | host waited for the stream |")
    print("|---|---|---|")
    for name, copy in ways(dev).items():
        for _ in range(50):
            copy()
        torch.cuda.synchronize()
        sleep_s = 0.5
        torch.cuda._sleep(int(sleep_s * 2e9))  # ~0.5 s of device time at ~2 GHz
        start = time.perf_counter()
        for _ in range(a.n):
            copy()
        host = time.perf_counter() - start
        torch.cuda.synchronize()
        print(f"| {name} | {host / a.n * 1e6:.1f} | {'yes' if host >= 0.9 * sleep_s else 'no'} |")


if __name__ == "__main__":
    main()
