"""Fused q/k norm + rotary and the sigmoid output gate vs their references and vs the unfused
modules (RMSNorm + RotaryEmbedding)."""

import pytest
import torch

from hybrid_sgl.layers.backends import dense_ops
from hybrid_sgl.layers.norm import RMSNorm
from hybrid_sgl.layers.rotary import RotaryEmbedding
from triton_kernels.attention_prep import qk_norm_rope, qk_norm_rope_ref, sigmoid_gate_mul, sigmoid_gate_mul_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("hq,hkv,d,rot", [(4, 2, 16, 4), (2, 1, 24, 24), (3, 3, 8, 2)])
def test_qk_norm_rope_matches_reference_and_modules(hq, hkv, d, rot):
    g = torch.Generator().manual_seed(d)
    t = 7
    qg = torch.randn(t, hq, 2 * d, generator=g).to(DEVICE)  # q is the first half of each head
    kv = torch.randn(t, 2 * hkv * d + 5, generator=g).to(DEVICE)
    q, k = qg[..., :d], kv[:, : hkv * d].view(t, hkv, d)
    rotary = RotaryEmbedding(head_dim=d, rotary_dim=rot, base=1e4, max_positions=64).to(DEVICE)
    wq, wk = (torch.randn(d, generator=g) * 0.1).to(DEVICE), (torch.randn(d, generator=g) * 0.1).to(DEVICE)
    positions = torch.tensor([0, 3, 9, 10, 11, 40, 63], device=DEVICE)
    args = dict(q=q, k=k, q_weight=wq, k_weight=wk, cos_sin=rotary.cos_sin, positions=positions, eps=1e-6,
                offset=1.0, rotary_dim=rot)
    ours, ref = qk_norm_rope(**args), qk_norm_rope_ref(**args)
    torch_ops = dense_ops("torch")
    qn, kn = RMSNorm(d, 1e-6, 1.0, ops=torch_ops).to(DEVICE), RMSNorm(d, 1e-6, 1.0, ops=torch_ops).to(DEVICE)
    qn.weight.data.copy_(wq)
    kn.weight.data.copy_(wk)
    modules = rotary(positions, qn(q), kn(k))
    for a, b, c in zip(ours, ref, modules):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-5)


def test_sigmoid_gate_mul():
    g = torch.Generator().manual_seed(0)
    o = torch.randn(5, 3, 12, generator=g).to(DEVICE)
    gate = torch.randn(5, 3, 24, generator=g).to(DEVICE)[..., 12:]
    torch.testing.assert_close(sigmoid_gate_mul(o=o, gate=gate), sigmoid_gate_mul_ref(o=o, gate=gate))
