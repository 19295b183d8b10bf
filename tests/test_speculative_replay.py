"""--speculative-rollback replay on CPU, float32: the verify steps' gated-delta-rule layers write no state and
keep their inputs, and rollback runs each row's kept tokens again from the untouched slot. Greedy output
equals plain decoding exactly, at every acceptance depth, beside sampled, logprob and constrained requests,
through the prefix cache and preemption; the pools stay whole. Drafts as in test_speculative.py: the true
continuation with a set probability per token.

The tiny checkpoints' GDN layers forget almost all of their state at each token (HF initializes A up to
16, so the decay exp(-A softplus(.)) is near zero), which would hide a wrong state; these tests set every
layer's A to 0.02 (decay ~0.99 a token), so that the state carries each token for the rest of the run."""

import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hybrid_sgl.engine import Engine
from hybrid_sgl.runner.speculative import SpecDecoder
from hybrid_sgl.server_args import ServerArgs
from tests.test_speculative import BASE, GREEDY, PROMPTS, SPEC, ScriptedDrafts, _generate, _ids

REPLAY = {**SPEC, "speculative_rollback": "replay"}


@pytest.fixture
def remembering(tiny_checkpoint, tmp_path):
    """remembering(family) -> a copy of the tiny MTP checkpoint whose GDN layers keep their state (A = 0.02)."""

    def get(family: str) -> str:
        out = tmp_path / f"{family}_remembering"
        shutil.copytree(tiny_checkpoint(family, mtp=True), out)
        for f in Path(out).glob("*.safetensors"):
            tensors = load_file(f)
            logs = [name for name in tensors if name.endswith("A_log")]
            assert logs, f"no A_log in {f.name}"
            for name in logs:
                tensors[name] = torch.full_like(tensors[name], math.log(0.02))
            save_file(tensors, f, metadata={"format": "pt"})
        return str(out)

    return get


def _scripted(monkeypatch, prompts, plain, p: float, seed: int) -> None:
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(prompts, plain)}
    scripted = ScriptedDrafts(truth, p, seed=seed)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))


@pytest.mark.parametrize("rollback", ["replay", "snapshots"])
@pytest.mark.parametrize("family,p", [("qwen3_5", 0.5), ("qwen3_5", 0.9), ("qwen3_next", 0.7),
                                      ("qwen3_5_moe", 1.0)])
def test_replayed_rollback_keeps_greedy_output_exact(remembering, monkeypatch, family, p, rollback):
    """(Both rollback designs, on GDN layers that remember.)"""
    path = remembering(family)
    params = {**GREEDY, "max_new_tokens": 23}
    plain, _ = _generate(path, PROMPTS, params)
    _scripted(monkeypatch, PROMPTS, plain, p, seed=int(p * 10))
    spec, stats = _generate(path, PROMPTS, params, **{**REPLAY, "speculative_rollback": rollback})
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert stats["avg_spec_accept_length"] > (2.0 if p >= 0.9 else 1.2)


def test_verify_steps_write_no_gdn_state_and_replay_the_kept_tokens(remembering, monkeypatch):
    """With the Triton kernels (interpreter here): every verify step's gdn_rows call writes no state and takes
    no cuts; every replay runs each row's kept tokens (row_lens, 1 to k + 1); greedy output stays exact."""
    from triton_kernels import gdn_short_rows

    path = remembering("qwen3_5")
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


def test_replay_beside_sampled_logprob_and_constrained_requests(remembering, monkeypatch):
    path = remembering("qwen3_5")
    sampled = {**GREEDY, "temperature": 0.8, "sampling_seed": 5}
    constrained = {**GREEDY, "max_new_tokens": 8, "temperature": 0, "regex": "[0-9]+"}
    params = [GREEDY, sampled, constrained, GREEDY]

    def run(**kw):
        with Engine(model_path=path, **BASE, **kw) as engine:
            outs = [engine.generate(input_ids=p, sampling_params=s, return_logprob=i == 3)
                    for i, (p, s) in enumerate(zip(PROMPTS, params))]
            engine.check_integrity()
        return outs

    plain = run()
    _scripted(monkeypatch, PROMPTS, plain, 0.8, seed=1)
    spec = run(**REPLAY)
    assert [spec[i]["output_ids"] for i in (0, 2, 3)] == [plain[i]["output_ids"] for i in (0, 2, 3)]
    assert len(spec[1]["output_ids"]) == len(plain[1]["output_ids"])
    lp = [x[0] for x in spec[3]["meta_info"]["output_token_logprobs"]]
    assert lp == pytest.approx([x[0] for x in plain[3]["meta_info"]["output_token_logprobs"]], abs=1e-4)


@pytest.mark.parametrize("rollback", ["replay", "snapshots"])
def test_replay_through_the_prefix_cache_and_preemption(remembering, monkeypatch, rollback):
    path = remembering("qwen3_5")
    system = _ids(9, 50)
    prompts = [system + _ids(10 + i, 8 + 3 * i) for i in range(4)]
    tight = dict(page_size=16, max_running_requests=4, max_total_tokens=160, chunked_prefill_size=32)
    plain, _ = _generate(path, prompts, GREEDY, **tight)
    _scripted(monkeypatch, prompts, plain, 0.7, seed=2)
    with Engine(model_path=path, **BASE, **tight, **{**REPLAY, "speculative_rollback": rollback}) as engine:
        first = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        again = engine.generate(input_ids=prompts[0][:60], sampling_params=GREEDY)
        preemptions = engine.run_on_engine(lambda s: s.num_preemptions)
        engine.check_integrity()
    assert [o["output_ids"] for o in first] == [o["output_ids"] for o in plain]
    assert preemptions > 0
    plain_again, _ = _generate(path, [prompts[0][:60]], GREEDY)
    assert again["output_ids"] == plain_again[0]["output_ids"]


def test_replay_needs_short_verify_rows(tiny_checkpoint):
    path = tiny_checkpoint("qwen3_5", mtp=True)
    with pytest.raises(ValueError, match="speculative-num-steps 7 or fewer"):
        ServerArgs(model_path=path, **BASE, **{**REPLAY, "speculative_num_steps": 8}).resolved()
    with pytest.raises(ValueError, match="speculative-rollback"):
        ServerArgs(model_path=path, **BASE, **{**REPLAY, "speculative_rollback": "rewind"}).resolved()
