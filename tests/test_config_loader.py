"""ModelConfig.from_hf (layer plan and normalized fields) and the safetensors loader."""

import json
import shutil

import pytest
import torch

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.models.loader import checkpoint_files, iter_checkpoint


def test_layer_plans_and_fields(tiny_checkpoint):
    dense = ModelConfig.from_hf(tiny_checkpoint("qwen3_5"))
    assert dense.layer_plan == (("linear_attention", "mlp"),) * 3 + (("full_attention", "mlp"),)
    assert dense.gdn.conv_dim == 2 * 2 * 16 + 4 * 16 and dense.moe is None
    assert dense.attention.rotary_dim == 4 and dense.attention.output_gate and dense.norm_offset == 1.0
    assert dense.eos_token_ids[0] == 2 and dense.weight_prefix == "model."
    vl = ModelConfig.from_hf(tiny_checkpoint("qwen3_5_vl"))
    assert vl.layer_plan == dense.layer_plan and vl.weight_prefix == "model.language_model."
    moe = ModelConfig.from_hf(tiny_checkpoint("qwen3_5_moe"))
    assert {ffn for _, ffn in moe.layer_plan} == {"moe"} and moe.moe.shared_expert_intermediate_size == 48
    nxt = ModelConfig.from_hf(tiny_checkpoint("qwen3_next", decoder_sparse_step=2, mlp_only_layers=[3]))
    assert [ffn for _, ffn in nxt.layer_plan] == ["mlp", "moe", "mlp", "mlp"]


def test_full_attention_interval_default(tmp_path, tiny_checkpoint):
    with open(f"{tiny_checkpoint('qwen3_5')}/config.json") as f:
        cfg = json.load(f)
    cfg.pop("layer_types")
    cfg["num_hidden_layers"] = 8
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    plan = ModelConfig.from_hf(str(tmp_path)).layer_plan
    assert [m for m, _ in plan] == ["linear_attention"] * 3 + ["full_attention"] + \
        ["linear_attention"] * 3 + ["full_attention"]


def test_unsupported_architecture_lists_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match=r"unsupported model.*gpt2.*supported model types: .*qwen3_next"):
        ModelConfig.from_hf(str(tmp_path))


def test_sharded_checkpoint_loads_tensor_by_tensor(tmp_path, tiny_checkpoint):
    """A sharded save (model.safetensors.index.json) gives the same tensors as the single file."""
    import transformers as tf

    src = tiny_checkpoint("qwen3_next")
    model = tf.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert len(checkpoint_files(str(tmp_path))) > 2
    single = dict(iter_checkpoint(src, progress=False))
    sharded = dict(iter_checkpoint(str(tmp_path), progress=False))
    assert single.keys() == sharded.keys()
    assert all(torch.equal(single[k], sharded[k]) for k in single)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(f"{src}/{name}", tmp_path / name)
    from hybrid_sgl import Engine

    with Engine(model_path=str(tmp_path), device="cpu", dtype="float32", log_level="warning") as a, \
            Engine(model_path=src, device="cpu", dtype="float32", log_level="warning") as b:
        params = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
        assert a.generate("Hello there", params)["output_ids"] == b.generate("Hello there", params)["output_ids"]


def test_missing_tensor_is_reported(tmp_path, tiny_checkpoint):
    from safetensors.torch import load_file, save_file

    src = tiny_checkpoint("qwen3_5")
    tensors = load_file(f"{src}/model.safetensors")
    tensors.pop("model.layers.1.linear_attn.in_proj_b.weight")
    save_file(tensors, tmp_path / "model.safetensors")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{src}/{name}", tmp_path / name)
    from hybrid_sgl import Engine

    with pytest.raises(ValueError, match=r"did not provide: layers\.1\.mixer\.in_proj\.weight"):
        Engine(model_path=str(tmp_path), device="cpu", log_level="warning")


def test_bfloat16_runs_close_to_float32(tiny_checkpoint):
    from hybrid_sgl import Engine

    path = tiny_checkpoint("qwen3_5_moe", forgetful=True)  # (bf16 rounding carried by a remembered state: more)
    params = {"temperature": 0, "max_new_tokens": 1}
    with Engine(model_path=path, device="cpu", dtype="float32", log_level="warning") as f32, \
            Engine(model_path=path, device="cpu", dtype="bfloat16", log_level="warning") as bf16:
        a = f32.generate("The capital of France", params, return_logprob=True, logprob_start_len=0)
        b = bf16.generate("The capital of France", params, return_logprob=True, logprob_start_len=0)
    lp_a = torch.tensor([x[0] for x in a["meta_info"]["input_token_logprobs"][1:]])
    lp_b = torch.tensor([x[0] for x in b["meta_info"]["input_token_logprobs"][1:]])
    assert (lp_a - lp_b).abs().max() < 0.1
