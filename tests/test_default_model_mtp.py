"""The bundled default model's MTP layer (configs/default-model `mtp.*`, trained by
tools/default_model/train_mtp.py): the checkpoint serves it with --speculative-algorithm NEXTN, greedy
output equals plain decoding token for token, its drafts are accepted (accept length > 1), and the
drafts our runtime proposes are the ones the training script's layer (HF modules, float32) proposes."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from safetensors import safe_open

from hybrid_sgl.engine import Engine
from hybrid_sgl.runner.speculative import SpecDecoder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKPOINT = os.path.join(ROOT, "configs", "default-model")
PROMPTS = ["ROMEO:\nWhat light through yonder window breaks?\n", "And God said, Let there be light: and"]
BASE = dict(device="cpu", dtype="float32", log_level="warning")
SPEC = dict(speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_eagle_topk=1,
            speculative_num_draft_tokens=4)
GREEDY = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(CHECKPOINT, "model.safetensors")),
    reason="configs/default-model/model.safetensors is absent: train it with tools/default_model (README there)")


def test_checkpoint_holds_one_mtp_layer():
    with open(os.path.join(CHECKPOINT, "config.json")) as f:
        assert json.load(f)["mtp_num_hidden_layers"] == 1
    with safe_open(os.path.join(CHECKPOINT, "model.safetensors"), "pt") as f:
        keys = f.keys()
    names = {k for k in keys if k.startswith("mtp.")}
    assert {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
            "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.down_proj.weight"} <= names


def test_nextn_greedy_equals_plain_and_drafts_are_accepted_and_match_the_training_layer(monkeypatch):
    with Engine(model_path=CHECKPOINT, **BASE) as engine:
        assert engine.runner.model.mtp is None
        plain = [o["output_ids"] for o in engine.generate(PROMPTS, GREEDY)]
        prompt_ids = [engine.tokenizer.encode(p) for p in PROMPTS]

    first_drafts = {}  # prompt length -> (the entries' tokens, the drafts proposed after the prompt step)
    draft = SpecDecoder.draft

    def recording(self, entries):
        out = draft(self, entries)
        for e, d in zip(entries, out):
            if e.start == 0 and e.want:
                first_drafts[len(e.tokens)] = (list(e.tokens), d)
        return out

    monkeypatch.setattr(SpecDecoder, "draft", recording)
    with Engine(model_path=CHECKPOINT, **BASE, **SPEC) as engine:
        assert len(engine.runner.model.mtp.layers) == 1
        outs = engine.generate(PROMPTS, GREEDY)
        accept = engine.stats()["avg_spec_accept_length"]
        engine.check_integrity()
    assert [o["output_ids"] for o in outs] == plain
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in outs)
    assert accept > 1.0, accept

    sys.path.insert(0, os.path.join(ROOT, "tools", "default_model"))
    from mtp_layer import chained_drafts, load_mtp
    from transformers import Qwen3_5ForCausalLM

    base = Qwen3_5ForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.float32).eval()
    mtp = load_mtp(base, CHECKPOINT)
    for ids, out in zip(prompt_ids, plain):
        tokens, drafts = first_drafts[len(ids)]
        assert tokens == ids[1:] + out[:1]
        assert drafts == chained_drafts(mtp, base, ids + out[:1], 3)
