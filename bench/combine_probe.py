"""Where the bf16 combine kernel (triton_kernels/fused_moe.py, `_combine`) and eager bf16 part ways, on
the inputs of tests/kernels/test_fused_moe.py::test_bf16_combine_rounds_where_eager_rounds: a Triton
probe writes each intermediate the kernel rounds (the gate in bf16, sigmoid of it in bf16, the gated
shared output, the total) and each is compared with its eager counterpart, first mismatch first.

    python bench/combine_probe.py
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from triton_kernels.fused_moe import _combine, _combine_kernel  # noqa: E402


@triton.jit
def _probe(shared, gate, gate_bf16, sig, gated, H, stride_gate, BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    o_h = tl.arange(0, BLOCK_H)
    m_h = o_h < H
    b_g = tl.load(gate + t * stride_gate).to(tl.bfloat16)
    tl.store(gate_bf16 + t, b_g)
    b_sig = tl.sigmoid(b_g.to(tl.float32)).to(tl.bfloat16)
    tl.store(sig + t, b_sig)
    b_s = tl.load(shared + t * H + o_h, mask=m_h, other=0.0).to(tl.float32)
    tl.store(gated + t * H + o_h, (b_sig.to(tl.float32) * b_s).to(tl.bfloat16), mask=m_h)


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(11)
    t, k, h = 33, 10, 2048
    rows = torch.randn(t * k, h, device="cuda", generator=g).bfloat16()
    shared = torch.randn(t, h, device="cuda", generator=g).bfloat16()
    logits = torch.randn(t, 513, device="cuda", generator=g)
    gate = logits[:, 512]
    gate_bf16, sig = torch.empty(t, dtype=torch.bfloat16, device="cuda"), torch.empty(t, dtype=torch.bfloat16,
                                                                                         device="cuda")
    gated = torch.empty(t, h, dtype=torch.bfloat16, device="cuda")
    _probe[(t,)](shared, gate, gate_bf16, sig, gated, h, gate.stride(0), BLOCK_H=triton.next_power_of_2(h))
    eager_gate = gate.bfloat16()
    eager_sig = torch.sigmoid(eager_gate)
    eager_sig_f32 = torch.sigmoid(eager_gate.float())
    eager_gated = eager_sig[:, None] * shared
    print("gate bf16 equal:", torch.equal(gate_bf16, eager_gate))
    bad = (sig != eager_sig).nonzero().flatten().tolist()
    print(f"sigmoid bf16 rows differing: {bad}")
    for r in bad:
        print(f"  row {r}: gate {eager_gate[r].item()!r} kernel {sig[r].item()!r} eager {eager_sig[r].item()!r} "
              f"float32 sigmoid {eager_sig_f32[r].item()!r}")
    diff = (gated != eager_gated).any(dim=1).nonzero().flatten().tolist()
    print(f"gated shared rows differing: {diff}")
    experts = rows.view(t, k, h).float()
    total = experts[:, 0]
    for j in range(1, k):
        total = total + experts[:, j]
    expected = total.bfloat16() + eager_gated
    out = _combine(rows, t, k, shared, gate)
    rows_bad = (out != expected).any(dim=1).nonzero().flatten().tolist()
    print(f"combine rows differing: {rows_bad}; elements {(out != expected).sum().item()} of {out.numel()}")
    with_probe = total.bfloat16() + gated
    print(f"combine vs eager total + the probe's gated shared: {(out != with_probe).sum().item()} elements differ")
    unfused = torch.empty_like(out)  # the same kernel compiled without contracting multiply-adds into FMAs
    _combine_kernel[(t, triton.cdiv(h, 1024))](rows, shared, gate, unfused, shared.stride(0), gate.stride(0),
                                               unfused.stride(0), h, TOP_K=k, HAS_SHARED=True, HAS_GATE=True,
                                               BLOCK_H=1024, enable_fp_fusion=False)
    print(f"combine compiled with enable_fp_fusion=False: {(unfused != expected).sum().item()} elements differ")


if __name__ == "__main__":
    main()
