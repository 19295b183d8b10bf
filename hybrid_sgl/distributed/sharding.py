"""How heads split over tensor-parallel ranks (HF / SGLang semantics), in one place.

Layers ask here which of a weight's heads a rank keeps; the memory plan asks for the per-rank
config (`local_config`), whose head counts size the KV pages and state slots. A count that does
not divide is refused with the counts named.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hybrid_sgl.config import AttentionSpec, GDNSpec, Mamba2Spec, ModelConfig


@dataclass(frozen=True)
class HeadSplit:
    """`total` heads over the ranks: each rank keeps `local` consecutive heads; `replicas` ranks in a
    row keep the same ones (1 when the heads are split, > 1 when there are fewer heads than ranks)."""

    total: int
    local: int
    replicas: int = 1

    def first(self, rank: int) -> int:
        """Index of the first head rank `rank` keeps."""
        return (rank // self.replicas) * self.local


def split_heads(count: int, size: int, what: str, replicate: bool = False) -> HeadSplit:
    """Split `count` heads over `size` ranks; with `replicate`, fewer heads than ranks are copied
    (each rank keeps one) when size is a multiple of count."""
    if count % size == 0:
        return HeadSplit(count, count // size)
    if replicate and count < size and size % count == 0:
        return HeadSplit(count, 1, size // count)
    need = f"a multiple of {size}" + (f" or a divisor of {size}" if replicate else "")
    raise ValueError(f"{what} is {count}, which does not split over --tp-size {size} (it must be {need}): "
                     "choose a --tp-size that divides it (or --tp-size 1)")


def replicated(size: int) -> HeadSplit:
    """One block every rank keeps whole."""
    return HeadSplit(1, 1, size)


def attention_splits(spec: AttentionSpec, size: int) -> tuple[HeadSplit, HeadSplit]:
    """(q heads, KV heads): q heads split; KV heads split, or replicated when fewer than the ranks."""
    q = split_heads(spec.num_heads, size, "num_attention_heads")
    kv = split_heads(spec.num_kv_heads, size, "num_key_value_heads", replicate=True)
    if q.local % kv.local:
        raise ValueError(f"{spec.num_heads} attention heads and {spec.num_kv_heads} KV heads leave {q.local} q heads "
                         f"and {kv.local} KV heads per rank at --tp-size {size}: choose a --tp-size that divides both "
                         "(or --tp-size 1)")
    return q, kv


def gdn_splits(spec: GDNSpec, size: int) -> tuple[HeadSplit, HeadSplit]:
    """(key heads, value heads) of Gated DeltaNet: both split, so each rank's value heads read its key heads."""
    return (split_heads(spec.num_k_heads, size, "linear_num_key_heads"),
            split_heads(spec.num_v_heads, size, "linear_num_value_heads"))


def mamba2_splits(spec: Mamba2Spec, size: int) -> tuple[HeadSplit, HeadSplit]:
    """(heads, B / C groups) of Mamba2: heads split; groups split, or replicated when fewer than the ranks."""
    heads = split_heads(spec.num_heads, size, "mamba num_heads")
    groups = split_heads(spec.n_groups, size, "mamba n_groups", replicate=True)
    return heads, groups


def vocab_split(vocab_size: int, size: int) -> int:
    """Rows of the embedding / LM head per rank (the last rank's tail past vocab_size is padding)."""
    return -(-vocab_size // size)


def local_config(config: ModelConfig, size: int) -> ModelConfig:
    """The config one rank serves: its own attention, GDN and Mamba2 heads and Mamba-1 channels (what its
    KV pages and state slots hold). Raises when any count, the FFNs' included, does not split."""
    if size == 1:
        return config
    if any(ffn == "mlp" for _, ffn in config.layer_plan):
        split_heads(config.intermediate_size, size, "intermediate_size")
    if config.moe is not None:
        split_heads(config.moe.intermediate_size, size, "moe_intermediate_size")
        if config.moe.shared_expert_intermediate_size:
            split_heads(config.moe.shared_expert_intermediate_size, size, "shared_expert_intermediate_size")
    q, kv = attention_splits(config.attention, size)
    attention = dataclasses.replace(config.attention, num_heads=q.local, num_kv_heads=kv.local)
    gdn = config.gdn
    if gdn is not None:
        k, v = gdn_splits(gdn, size)
        gdn = dataclasses.replace(gdn, num_k_heads=k.local, num_v_heads=v.local)
    mamba2 = config.mamba2
    if mamba2 is not None:
        heads, groups = mamba2_splits(mamba2, size)
        mamba2 = dataclasses.replace(mamba2, num_heads=heads.local, n_groups=groups.local)
    mamba = config.mamba
    if mamba is not None:
        inner = split_heads(mamba.intermediate_size, size, "mamba intermediate_size (mamba_expand x hidden)")
        mamba = dataclasses.replace(mamba, intermediate_size=inner.local)
    return dataclasses.replace(config, attention=attention, gdn=gdn, mamba2=mamba2, mamba=mamba)
