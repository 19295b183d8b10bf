"""Fused q/k norm + rotary, rotary alone, and the sigmoid output gate vs their references; the norm +
rotary against RMSNorm modules, then rotary."""

import pytest
import torch

from hybrid_sgl.layers.backends import dense_ops
from hybrid_sgl.layers.norm import RMSNorm
from hybrid_sgl.layers.rotary import RotaryEmbedding
from triton_kernels.attention_prep import (
    qk_norm_rope,
    qk_norm_rope_ref,
    rope,
    rope_ref,
    sigmoid_gate_mul,
    sigmoid_gate_mul_ref,
)

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
    modules = rope_ref(q=qn(q), k=kn(k), cos_sin=rotary.cos_sin, positions=positions, rotary_dim=rot)
    for a, b, c in zip(ours, ref, modules):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hq,hkv,d,rot", [(4, 2, 16, 4), (2, 1, 24, 24), (3, 3, 8, 2)])
def test_rope_matches_reference(hq, hkv, d, rot):
    """Rotary alone (no q/k norm: Falcon-H1, Bamba) on strided views of a fused projection: rotated dims
    as the float32 formula, the others copied; each output contiguous [T, H, D]."""
    g = torch.Generator().manual_seed(d + rot)
    t = 6
    qkv = torch.randn(t, (hq + 2 * hkv) * d + 3, generator=g).to(DEVICE)
    q, k = qkv[:, : hq * d].view(t, hq, d), qkv[:, hq * d: (hq + hkv) * d].view(t, hkv, d)
    rotary = RotaryEmbedding(head_dim=d, rotary_dim=rot, base=1e4, max_positions=64).to(DEVICE)
    positions = torch.tensor([0, 1, 7, 8, 33, 63], device=DEVICE)
    args = dict(q=q, k=k, cos_sin=rotary.cos_sin, positions=positions, rotary_dim=rot)
    ours, ref = rope(**args), rope_ref(**args)
    for a, b, x in zip(ours, ref, (q, k)):
        assert a.is_contiguous() and a.shape == x.shape
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a[..., rot:], x[..., rot:], rtol=0, atol=0)
    cos, sin = rotary.cos_sin[positions, : rot // 2], rotary.cos_sin[positions, rot // 2:]
    x1, x2 = q[:, 0, : rot // 2], q[:, 0, rot // 2: rot]
    torch.testing.assert_close(ours[0][:, 0, : rot // 2], x1 * cos - x2 * sin, rtol=1e-5, atol=1e-5)
    empty = rope(q=q[:0], k=k[:0], cos_sin=rotary.cos_sin, positions=positions[:0], rotary_dim=rot)
    assert empty[0].shape == (0, hq, d) and empty[1].shape == (0, hkv, d)


def test_sigmoid_gate_mul():
    g = torch.Generator().manual_seed(0)
    o = torch.randn(5, 3, 12, generator=g).to(DEVICE)
    gate = torch.randn(5, 3, 24, generator=g).to(DEVICE)[..., 12:]
    torch.testing.assert_close(sigmoid_gate_mul(o=o, gate=gate), sigmoid_gate_mul_ref(o=o, gate=gate))
