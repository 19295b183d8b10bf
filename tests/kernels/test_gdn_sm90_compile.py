"""The GDN and conv1d kernels compile for Hopper (sm_90a) at the Qwen3.5-9B shapes, with the launch
configs the launchers pick and every config the prefill autotuners may pick, and ptxas reports no
register spills; so do the float32 variants of the tiny GPU test models.

Needs no GPU (tests/kernels/sm90.py): the interpreter tests run the kernels' logic; this catches what
only the compiler sees (type or shape errors, 64-bit offset tiles that blow the register budget).
"""

import pytest
import torch

from tests.kernels.sm90 import compile_sm90_in_subprocess

SCRIPT = r'''
from triton_kernels import causal_conv1d as conv, gdn_chunk, gdn_chunk_parts as parts, gdn_recurrent, gdn_short_rows

HK, HV, K, V, D = 16, 32, 128, 128, 8192
BF16 = "*bf16"
gdn = dict(q=BF16, k=BF16, v=BF16, a=BF16, b=BF16, A_log="*fp32", dt_bias="*fp32", ssm_states="*fp32",
           state_slots="*i32", cu_seqlens="*i32", has_initial_state="*i1", o=BF16, g_cum="*fp32", kn=BF16,
           w=BF16, u=BF16, h=BF16, v_new=BF16, scale="fp32", z=BF16, norm_w=BF16, eps="fp32", arrivals="*i32",
           snap_pos="*i32", snap_slots="*i32", row_lens="*i32")
for batch in (1, 8, 64, 256):
    for norm in (False, True):
        BV, warps = gdn_recurrent._decode_config(batch, HV, K, V, whole_heads=norm)
        out[f"decode B{batch}{' norm' * norm}"] = compile_sm90(
            gdn_recurrent._gdn_decode_kernel, gdn, dict(HK=HK, HV=HV, K=K, V=V, BK=K, BV=BV, VP=V, NORM=norm), warps, 1)
    BV, warps = gdn_recurrent._decode_config(batch, HV, K, V)  # the prepared last-arriver norm at the unfused tiles
    out[f"decode B{batch} norm by the last"] = compile_sm90(
        gdn_recurrent._gdn_decode_kernel, gdn, dict(HK=HK, HV=HV, K=K, V=V, BK=K, BV=BV, VP=V, NORM=True), warps, 1)
for rows in (1, 32, 64):  # verify steps: token by token over short rows, with and without cuts; the replay's two
    BV, warps = gdn_recurrent._decode_config(rows, HV, K, V)
    for snap, final, lens, name in ((False, True, False, ""), (True, True, False, " cuts"),
                                    (False, False, False, " checkpoints"), (False, True, True, " replay")):
        out[f"short rows N{rows}{name}"] = compile_sm90(gdn_short_rows._gdn_rows_kernel, gdn,
            dict(HK=HK, HV=HV, K=K, V=V, BK=K, BV=BV, HAS_SNAP=snap, WRITE_FINAL=final, HAS_LENS=lens), warps, 1)
for c in parts.INTRA_CONFIGS:
    out[f"intra BV{c.kwargs['BV']} w{c.num_warps} s{c.num_stages}"] = compile_sm90(parts._gdn_chunk_intra_kernel, gdn,
        dict(HK=HK, HV=HV, K=K, V=V, BT=64, BK=K, BLOCK_N=64, PREC="tf32", **c.kwargs), c.num_warps, c.num_stages)
for num_seqs in (1, 8):
    for snap in (False, True):
        BV, warps, stages = gdn_chunk._state_config(num_seqs, HV, V, snap)
        out[f"state N{num_seqs}{' cuts' * snap}"] = compile_sm90(parts._gdn_chunk_state_kernel, gdn,
            dict(HK=HK, HV=HV, K=K, V=V, BT=64, BK=64, BV=BV, PREC="tf32", HAS_SNAP=snap), warps, stages)
for c in parts.OUTPUT_CONFIGS:
    out[f"output BV{c.kwargs['BV']} w{c.num_warps} s{c.num_stages}"] = compile_sm90(parts._gdn_chunk_output_kernel, gdn,
        dict(HK=HK, HV=HV, K=K, V=V, BT=64, BK=K, BLOCK_N=64, PREC="tf32", **c.kwargs), c.num_warps, c.num_stages)
f32 = {name: "*fp32" if t.startswith("*") and t != "*i32" and t != "*i1" else t for name, t in gdn.items()}
tiny = dict(HK=2, HV=4, K=16, V=16, BT=64, PREC="tf32x3")  # the tiny float32 models of the GPU model tests
out["intra f32"] = compile_sm90(parts._gdn_chunk_intra_kernel, f32, dict(**tiny, BK=16, BV=64, BLOCK_N=64), 4, 1)
BV, warps, stages = gdn_chunk._state_config(1, 4, 16)
out["state f32"] = compile_sm90(parts._gdn_chunk_state_kernel, f32, dict(**tiny, BK=16, BV=BV, HAS_SNAP=True), warps,
                               stages)
out["output f32"] = compile_sm90(parts._gdn_chunk_output_kernel, f32, dict(**tiny, BK=16, BV=64, BLOCK_N=64), 4, 1)
cv = dict(x=BF16, weight=BF16, bias=BF16, conv_states=BF16, cu_seqlens="*i32", state_slots="*i32",
          has_initial_state="*i1", y=BF16, snap_pos="*i32", snap_slots="*i32")
BT, BD, warps = conv._prefill_config()
for snap in (False, True):
    out[f"conv prefill{' cuts' * snap}"] = compile_sm90(conv._causal_conv1d_prefill_kernel, cv,
        dict(D=D, W=4, BT=BT, BD=BD, BW=4, BLOCK_N=64, HAS_BIAS=False, USE_SILU=True, HAS_SNAP=snap), warps, 1)
for rows in (1, 32, 64):  # verify steps: short rows token by token
    BD, warps = conv._update_config(rows)
    for snap in (False, True):
        out[f"conv rows N{rows}{' cuts' * snap}"] = compile_sm90(conv._causal_conv1d_rows_kernel, cv,
            dict(D=D, W=4, BD=BD, BW=4, HAS_BIAS=False, USE_SILU=True, HAS_SNAP=snap), warps, 1)
for batch in (1, 8, 64):
    BD, warps = conv._update_config(batch)
    out[f"conv update B{batch}"] = compile_sm90(conv._causal_conv1d_update_kernel, cv,
        dict(D=D, W=4, BD=BD, HAS_BIAS=False, USE_SILU=True), warps, 1)
print(json.dumps(out))
'''


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel tests run the compiled kernels")
def test_kernels_compile_for_hopper_without_spills():
    results = compile_sm90_in_subprocess(SCRIPT)
    spilling = {name: r for name, r in results.items() if r[1] > 0}
    assert not spilling, f"(registers, spilled bytes) of configs that spill: {spilling}"
    assert all(regs <= 255 for regs, _ in results.values())
