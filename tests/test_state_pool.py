"""StatePool's whole-slot copies: one slot at a time and a batch of them in one gather / scatter."""

import torch

from hybrid_sgl.memory.state_pool import StatePool


def _pool() -> StatePool:
    pool = StatePool(num_layers=3, num_slots=4, conv_shape=(2, 5), conv_dtype=torch.float32, ssm_shape=(2, 3, 3),
                     ssm_dtype=torch.float32, device="cpu", num_snapshots=2, num_draft_rows=3)
    pool.conv.copy_(torch.randn_like(pool.conv))
    pool.ssm.copy_(torch.randn_like(pool.ssm))
    return pool


def test_copy_slots_equals_one_copy_at_a_time():
    batched, single = _pool(), _pool()
    single.conv.copy_(batched.conv)
    single.ssm.copy_(batched.ssm)
    src, dst = [7, 9, 5], [0, 3, 2]
    before = batched.ssm.clone()
    batched.copy_slots(src, dst)
    for s, d in zip(src, dst):
        single.copy_slot(s, d)
    assert torch.equal(batched.conv, single.conv) and torch.equal(batched.ssm, single.ssm)
    assert torch.equal(batched.ssm[:, 0], before[:, 7]) and torch.equal(batched.ssm[:, 1], before[:, 1])


def test_copy_slots_of_nothing_changes_nothing():
    pool = _pool()
    conv, ssm = pool.conv.clone(), pool.ssm.clone()
    pool.copy_slots([], [])
    assert torch.equal(pool.conv, conv) and torch.equal(pool.ssm, ssm)
