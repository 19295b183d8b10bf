"""Eager steps run their 16-bit linears on cuBLAS (triton_kernels/dense_linear.py): at decode sizes such a
step waits on its host, where a few-rows GEMM launch costs more than `F.linear`. Steps replayed from CUDA
graphs (captured outside `eager_step`) keep the timed choice. On the CPU every step is eager: the test
records, at each dense linear of a served request, whether the few-rows kernel was allowed."""

import threading

import pytest

import hybrid_sgl.layers.backends as backends
import triton_kernels.dense_linear as dl
from hybrid_sgl.runner.warm_up import warm_up_eager_steps
from tests.test_hf_parity import full_request, make_scheduler, prompt_of


def test_the_few_rows_kernel_is_allowed_outside_eager_steps_only(monkeypatch):
    monkeypatch.setattr(dl, "FEW_ROWS", "1")
    assert dl._few_rows_allowed()
    with dl.eager_step():
        assert not dl._few_rows_allowed()
        with dl.eager_step():
            assert not dl._few_rows_allowed()
        assert not dl._few_rows_allowed()  # the inner one restored the outer's state
        other = []
        thread = threading.Thread(target=lambda: other.append(dl._few_rows_allowed()))
        thread.start()
        thread.join()
        assert other == [True]  # another thread's step is not this one's
    assert dl._few_rows_allowed()
    monkeypatch.setattr(dl, "FEW_ROWS", "2")
    with dl.eager_step():
        assert dl._few_rows_allowed()
    monkeypatch.setattr(dl, "FEW_ROWS", "0")
    assert not dl._few_rows_allowed()


@pytest.mark.parametrize("setting,allowed", [("1", False), ("2", True)])
def test_a_served_requests_eager_steps_run_linears_on_cublas(tiny_checkpoint, monkeypatch, setting, allowed):
    monkeypatch.setattr(backends, "_dense_of", lambda backend, device: backends.dense_ops(
        "triton" if backend != "torch" else "torch"))  # the dense ops CUDA serves (dense_linear among them)
    monkeypatch.setattr(dl, "FEW_ROWS", setting)
    seen = []
    allowed_now = dl._few_rows_allowed
    monkeypatch.setattr(dl, "_few_rows_allowed", lambda: seen.append(allowed_now()) or False)
    s = make_scheduler(tiny_checkpoint("qwen3_5"), chunked_prefill_size=32, attention_backend="triton",
                       linear_attn_backend="triton", disable_overlap_schedule=True)
    assert s.runner._backends.dense.name == "triton"
    req = full_request("a", prompt_of(6, 1, s.vocab_size), s.vocab_size, max_new=3)
    s.add(req)
    while not req.finished:
        s.step()
    assert len(req.output_ids) == 3
    assert seen and set(seen) == {allowed}, seen


def test_the_eager_warm_up_runs_linears_as_eager_steps_do(tiny_checkpoint, monkeypatch):
    # the dense ops CUDA serves under the torch mixers (the interpreter runs the dense kernels only: faster)
    monkeypatch.setattr(backends, "_dense_of", lambda backend, device: backends.dense_ops("triton"))
    s = make_scheduler(tiny_checkpoint("qwen3_5"), chunked_prefill_size=32, disable_overlap_schedule=True)
    assert s.runner._backends.dense.name == "triton"
    seen = []
    allowed_now = dl._few_rows_allowed
    monkeypatch.setattr(dl, "_few_rows_allowed", lambda: seen.append(allowed_now()) or False)
    assert warm_up_eager_steps(s.runner) > 0
    assert seen and set(seen) == {False}
