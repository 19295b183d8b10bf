"""What every hybrid causal LM shares: embedding, a stack of layers driven by the layer plan, the
final norm and the LM head, weight-name dispatch, and the per-layer dispatch report.

Layers follow one protocol: `layer(x, residual, fb) -> (x, residual)`, where `x` is the layer's
output delta and `residual` the stream before it (None entering layer 0); each layer adds the
two in its first fused add+RMSNorm, and the final norm adds the last pair."""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from hybrid_sgl.batch import ForwardBatch
from hybrid_sgl.config import ModelConfig
from hybrid_sgl.layers.backends import Backends
from hybrid_sgl.layers.linear import ParallelLMHead, VocabParallelEmbedding

_LAYER = re.compile(r"layers\.(\d+)\.(\w+)\.(.+)")


class HybridCausalLM(nn.Module):
    """Subclasses fill `self.layers` and implement `load_layer_weight`; they may change
    `embedding_scale` / `logits_scale` (Granite, Falcon-H1 multipliers), the checkpoint names of the
    embedding and the final norm, and `skipped_prefixes`."""

    skipped_prefixes: tuple[str, ...] = ()
    tensor_parallel = False  # True once every layer the family builds splits over ranks (layers/linear.py)
    embed_name = "embed_tokens.weight"
    final_norm_names: tuple[str, ...] = ("norm.weight",)

    def __init__(self, config: ModelConfig, backends: Backends, final_norm: nn.Module):
        super().__init__()
        self.config = config
        self.backends = backends
        self.embed = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList()
        self.norm = final_norm
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.embedding_scale = 1.0
        self.logits_scale = 1.0
        self.mtp: nn.Module | None = None  # the draft layer of speculative decoding (models/mtp.py), if built

    @classmethod
    def check_tensor_parallel(cls, config: ModelConfig, size: int) -> None:
        """Raise ValueError, naming the cause, when this family cannot run with --tp-size `size` (> 1)."""
        if not cls.tensor_parallel:
            raise ValueError(f"{config.architecture} does not support tensor parallelism yet (--tp-size {size}): "
                             "serve it with --tp-size 1")

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Returns the final hidden states [T, H] (normalized)."""
        x, residual = self.embed(fb.input_ids), None
        if self.embedding_scale != 1.0:
            x = x * self.embedding_scale
        for layer in self.layers:
            x, residual = layer(x, residual, fb)
        return self.norm.add(x, residual)[0]

    def draft_hidden(self, input_ids: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """The MTP layer over entries (token at i + 1, the final hidden state at i): [T], [T, H] -> [T, H]."""
        x = self.embed(input_ids)
        if self.embedding_scale != 1.0:
            x = x * self.embedding_scale
        return self.mtp(x, hidden, fb)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, H] -> logits [N, V] float32 (gathered from every rank under tensor parallelism)."""
        logits = self.lm_head(hidden).float()
        return logits * self.logits_scale if self.logits_scale != 1.0 else logits

    def dispatch_plan(self) -> list[str]:
        """One line per layer: index, mixer, ffn, backend."""
        lines = []
        ffn_backends = {"moe": self.backends.moe, "mlp": self.backends.dense}
        for i, (mixer, ffn) in enumerate(self.config.layer_plan):
            ffn_backend = ffn_backends[ffn].name if ffn in ffn_backends else "-"
            lines.append(f"layer {i:3d}: {mixer:<16} [{self.backends.of_mixer(mixer)}]  ffn {ffn:<4} [{ffn_backend}]")
        return lines

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Consume (checkpoint name, tensor) pairs; names are the HF checkpoint's."""
        prefix = self.config.weight_prefix
        for name, tensor in weights:
            if self.mtp is not None and name.startswith("mtp."):
                self.mtp.load_weight(name[len("mtp."):], tensor)
                continue
            if name.startswith(self.skipped_prefixes):
                continue
            if name.startswith(prefix):
                name = name[len(prefix):]
            elif not name.startswith("lm_head."):
                raise KeyError(f"unexpected checkpoint tensor {name!r}")
            if name == "lm_head.weight":
                if not self.config.tie_word_embeddings:
                    self.lm_head.load(tensor)
            else:
                self.load_weight(name, tensor)

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """One tensor, `name` relative to the weight prefix (lm_head handled already): the embedding,
        the final norm, or `layers.{i}.{part}.{rest}`, which goes to load_layer_weight."""
        try:
            if name == self.embed_name:
                self.embed.load(tensor)
            elif name in self.final_norm_names:
                self.norm.weight.data.copy_(tensor)
            elif m := _LAYER.fullmatch(name):
                self.load_layer_weight(self.layers[int(m.group(1))], m.group(2), m.group(3), tensor)
            else:
                raise KeyError(name)
        except KeyError:
            raise KeyError(name) from None

    def load_layer_weight(self, layer: nn.Module, part: str, rest: str, tensor: torch.Tensor) -> None:
        """`rest` of the layer's checkpoint sub-module `part`; KeyError when the name is unknown."""
        raise NotImplementedError
