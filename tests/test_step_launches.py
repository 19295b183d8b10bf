"""What a decode step launches, counted on the CPU as it would run on CUDA (every bundle Triton's, the dense
ops too, kernels in the interpreter): inside the decoder layers no torch kernel runs between the Triton
kernels and the linears. Each such op is a launch in every layer, host time in an eager step and a tiny kernel
in a graphed one (Falcon-H1's torch rotary was ~20 a layer before its one-launch `rope`)."""

import collections
import traceback
from pathlib import Path

import pytest
from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime import interpreter

import hybrid_sgl.layers.backends as backends
from tests.test_hf_parity import full_request, make_scheduler, prompt_of

# aten ops that launch no kernel (views, metadata, allocation)
NO_KERNEL = {"view", "_unsafe_view", "reshape", "split", "split_with_sizes", "as_strided", "slice", "select", "t",
             "transpose", "unsqueeze", "squeeze", "empty", "empty_like", "new_empty", "empty_strided", "alias",
             "detach", "expand", "permute", "chunk", "unbind", "narrow", "unflatten", "flatten", "view_as",
             "to", "contiguous"}  # (these two launch as _to_copy / clone where they copy)
OWN_WORK = {"linear", "embedding"}  # a layer's own kernel (cuBLAS, the embedding gather), not glue around one


class LayerOps(TorchDispatchMode):
    """Counts kernel-launching aten ops dispatched inside a decoder layer's forward (`inside`, set by hooks) and
    outside Triton kernels (the interpreter's own tensor work), by the innermost frame of this repository."""

    def __init__(self):
        super().__init__()
        self.sites: collections.Counter = collections.Counter()
        self.in_kernel = self.inside = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if self.inside and not self.in_kernel and name not in NO_KERNEL | OWN_WORK:
            ours = [f for f in traceback.extract_stack()
                    if "/hybrid_sgl/" in f.filename or "/triton_kernels/" in f.filename]
            site = (Path(ours[-1].filename).name, ours[-1].lineno) if ours else ("?", 0)
            self.sites[(name, *site)] += 1
        return func(*args, **(kwargs or {}))

    def enter(self, *_):
        self.inside += 1

    def leave(self, *_):
        self.inside -= 1


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "falcon_h1", "bamba", "granitemoehybrid", "jamba",
                                    "nemotron_h"])
def test_decode_layers_dispatch_no_torch_kernels(tiny_checkpoint, family, monkeypatch):
    monkeypatch.setattr(backends, "_dense_of", lambda backend, device: backends.dense_ops(
        "triton" if backend != "torch" else "torch"))
    s = make_scheduler(tiny_checkpoint(family), chunked_prefill_size=32, attention_backend="triton",
                       linear_attn_backend="triton", moe_runner_backend="triton", disable_overlap_schedule=True)
    assert s.runner._backends.dense.name == "triton"  # as on CUDA
    req = full_request("a", prompt_of(6, 1, s.vocab_size), s.vocab_size, max_new=5)
    req.return_logprob, req.top_logprobs_num = False, 0
    s.add(req)
    s.step()  # the prefill
    s.step()  # a first decode step (allocates what later steps reuse)
    counter = LayerOps()
    run = interpreter.InterpretedFunction.run

    def counted_run(self, *args, **kwargs):
        counter.in_kernel += 1
        try:
            return run(self, *args, **kwargs)
        finally:
            counter.in_kernel -= 1

    monkeypatch.setattr(interpreter.InterpretedFunction, "run", counted_run)
    for layer in s.runner.model.layers:
        layer.register_forward_pre_hook(counter.enter)
        layer.register_forward_hook(counter.leave)
    with counter:
        s.step()  # one decode step
    assert len(req.output_ids) >= 3
    assert not counter.sites, f"torch kernels launched inside the layers: {dict(counter.sites)}"
