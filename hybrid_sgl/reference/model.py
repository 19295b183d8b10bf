"""The reference composed hybrid: HF transformers' modules (see `blocks.py`) wired in plain PyTorch.

A standard nn.Module: `forward(input_ids, labels=None)` returns transformers' CausalLMOutput (loss
when labels are given, HF's shift-by-one convention, -100 ignored), so it trains with any PyTorch
loop. Its parameter names are the checkpoint's (`hybrid_sgl.models.composed` lists them);
`save_pretrained(path)` writes config.json + model.safetensors that the runtime serves unchanged,
and `load_reference(path)` reads them back. It keeps no cache: `generate` recomputes the whole
sequence at every step, which is what an oracle needs."""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_sgl.config import KV_MIXERS
from hybrid_sgl.config.composed import ARCHITECTURE, MODEL_TYPE, layer_plan
from hybrid_sgl.reference.blocks import Blocks


class ReferenceLayer(nn.Module):
    """x + mixer(norm(x)), then x + mlp(norm(x)); a "none" half is absent. Module names are the
    checkpoint's: self_attn, linear_attn or mamba (both for attention_mamba2); mlp."""

    def __init__(self, blocks: Blocks, mixer: str, ffn: str):
        super().__init__()
        self.input_layernorm = blocks.norm() if mixer != "none" else None
        self.self_attn = blocks.attention() if mixer in KV_MIXERS else None
        self.linear_attn = blocks.gdn() if mixer == "linear_attention" else None
        self.mamba = None
        if mixer in ("mamba2", "attention_mamba2"):
            self.mamba = blocks.mamba2()
        elif mixer == "mamba":
            self.mamba = blocks.mamba()
        self.post_attention_layernorm = blocks.norm() if ffn != "none" else None
        self.mlp = None
        if ffn != "none":
            self.mlp = blocks.moe() if ffn == "moe" else blocks.mlp()

    def forward(self, x: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """x: [B, T, H] -> [B, T, H]."""
        if self.input_layernorm is not None:
            h = self.input_layernorm(x)
            if self.self_attn is not None:
                x = x + self.self_attn(hidden_states=h, position_embeddings=position_embeddings,
                                       attention_mask=None)[0]
            if self.mamba is not None:
                x = x + self.mamba(h)
            if self.linear_attn is not None:
                x = x + self.linear_attn(h)
        if self.mlp is not None:
            x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class ReferenceBackbone(nn.Module):
    def __init__(self, config: dict, blocks: Blocks):
        super().__init__()
        plan = layer_plan(config)
        self.embed_tokens = nn.Embedding(config["vocab_size"], config["hidden_size"])
        self.layers = nn.ModuleList(ReferenceLayer(blocks, mixer, ffn) for mixer, ffn in plan)
        self.norm = blocks.norm()
        has_attention = any(m in KV_MIXERS for m, _ in plan)
        self.rotary_emb = blocks.rotary() if has_attention else None

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [B, T] -> final hidden states [B, T, H]."""
        x = self.embed_tokens(input_ids)
        position_embeddings = None
        if self.rotary_emb is not None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand(input_ids.shape[0], -1)
            position_embeddings = self.rotary_emb(x, positions)
        for layer in self.layers:
            x = layer(x, position_embeddings)
        return self.norm(x)


class HybridSGLReference(nn.Module):
    def __init__(self, config: dict):
        """config: the composed hybrid's config.json as a dict (model_type "hybrid_sgl")."""
        super().__init__()
        if config.get("model_type") != MODEL_TYPE:
            raise ValueError(f"model_type is {config.get('model_type')!r}; the reference builds {MODEL_TYPE!r} configs")
        self.config = dict(config, architectures=[ARCHITECTURE])
        blocks = Blocks(self.config)
        self.model = ReferenceBackbone(self.config, blocks)
        self.lm_head = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)
        blocks.init_weights(self, config.get("initializer_range", 0.02))
        if self.tied:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def tied(self) -> bool:
        return bool(self.config.get("tie_word_embeddings", False))

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None):
        """input_ids, labels: [B, T] -> CausalLMOutput(loss (scalar, when labels), logits [B, T, V])."""
        from transformers.modeling_outputs import CausalLMOutput

        logits = self.lm_head(self.model(input_ids))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    @torch.no_grad()
    def generate(self, input_ids: list[int], max_new_tokens: int) -> list[int]:
        """Greedy continuation of one prompt (the new tokens), recomputing the full sequence each step."""
        ids = list(input_ids)
        device = self.lm_head.weight.device
        for _ in range(max_new_tokens):
            logits = self(torch.tensor([ids], device=device)).logits[0, -1]
            ids.append(int(logits.argmax()))
        return ids[len(input_ids):]

    def save_pretrained(self, path: str) -> str:
        """Write config.json and model.safetensors (the checkpoint's names) into `path`."""
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        dtype = next(self.parameters()).dtype
        config = dict(self.config, dtype=str(dtype).removeprefix("torch."))
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        tensors = {name: t.detach().contiguous() for name, t in self.state_dict().items()
                   if not (self.tied and name == "lm_head.weight")}
        save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        return path


def load_reference(path: str, dtype: torch.dtype = torch.float32,
                   device: str | torch.device = "cpu") -> HybridSGLReference:
    """The reference model saved in checkpoint folder `path` (config.json + *.safetensors)."""
    from safetensors.torch import load_file

    from hybrid_sgl.models.loader import checkpoint_files

    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    model = HybridSGLReference(config)
    state = {}
    for file in checkpoint_files(path):
        state.update(load_file(file))
    if model.tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match its config.json: missing {missing[:8]}, "
                         f"unexpected {unexpected[:8]}")
    return model.to(device=device, dtype=dtype).eval()
