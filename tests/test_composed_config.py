"""The composed hybrid's config format: the layer plan and per-kind sections, errors that name the
missing piece, the packed state layout, and the real-shape config (parameters counted on the meta
device by both the reference and the serving model)."""

import json
from pathlib import Path

import pytest
import torch

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.config.composed import parse_config
from hybrid_sgl.testing.tiny_composed import tiny_config

REAL_SHAPE = Path(__file__).resolve().parents[1] / "configs" / "hybrid-sgl-8b"


def test_tiny_config_plan_and_specs():
    c = parse_config(tiny_config(), [])
    assert c.architecture == "HybridSGLForCausalLM" and c.norm_offset == 1.0
    assert c.kv_layers == [1, 4] and c.state_layers == [0, 2, 3, 4, 5]
    assert c.attention.rotary_dim == 8 and c.attention.output_gate and c.attention.qk_norm
    assert (c.gdn.num_k_heads, c.gdn.num_v_heads, c.gdn.conv_dim) == (2, 4, 128)
    assert (c.mamba2.num_heads, c.mamba2.head_dim, c.mamba2.conv_dim) == (8, 16, 192)
    assert (c.mamba.intermediate_size, c.mamba.dt_rank) == (128, 4)
    assert c.moe.shared_expert_gate and c.moe.norm_topk_prob and c.intermediate_size == 96
    assert c.state_shapes_of("linear_attention") == ((3, 128), (4, 16, 16))
    assert c.state_shapes_of("mamba") == ((3, 128), (128, 8))
    assert c.recurrent_state_shapes() == ((1, 3 * 192), (8 * 16 * 16,))


def test_sections_are_needed_only_for_kinds_in_use():
    c = parse_config(tiny_config(mixer_types=["mamba", "none"], ffn_types=["none", "mlp"], full_attention=None,
                                 linear_attention=None, mamba2=None, moe=None), [])
    assert c.layer_plan == (("mamba", "none"), ("none", "mlp")) and c.kv_layers == []
    assert c.gdn is None and c.mamba2 is None and c.moe is None
    assert c.recurrent_state_shapes() == ((1, 3 * 128), (128 * 8,))


@pytest.mark.parametrize("change, message", [
    (dict(mixer_types=["mamba2", "full_attention"], ffn_types=["mlp"]), "same length"),
    (dict(mixer_types=["mamba3"], ffn_types=["mlp"]), "not a layer kind"),
    (dict(mixer_types=["none"], ffn_types=["none"]), "neither a mixer nor an FFN"),
    (dict(mamba=None), "no 'mamba' section"),
    (dict(moe={"num_experts": 4}), "'moe' lacks num_experts_per_tok"),
    (dict(full_attention={**tiny_config()["full_attention"], "rope_parameters": {"rope_theta": 1e4}}),
     "partial_rotary_factor"),
    (dict(moe={**tiny_config()["moe"], "shared_expert_intermediate_size": 0}), "shared expert"),
    (dict(hidden_act="gelu"), "hidden_act"),
])
def test_config_errors_name_the_cause(change, message):
    with pytest.raises(ValueError, match=message):
        parse_config(tiny_config(**change), [])


def test_num_hidden_layers_must_match_the_plan():
    with pytest.raises(ValueError, match="num_hidden_layers=3"):
        parse_config({**tiny_config(), "num_hidden_layers": 3}, [])


def test_real_shape_config_counts_the_same_parameters_in_reference_and_server():
    import sys

    sys.modules.setdefault("fla", None)
    from hybrid_sgl.layers.backends import resolve_backends
    from hybrid_sgl.models.registry import model_class
    from hybrid_sgl.reference import HybridSGLReference

    c = ModelConfig.from_hf(str(REAL_SHAPE))
    kinds = [m for m, _ in c.layer_plan]
    assert {k: kinds.count(k) for k in set(kinds)} == {"mamba2": 12, "linear_attention": 8, "full_attention": 8,
                                                        "mamba": 4}
    assert c.recurrent_state_shapes() == ((1, 3 * (8192 + 2 * 8 * 128)), (128 * 64 * 128,))
    with torch.device("meta"):
        reference = HybridSGLReference(json.loads((REAL_SHAPE / "config.json").read_text()))
        backends = resolve_backends(c, "cpu", attention="torch", linear_attention="torch", moe="torch")
        served = model_class(c)(c, backends, 4096)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(reference) == count(served)
    assert 8.5e9 < count(served) < 9e9
