"""Question: which way of rolling back the GDN state of a speculative verify step costs less device time at
the 9B shape: writing the state after each draft (snapshot rows, then one copy of the kept one) or keeping
the slot as a checkpoint and replaying the kept tokens from it (vLLM's ReplaySSM)?

    PYTHONPATH=$PWD python bench/verify_rollback.py [--batches 1,16,32,64] [--accept 0.81]

One GDN layer of Qwen3.5-9B (16 key heads, 32 value heads, K = V = 128, float32 states: 2 MiB a row),
verify rows of 4 tokens (the token and 3 drafts). Each row keeps m of its 4 tokens, m spread as the
forced-acceptance benchmark draws it (each draft kept with probability --accept until one is rejected,
then the model's own token; row i at the quantile (i + 0.5) / rows): the same m for both designs.
- snapshots (served now): gdn_rows writes the state after tokens 1, 2, 3 into three snapshot rows and the
  state after all 4 into the slot; rows that keep m < 4 copy snapshot row m - 1 into their slot.
- replay: gdn_rows with write_final=False reads the slot and writes nothing; the kept tokens' inputs are
  gathered into a packed buffer and gdn_rows runs them from the slot, writing it.
- replay in place: the same, but the replay reads the kept tokens where the verify step's inputs lie
  (gdn_rows(row_lens=kept)): one launch, no gathers.
All three end with the same slot states (checked). Each side is timed as CUDA-graph replays (fastest.graph_time),
so launches cost nothing; the conv1d state (48 KiB a row) is left out of both. Reported per layer and for
the 24 GDN layers of a step, beside the same kernel over one-token rows (what a decode step's rows cost).
"""

from __future__ import annotations

import argparse

import torch

from triton_kernels.fastest import graph_time
from triton_kernels.gdn_short_rows import gdn_rows

HK, HV, K, V, LAYERS, RUN = 16, 32, 128, 128, 24, 4


def kept_counts(n: int, accept: float) -> list[int]:
    """Tokens each of n rows keeps, at the quantiles (i + 0.5) / n of the kept count's distribution:
    P(m) = accept^(m-1) (1 - accept) for m < 4, P(4) = accept^3."""
    probs = [accept ** (m - 1) * (1 - accept) for m in range(1, RUN)] + [accept ** (RUN - 1)]
    out = []
    for i in range(n):
        q, m, cdf = (i + 0.5) / n, 1, probs[0]
        while cdf < q and m < RUN:
            cdf += probs[m]
            m += 1
        out.append(m)
    return out


def inputs(n: int, dev: torch.device) -> dict:
    g = torch.Generator(device="cpu").manual_seed(n)
    T = n * RUN
    proj = torch.randn(T, 2 * HK * K + HV * V + 2 * HV, generator=g).to(dev, torch.bfloat16)
    q, k, v, a, b = proj.split([HK * K, HK * K, HV * V, HV, HV], dim=-1)
    return dict(q=q.view(T, HK, K), k=k.view(T, HK, K), v=v.view(T, HV, V), a=a, b=b,
                A_log=torch.empty(HV).uniform_(-3, 1, generator=g).to(dev),
                dt_bias=torch.randn(HV, generator=g).to(dev))


def measure(n: int, accept: float, dev: torch.device) -> tuple[float, float, float, float, float]:
    """(mean kept tokens, snapshots us, replay us, replay-in-place us, us of n one-token rows) for one layer
    at n verify rows."""
    x = inputs(n, dev)
    kept = kept_counts(n, accept)
    states0 = torch.randn(4 * n + 1, HV, K, V, device=dev) * 0.1  # slots 0..n-1, snapshot rows n..4n-1
    slots = torch.arange(n, dtype=torch.int32, device=dev)
    rows = dict(cu_seqlens=torch.arange(0, n * RUN + 1, RUN, dtype=torch.int32, device=dev), state_slots=slots,
                has_initial_state=torch.ones(n, dtype=torch.bool, device=dev))
    snap_pos = torch.tensor([[1, 2, 3]] * n, dtype=torch.int32, device=dev)
    snap_slots = (n + torch.arange(3 * n, dtype=torch.int32, device=dev)).view(n, 3)
    partial = [i for i, m in enumerate(kept) if m < RUN]
    dst = torch.tensor(partial, dtype=torch.long, device=dev)
    src = torch.tensor([n + 3 * i + kept[i] - 1 for i in partial], dtype=torch.long, device=dev)
    gather = torch.tensor([i * RUN + t for i, m in enumerate(kept) for t in range(m)], dtype=torch.long,
                          device=dev)
    replay_rows = dict(state_slots=slots, has_initial_state=rows["has_initial_state"],
                       cu_seqlens=torch.tensor([0, *torch.tensor(kept).cumsum(0).tolist()], dtype=torch.int32,
                                               device=dev))
    kept_lens = torch.tensor(kept, dtype=torch.int32, device=dev)
    snap_states, replay_states, in_place_states = states0.clone(), states0.clone(), states0.clone()

    def snapshots():
        gdn_rows(**x, **rows, ssm_states=snap_states, snap_pos=snap_pos, snap_slots=snap_slots)
        if partial:
            snap_states.index_copy_(0, dst, snap_states.index_select(0, src))

    def replay():
        gdn_rows(**x, **rows, ssm_states=replay_states, write_final=False)
        picked = {name: x[name].index_select(0, gather) for name in ("q", "k", "v", "a", "b")}
        gdn_rows(**picked, A_log=x["A_log"], dt_bias=x["dt_bias"], **replay_rows, ssm_states=replay_states)

    def replay_in_place():
        gdn_rows(**x, **rows, ssm_states=in_place_states, write_final=False)
        gdn_rows(**x, **rows, ssm_states=in_place_states, row_lens=kept_lens)

    snapshots()
    replay()
    replay_in_place()
    torch.cuda.synchronize()
    for states in (replay_states, in_place_states):
        same = torch.allclose(snap_states[:n], states[:n], atol=1e-4, rtol=1e-4)
        assert same, f"rows {n}: the designs' slot states differ"
    one_token = {name: x[name][::RUN] for name in ("q", "k", "v", "a", "b")}
    one_rows = dict(rows, cu_seqlens=torch.arange(n + 1, dtype=torch.int32, device=dev))

    def decode_rows():
        gdn_rows(**one_token, A_log=x["A_log"], dt_bias=x["dt_bias"], **one_rows, ssm_states=replay_states)

    t_snap, t_replay, t_in_place, t_one = (graph_time(fn) * 1e3
                                           for fn in (snapshots, replay, replay_in_place, decode_rows))
    return sum(kept) / n, t_snap, t_replay, t_in_place, t_one


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="1,16,32,64")
    p.add_argument("--accept", type=float, default=0.81)
    args = p.parse_args()
    dev = torch.device("cuda")
    print(f"# GDN rollback of a verify step (4 tokens a row), {torch.cuda.get_device_name()}, accept {args.accept}\n")
    print("| rows | mean kept | snapshots us | replay us | replay in place us | replay / snapshots | in place / "
          "snapshots | 24 layers: snapshots / replay / in place ms | a decode step's rows (1 token) us |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in map(int, args.batches.split(",")):
        kept, t_snap, t_replay, t_in_place, t_one = measure(n, args.accept, dev)
        print(f"| {n} | {kept:.2f} | {t_snap:.1f} | {t_replay:.1f} | {t_in_place:.1f} | {t_replay / t_snap:.2f} | "
              f"{t_in_place / t_snap:.2f} | {t_snap * LAYERS / 1e3:.2f} / {t_replay * LAYERS / 1e3:.2f} / "
              f"{t_in_place * LAYERS / 1e3:.2f} | {t_one:.1f} |", flush=True)


if __name__ == "__main__":
    main()
