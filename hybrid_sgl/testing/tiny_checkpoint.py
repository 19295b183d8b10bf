"""Tiny HF checkpoints of the supported families, saved with transformers' own save_pretrained,
with a small byte-level BPE tokenizer (ChatML special tokens and chat template)."""

from __future__ import annotations

import json
import os
import sys

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.",
    "Hybrid language models mix attention layers with recurrent state space layers and linear attention.",
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome.",
    "Once upon a time there was a small model that learned to count: one, two, three, four, five, six.",
    "Serving systems batch requests, page the key value cache, and keep recurrent state per request.",
    "Question: what is two plus two? Answer: four. Question: what color is the sky? Answer: blue.",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
    "Hello! How are you today? I am fine, thank you. Let us write some code and some poems together.",
]

# Small but non-degenerate dimensions; GQA on both attention and GDN heads.
TINY_DIMS = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                 linear_num_value_heads=4, linear_conv_kernel_dim=4, intermediate_size=96,
                 max_position_embeddings=4096, initializer_range=0.1)
TINY_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)

# Families built in their own module: "module:function", function(vocab_size, eos_token_id, **overrides)
# returns an initialized HF model (random weights) ready for save_pretrained.
FAMILY_BUILDERS = {
    "nemotron_h": "hybrid_sgl.testing.tiny_nemotron_h:build",
    "falcon_h1": "hybrid_sgl.testing.tiny_falcon_h1:build",
    "bamba": "hybrid_sgl.testing.tiny_bamba:build_bamba",
    "granitemoehybrid": "hybrid_sgl.testing.tiny_bamba:build_granite",
    "jamba": "hybrid_sgl.testing.tiny_jamba:build",
}


def make_tokenizer(path: str, vocab_size: int = 400):
    """Train a byte-level BPE on CORPUS and save it (tokenizer.json + config with chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return fast


def make_checkpoint(path: str, family: str = "qwen3_5", seed: int = 0, mtp: bool = False, forgetful: bool = False,
                    **overrides) -> str:
    """Save a randomly initialized tiny model of `family` with its tokenizer into `path`.

    family: qwen3_5 | qwen3_5_moe | qwen3_next | qwen3_5_vl | qwen3_5_moe_vl (the *ForConditionalGeneration
    checkpoints, whose text model we serve), or one of FAMILY_BUILDERS. mtp: also store a random MTP layer
    (`mtp.*`, as the published Qwen3.5 / Qwen3-Next checkpoints do; transformers builds none). forgetful: keep
    HF's gated-delta-rule decays, which forget the state within a token (see _randomize_gates)."""
    sys.modules.setdefault("fla", None)  # HF's torch path on CPU
    import torch
    import transformers as tf

    os.makedirs(path, exist_ok=True)
    tokenizer = make_tokenizer(path)
    eos = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    dims = {**TINY_DIMS, "vocab_size": len(tokenizer), "eos_token_id": eos[0], **overrides}
    torch.manual_seed(seed)
    if family in FAMILY_BUILDERS:
        import importlib

        module, _, name = FAMILY_BUILDERS[family].partition(":")
        model = getattr(importlib.import_module(module), name)(len(tokenizer), eos[0], **overrides)
    elif family == "qwen3_5":
        model = tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**dims))
    elif family == "qwen3_5_moe":
        model = tf.Qwen3_5MoeForCausalLM(tf.Qwen3_5MoeTextConfig(**{**TINY_MOE, **dims}))
    elif family == "qwen3_next":
        model = tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(**{**TINY_MOE, **dims}))
    elif family in ("qwen3_5_vl", "qwen3_5_moe_vl"):
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=dims["hidden_size"])
        if family == "qwen3_5_vl":
            model = tf.Qwen3_5ForConditionalGeneration(tf.Qwen3_5Config(text_config=dims, vision_config=vision))
        else:
            config = tf.Qwen3_5MoeConfig(text_config={**TINY_MOE, **dims}, vision_config=vision)
            model = tf.Qwen3_5MoeForConditionalGeneration(config)
    else:
        raise ValueError(f"unknown family {family!r}")
    _randomize_gates(model, seed, remember=not forgetful)
    model.save_pretrained(path)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eos, "do_sample": False}, f)
    if mtp:
        add_mtp_layer(path, seed)
    return path


def add_mtp_layer(path: str, seed: int) -> None:
    """Add one MTP layer to a saved Qwen3.5 / Qwen3-Next checkpoint: its decoder layer is a perturbed copy
    of the model's last full-attention layer (same names below `layers.N.`), with random fc and norms;
    config.json gets `mtp_num_hidden_layers: 1`."""
    import torch
    from safetensors.torch import load_file, save_file

    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    text = config.get("text_config", config)
    last = max(i for i, kind in enumerate(text["layer_types"]) if kind == "full_attention")
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    gen = torch.Generator().manual_seed(seed + 2)
    marker = f"layers.{last}."
    hidden = text["hidden_size"]
    for name, t in list(tensors.items()):
        if marker in name and not name.startswith("mtp."):
            rest = name.split(marker, 1)[1]
            tensors[f"mtp.layers.0.{rest}"] = t + torch.randn(t.shape, generator=gen, dtype=t.dtype) * 0.02
    tensors["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden, generator=gen) * 0.1
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        tensors[f"mtp.{norm}.weight"] = torch.randn(hidden, generator=gen) * 0.1
    save_file({k: v.contiguous() for k, v in tensors.items()}, file, metadata={"format": "pt"})
    text["mtp_num_hidden_layers"] = 1
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


def _randomize_gates(model, seed: int, remember: bool = True) -> None:
    """HF initializes norms to identity and A/dt to fixed ranges; perturb them so that a parity test
    also checks that every norm weight, decay and bias is read from the right place. The gated delta
    rule's A is drawn from [0.02, 0.5] instead of HF's [0, 16]: at HF's values most heads forget their
    state within a token (decay exp(-A softplus(a + dt_bias)) near zero), so a wrong state (a bad restore,
    a rollback to the wrong position) would hardly show in the tokens; here the decay lies in ~[0.5, 0.97]
    (remember=False: HF's)."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if remember and name.endswith("linear_attn.A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.02, 0.5, generator=gen).log())
            if "norm" in name or name.endswith(("dt_bias", "A_log", ".bias")):
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)
