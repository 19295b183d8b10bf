"""FP8 checkpoints in the published block layout (written by tools/fp8_checkpoint.py) and online FP8
(--quantization fp8), on CPU in float32 through the reference GEMM.

The served model of an FP8 checkpoint must be the checkpoint's dequantized model, with its activations
quantized per token and 128-column group ("dynamic" activation scales) in GEMMs over more than 64 rows
(prefill) and unquantized in smaller ones (decode, layers/quantization.py): its e4m3 bytes are the
checkpoint's wherever the layer's 128-row blocks line up with the checkpoint's (every projection of the
128-wide fixture; the GDN b and a rows share one block and are given the same largest magnitude, so
the re-computed scale is theirs too). The scales are recomputed as amax / 448, within 2 ulp of the
stored ones."""

import json
import os

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from hybrid_sgl.engine import Engine
from hybrid_sgl.testing.tiny_checkpoint import TINY_MOE
from tools.fp8_checkpoint import convert
from triton_kernels.fp8_quant import FP8_DTYPE, dequantize_fp8

ARGS = dict(device="cpu", dtype="float32", page_size=16, max_running_requests=4, log_level="warning")
ALIGNED = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, head_dim=64, linear_key_head_dim=64,
               linear_num_key_heads=2, linear_value_head_dim=32, linear_num_value_heads=4, intermediate_size=256)
PROMPTS = [[5, 17, 99, 3, 240, 18, 7, 64, 33, 120, 8, 9], [41, 42, 300, 11, 2, 250, 77],
           [(7 * i + 3) % 320 for i in range(70)]]  # 89 prefill rows in all: activations quantized


def _same_block_max(path: str) -> None:
    """Give each layer's in_proj_b and in_proj_a the same largest magnitude (they share a 128-row block)."""
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    for name in [n for n in tensors if n.endswith("in_proj_b.weight")]:
        a, b = tensors[name.replace("in_proj_b", "in_proj_a")], tensors[name]
        a[0, 0] = b[0, 0] = 2 * max(a.abs().max(), b.abs().max())
    save_file(tensors, file, metadata={"format": "pt"})


def _dequantized_copy(fp8: str, dst: str) -> str:
    """The FP8 checkpoint's dequantized model as an unquantized float32 checkpoint."""
    os.makedirs(dst)
    tensors = load_file(os.path.join(fp8, "model.safetensors"))
    out = {n: dequantize_fp8(t, tensors[n + "_scale_inv"]) if t.dtype == FP8_DTYPE else t
           for n, t in tensors.items() if not n.endswith("_scale_inv")}
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    for entry in os.listdir(fp8):
        if entry.endswith((".json", ".jinja")):
            with open(os.path.join(fp8, entry)) as f:
                text = json.load(f) if entry == "config.json" else f.read()
            if entry == "config.json":
                text.pop("quantization_config")
                text = json.dumps(text)
            with open(os.path.join(dst, entry), "w") as f:
                f.write(text)
    return dst


def _run(path: str, prompts: list[list[int]] = PROMPTS, **flags) -> tuple[list, list[list[float]], torch.nn.Module]:
    greedy = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    with Engine(model_path=path, **ARGS, **flags) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=greedy, return_logprob=True, logprob_start_len=0)
        model = engine.run_on_engine(lambda s: s.runner.model)
    logprobs = [[lp for lp, *_ in o["meta_info"]["input_token_logprobs"] + o["meta_info"]["output_token_logprobs"]
                 if lp is not None] for o in outs]
    return [o["output_ids"] for o in outs], logprobs, model


@pytest.fixture(scope="module")
def fp8_checkpoint(tiny_checkpoint, tmp_path_factory):
    src = tiny_checkpoint("qwen3_5", **ALIGNED)
    staged = str(tmp_path_factory.mktemp("aligned"))
    for entry in os.listdir(src):
        with open(os.path.join(src, entry), "rb") as f, open(os.path.join(staged, entry), "wb") as g:
            g.write(f.read())
    _same_block_max(staged)
    return convert(staged, str(tmp_path_factory.mktemp("fp8")))


def test_tool_writes_the_published_layout(fp8_checkpoint):
    with open(os.path.join(fp8_checkpoint, "config.json")) as f:
        quant = json.load(f)["quantization_config"]
    assert quant["quant_method"] == "fp8" and quant["weight_block_size"] == [128, 128]
    assert quant["activation_scheme"] == "dynamic" and "model.embed_tokens" in quant["modules_to_not_convert"]
    with safe_open(os.path.join(fp8_checkpoint, "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        w = f.get_tensor("model.layers.0.linear_attn.in_proj_qkv.weight")
        s = f.get_tensor("model.layers.0.linear_attn.in_proj_qkv.weight_scale_inv")
        assert w.dtype == FP8_DTYPE and w.shape == (384, 128) and s.shape == (3, 1) and s.dtype == torch.float32
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.float32
    assert not any(n.endswith("norm.weight_scale_inv") for n in names)
    assert "model.layers.0.mlp.down_proj.weight_scale_inv" in names


def test_fp8_checkpoint_serves_its_dequantized_model(fp8_checkpoint, tmp_path):
    ids, logprobs, model = _run(fp8_checkpoint)
    deq = _dequantized_copy(fp8_checkpoint, str(tmp_path / "deq"))
    ref_ids, ref_logprobs, _ = _run(deq)
    linears = [m for m in model.modules() if getattr(m, "weight_scale_inv", None) is not None]
    assert len(linears) == 4 * 4  # per layer: the mixer's in and out (or qkv and o), the MLP's gate_up and down
    assert all(m.weight.dtype == FP8_DTYPE for m in linears)
    tensors = load_file(os.path.join(fp8_checkpoint, "model.safetensors"))
    assert torch.equal(model.layers[0].ffn.down_proj.weight.view(torch.uint8),
                       tensors["model.layers.0.mlp.down_proj.weight"].view(torch.uint8))
    in_proj = model.layers[0].mixer.in_proj.weight.view(torch.uint8)
    parts = ("qkv", "z", "b", "a")
    stored = [tensors[f"model.layers.0.linear_attn.in_proj_{p}.weight"].view(torch.uint8) for p in parts]
    assert torch.equal(in_proj, torch.cat(stored))
    # the dequantized copy runs its activations unquantized: they alone differ
    _assert_within_e4m3_roundings(logprobs, ref_logprobs)
    # decode-sized GEMMs (the two short prompts' prefill, every decode step) leave activations alone
    short = PROMPTS[:2]
    ids, logprobs, _ = _run(fp8_checkpoint, short)
    ref_ids, ref_logprobs, _ = _run(deq, short)
    assert ids == ref_ids
    for got, ref in zip(logprobs, ref_logprobs):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-5, atol=1e-5)


def _assert_within_e4m3_roundings(logprobs: list[list[float]], ref_logprobs: list[list[float]]) -> None:
    """The prompts' teacher-forced log-probabilities (~6 nats on this random model) of two runs whose
    linear layers differ by one e4m3 rounding (2**-4 relative at most, ~2**-6 on average) of their
    weights, their activations, or both: they move by a few percent."""
    n = [len(p) - 1 for p in PROMPTS]  # the prompt's logprobs; the continuations may differ
    got = torch.cat([torch.tensor(a[:k]) for a, k in zip(logprobs, n)])
    ref = torch.cat([torch.tensor(b[:k]) for b, k in zip(ref_logprobs, n)])
    rel = (got - ref).abs() / ref.abs()
    assert 0 < rel.max() < 0.15 and rel.mean() < 0.05, (rel.max(), rel.mean())


def test_online_fp8_stays_close_to_the_unquantized_model(tiny_checkpoint):
    """Weights and activations each move by one e4m3 rounding at most (on GDN layers that forget: a remembered
    state carries the roundings of every token before, past that bound)."""
    path = tiny_checkpoint("qwen3_5", forgetful=True)
    _, logprobs, model = _run(path, quantization="fp8")
    _, ref_logprobs, _ = _run(path)
    assert sum(m.weight.dtype == FP8_DTYPE for m in model.modules() if hasattr(m, "weight_scale_inv")) == 4 * 4
    _assert_within_e4m3_roundings(logprobs, ref_logprobs)


@pytest.mark.parametrize("change, cause", [
    (dict(weight_block_size=[64, 64]), "weight_block_size [64, 64]"),
    (dict(activation_scheme="static"), "activation_scheme 'static'"),
    (dict(weight_block_size=None), "per-tensor FP8 scales"),
    (dict(quant_method="awq"), "quant_method 'awq'"),
])
def test_bad_quantization_config_is_refused_with_its_cause(fp8_checkpoint, tmp_path, change, cause):
    with open(os.path.join(fp8_checkpoint, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"].update(change)
    for entry in os.listdir(fp8_checkpoint):
        os.symlink(os.path.join(fp8_checkpoint, entry), tmp_path / entry)
    os.unlink(tmp_path / "config.json")
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not supported") as info:
        Engine(model_path=str(tmp_path), **ARGS)
    assert cause in str(info.value)


def test_scale_without_weight_and_stacked_fp8_tensors_are_refused():
    from hybrid_sgl.layers.quantization import dequantized_weights

    q = torch.zeros(4, 4, dtype=FP8_DTYPE)
    with pytest.raises(ValueError, match="without its weight_scale_inv"):
        list(dequantized_weights(iter([("x.weight", q)])))
    stacked = [("layers.0.mlp.experts.gate_up_proj.weight", torch.zeros(2, 4, 4, dtype=FP8_DTYPE)),
               ("layers.0.mlp.experts.gate_up_proj.weight_scale_inv", torch.ones(2, 1, 1))]
    with pytest.raises(ValueError, match=r"shape \(2, 4, 4\) are not supported"):
        list(dequantized_weights(iter(stacked)))
    with pytest.raises(ValueError, match=r"needs \(1, 1\)"):
        list(dequantized_weights(iter([("x.weight", q), ("x.weight_scale_inv", torch.ones(2, 1))])))


def test_fp8_checkpoint_under_tensor_parallel(fp8_checkpoint):
    """At --tp-size 2 each rank re-blocks its own slice (the KV heads' 64-row slices leave the 128 grid), so
    the logprobs move by at most what one more e4m3 rounding of those rows allows, as online FP8."""
    _, logprobs, _ = _run(fp8_checkpoint)
    _, tp_logprobs, _ = _run(fp8_checkpoint, tp_size=2)
    _assert_within_e4m3_roundings(tp_logprobs, logprobs)


def test_fp8_experts_load_dequantized_into_the_model_dtype(tiny_checkpoint, tmp_path, caplog):
    """A Qwen3.5-MoE checkpoint whose routed experts are FP8 too (the published layout) serves: each
    expert's weights are its dequantized e4m3 blocks, kept in --dtype, and a warning says so."""
    from hybrid_sgl.layers.moe import SparseMoE

    fp8 = convert(tiny_checkpoint("qwen3_5_moe"), str(tmp_path / "fp8"), experts=True)
    tensors = load_file(os.path.join(fp8, "model.safetensors"))
    prefix = "model.layers.1.mlp.experts.2."
    assert tensors[prefix + "up_proj.weight"].dtype == FP8_DTYPE
    with caplog.at_level("WARNING"):
        _, logprobs, model = _run(fp8, PROMPTS[:2])
    assert "FP8 MoE experts" in caplog.text
    moe = [m for m in model.modules() if isinstance(m, SparseMoE)][1]
    assert moe.w13.dtype == torch.float32
    i = moe.w2.shape[2]
    deq = {p: dequantize_fp8(tensors[prefix + p + ".weight"], tensors[prefix + p + ".weight_scale_inv"])
           for p in ("gate_proj", "up_proj", "down_proj")}
    assert torch.equal(moe.w13.data[2, :i], deq["gate_proj"]) and torch.equal(moe.w13.data[2, i:], deq["up_proj"])
    assert torch.equal(moe.w2.data[2], deq["down_proj"])
    # the 64-wide layers outside the experts are re-blocked (one more e4m3 rounding)
    _, ref_logprobs, _ = _run(_dequantized_copy(fp8, str(tmp_path / "deq")), PROMPTS[:2])
    _assert_within_e4m3_roundings(logprobs, ref_logprobs)


def test_enable_fp8_experts_keeps_the_experts_in_fp8(tiny_checkpoint, tmp_path):
    """--enable-fp8-experts: the routed experts are stored e4m3 with block scales per expert (a quarter
    of their float32 bytes here), the down projections byte for byte as the checkpoint stores them (one
    block per expert matrix; the gated w13 fuses gate and up rows into one block and is rounded once
    more), and the model stays within the e4m3 roundings of the same checkpoint with dequantized
    experts. Without FP8 weights the flag is refused."""
    from hybrid_sgl.layers.moe import SparseMoE

    fp8 = convert(tiny_checkpoint("qwen3_5_moe"), str(tmp_path / "fp8"), experts=True)
    _, logprobs, model = _run(fp8, PROMPTS[:2], enable_fp8_experts=True)
    moe = [m for m in model.modules() if isinstance(m, SparseMoE)][1]
    assert moe.w13.dtype == moe.w2.dtype == FP8_DTYPE
    assert moe.w2_scale_inv.shape == (moe.w2.shape[0], 1, 1) and moe.w13_scale_inv.dtype == torch.float32
    tensors = load_file(os.path.join(fp8, "model.safetensors"))
    assert torch.equal(moe.w2.data[2].view(torch.uint8),
                       tensors["model.layers.1.mlp.experts.2.down_proj.weight"].view(torch.uint8))
    _, ref_logprobs, _ = _run(fp8, PROMPTS[:2])
    _assert_within_e4m3_roundings(logprobs, ref_logprobs)
    if os.environ.get("TRITON_INTERPRET") == "1":  # on a GPU host, tests/gpu/test_fp8_cuda.py runs them on CUDA
        _, triton_logprobs, _ = _run(fp8, PROMPTS[:2], enable_fp8_experts=True, moe_runner_backend="triton")
        for got, ref in zip(triton_logprobs, logprobs):  # the fused MoE's FP8 kernels in the interpreter
            torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="--enable-fp8-experts needs FP8 weights"):
        _run(tiny_checkpoint("qwen3_5_moe"), PROMPTS[:1], enable_fp8_experts=True)


def test_stacked_shared_expert_in_fp8(tiny_checkpoint, tmp_path):
    """A shared expert as wide as the routed ones loads from its FP8 tensors into the last slot of the
    expert stack: dequantized into --dtype, or kept e4m3 with the routed experts (--enable-fp8-experts,
    its down projection byte for byte as stored); both serve within the e4m3 roundings of each other."""
    from hybrid_sgl.layers.moe import SparseMoE

    path = tiny_checkpoint("qwen3_5_moe", shared_expert_intermediate_size=TINY_MOE["moe_intermediate_size"])
    fp8 = convert(path, str(tmp_path / "fp8"), experts=True)
    tensors = load_file(os.path.join(fp8, "model.safetensors"))
    shared = "model.layers.1.mlp.shared_expert.down_proj.weight"
    assert tensors[shared].dtype == FP8_DTYPE
    _, ref_logprobs, model = _run(fp8, PROMPTS[:2])
    moe = [m for m in model.modules() if isinstance(m, SparseMoE)][1]
    assert moe.stacked_shared and moe.w13.dtype == torch.float32
    assert torch.equal(moe.w2.data[-1], dequantize_fp8(tensors[shared], tensors[shared + "_scale_inv"]))
    _, logprobs, model = _run(fp8, PROMPTS[:2], enable_fp8_experts=True)
    moe = [m for m in model.modules() if isinstance(m, SparseMoE)][1]
    assert moe.w2.dtype == FP8_DTYPE and moe.w2.shape[0] == moe.spec.num_experts + 1
    assert torch.equal(moe.w2.data[-1].view(torch.uint8), tensors[shared].view(torch.uint8))
    _assert_within_e4m3_roundings(logprobs, ref_logprobs)
