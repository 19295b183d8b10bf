"""--speculative-rollback replay on CPU, float32: the verify steps' gated-delta-rule layers write no state and
keep their inputs, and rollback runs each row's kept tokens again from the untouched slot. Greedy output
equals plain decoding exactly, at every acceptance depth, and the pools stay whole. Drafts as in
test_speculative.py: the true continuation with a set probability per token.

The tiny checkpoints' GDN layers keep their state (hybrid_sgl/testing/tiny_checkpoint.py), so that a wrong
state shows in the tokens. (Sampled, logprob and constrained requests beside drafted ones, the prefix cache
and preemption: test_speculative.py, with both rollbacks.)"""

import pytest

from hybrid_sgl.runner.speculative import SpecDecoder
from hybrid_sgl.server_args import ServerArgs
from tests.test_speculative import BASE, GREEDY, PROMPTS, SPEC, ScriptedDrafts, _generate

REPLAY = {**SPEC, "speculative_rollback": "replay"}


def _scripted(monkeypatch, prompts, plain, p: float, seed: int) -> None:
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(prompts, plain)}
    scripted = ScriptedDrafts(truth, p, seed=seed)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))


@pytest.mark.parametrize("rollback", ["replay", "snapshots"])
@pytest.mark.parametrize("family,p", [("qwen3_5", 0.5), ("qwen3_5", 0.9), ("qwen3_next", 0.7),
                                      ("qwen3_5_moe", 1.0)])
def test_replayed_rollback_keeps_greedy_output_exact(tiny_checkpoint, monkeypatch, family, p, rollback):
    """(Both rollback designs, on GDN layers that remember.)"""
    path = tiny_checkpoint(family, mtp=True)
    params = {**GREEDY, "max_new_tokens": 23}
    plain, _ = _generate(path, PROMPTS, params)
    _scripted(monkeypatch, PROMPTS, plain, p, seed=int(p * 10))
    spec, stats = _generate(path, PROMPTS, params, **{**REPLAY, "speculative_rollback": rollback})
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert stats["avg_spec_accept_length"] > (2.0 if p >= 0.9 else 1.2)


def test_verify_steps_write_no_gdn_state_and_replay_the_kept_tokens(tiny_checkpoint, monkeypatch):
    """With the Triton kernels (interpreter here): every verify step's gdn_rows call writes no state and takes
    no cuts; every replay runs each row's kept tokens (row_lens, 1 to k + 1); greedy output stays exact."""
    from triton_kernels import gdn_short_rows

    path = tiny_checkpoint("qwen3_5", mtp=True)
    kw = dict(linear_attn_backend="triton")
    params = {**GREEDY, "max_new_tokens": 9}
    plain, _ = _generate(path, PROMPTS[:2], params, **kw)
    _scripted(monkeypatch, PROMPTS[:2], plain, 0.7, seed=3)
    verify_calls, replays = [], []
    real = gdn_short_rows.gdn_rows

    def watched(**a):
        if a.get("row_lens") is not None:
            replays.append(a["row_lens"].tolist())
        else:
            verify_calls.append((a.get("write_final", True), a.get("snap_pos") is None))
        return real(**a)

    monkeypatch.setattr(gdn_short_rows, "gdn_rows", watched)
    spec, _ = _generate(path, PROMPTS[:2], params, **kw, **REPLAY)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert verify_calls and all(call == (False, True) for call in verify_calls)
    assert replays and all(1 <= m <= SPEC["speculative_num_steps"] + 1 for lens in replays for m in lens)
    assert any(m > 1 for lens in replays for m in lens)  # drafts were kept and replayed


def test_replay_needs_short_verify_rows(tiny_checkpoint):
    path = tiny_checkpoint("qwen3_5", mtp=True)
    with pytest.raises(ValueError, match="speculative-num-steps 7 or fewer"):
        ServerArgs(model_path=path, **BASE, **{**REPLAY, "speculative_num_steps": 8}).resolved()
    with pytest.raises(ValueError, match="speculative-rollback"):
        ServerArgs(model_path=path, **BASE, **{**REPLAY, "speculative_rollback": "rewind"}).resolved()


def test_replay_warm_up_writes_nothing(tiny_checkpoint):
    """SpecDecoder.warm_up (run before serving on CUDA, to compile the replay's kernel variants) goes through the
    served replay with steps of 1 to the most verify rows, every row in the pad slot, which the kernel skips:
    every state row, the pad slot's included, stays as it was, after a request has left real state in the
    pool; the metadata's segments start at 16-byte boundaries (Triton specializes on pointer alignment)."""
    import torch

    from hybrid_sgl.engine import Engine

    path = tiny_checkpoint("qwen3_5", mtp=True)
    with Engine(model_path=path, **BASE, **REPLAY, linear_attn_backend="triton") as engine:
        engine.generate(input_ids=PROMPTS[:1], sampling_params={**GREEDY, "max_new_tokens": 3})
        spec, pool = engine.runner.speculative, engine.runner.state_pool
        before = pool.ssm.clone(), pool.conv.clone()
        assert before[0].abs().sum() > 0
        replays = []
        for i, layer in enumerate(spec.replay_layers):
            real = layer.replay

            def watched(pool_, rows, row_lens, n, _real=real, _i=i):
                replays.append((_i, row_lens.tolist()))
                assert all(t.data_ptr() % 16 == 0 for t in (*rows.values(), row_lens))
                return _real(pool_, rows, row_lens, n)

            layer.replay = watched
        spec.warm_up()
        assert spec.max_verify_rows >= 2
        assert sorted(i for i, lens in replays if lens == [1]) == list(range(len(spec.replay_layers)))
        assert sorted(len(lens) for i, lens in replays if i == 0) == list(range(1, spec.max_verify_rows + 1))
        assert torch.equal(pool.ssm, before[0]) and torch.equal(pool.conv, before[1])
        engine.check_integrity()
