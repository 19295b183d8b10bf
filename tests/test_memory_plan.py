"""plan_memory on the real shapes (configs/), with a budget like an 80 GB card's after the weights (48.25 GiB:
the 9B's on one H100). The prefix cache keeps the running slots the plan has without it, so that prompts that
share nothing run as many at once; snapshots and KV pages split what they leave. Before, the cache took half of
Nemotron-H-8B's state slots from the running requests, and 256 unrelated prompts ran 28 % slower with it."""

import logging
import os

import pytest
import torch

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.memory.memory_plan import StateShapes, plan_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 2**30


def _plan(name: str, budget_gib: float = 48.25, **kw):
    config = ModelConfig.from_hf(os.path.join(ROOT, "configs", name))
    conv, ssm = config.recurrent_state_shapes()
    state = StateShapes(num_layers=len(config.state_layers), conv_shape=conv, conv_dtype=torch.bfloat16,
                        ssm_shape=ssm, ssm_dtype=torch.float32)
    args = dict(config=config, state=state, kv_dtype=torch.bfloat16, budget_bytes=int(budget_gib * GIB), on_gpu=True,
                page_size=16, context_length=8192, max_running_requests=None, max_total_tokens=None, prefix_cache=True)
    return plan_memory(**{**args, **kw})


@pytest.mark.parametrize("name", ["qwen3_5-9b-text", "nemotron_h-8b", "falcon_h1-7b"])
def test_the_cache_keeps_the_running_slots_and_splits_the_rest(name):
    plan, no_cache = _plan(name), _plan(name, prefix_cache=False)
    assert plan.max_running_requests == no_cache.max_running_requests >= 64, plan.describe()
    assert no_cache.num_snapshots == 0 and plan.num_snapshots >= 64, plan.describe()
    running = plan.max_running_requests * plan.state_bytes_per_request
    snapshots = plan.num_snapshots * plan.state_bytes_per_request
    kv = plan.num_pages * plan.page_size * plan.kv_bytes_per_token
    assert running + snapshots + kv <= plan.budget_bytes
    # the snapshots take the ratio's share (0.9 / 1.9) of what the running slots leave: one more would not fit
    share = 0.9 / 1.9 * (plan.budget_bytes - running)
    assert snapshots <= share < snapshots + plan.state_bytes_per_request
    assert kv > plan.budget_bytes - running - share - plan.page_size * plan.kv_bytes_per_token


def test_nemotron_on_an_80_gb_card():
    plan = _plan("nemotron_h-8b")
    assert (plan.max_running_requests, plan.num_snapshots) == (253, 120)
    no_cache = _plan("nemotron_h-8b", prefix_cache=False)
    assert (no_cache.max_running_requests, no_cache.num_snapshots) == (253, 0)


def test_running_requests_given_are_kept_and_a_plan_without_snapshots_is_said(caplog):
    plan = _plan("nemotron_h-8b", max_running_requests=250)
    assert plan.max_running_requests == 250 and plan.num_snapshots > 0
    with caplog.at_level(logging.WARNING, logger="hybrid_sgl.memory.memory_plan"):
        plan = _plan("nemotron_h-8b", max_running_requests=250, max_mamba_cache_size=250)
    assert (plan.max_running_requests, plan.num_snapshots) == (250, 0)
    assert "no snapshot slot" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hybrid_sgl.memory.memory_plan"):
        _plan("nemotron_h-8b")
        _plan("nemotron_h-8b", prefix_cache=False)
    assert "no snapshot slot" not in caplog.text


def test_max_mamba_cache_size_sets_the_slots_in_all():
    plan = _plan("nemotron_h-8b", max_mamba_cache_size=300)
    assert plan.max_running_requests + plan.num_snapshots == 300
