"""The MTP layer of the bundled default model in plain PyTorch, for training and checking it:
the layer hybrid_sgl/models/mtp.py serves, built from HF's own Qwen3_5RMSNorm and Qwen3_5DecoderLayer
(so the (1 + weight) norm convention and the weight names are the checkpoint's), its teacher-forced
passes over chained drafts (train_mtp.py's loss), the greedy drafts the runtime proposes
(runner/speculative.py), and loading / saving its `mtp.*` tensors."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

# ---- the layer ---------------------------------------------------------------------------------------

class MTPLayer(nn.Module):
    """The MTP layer; parameter names are the checkpoint's below `mtp.`."""

    def __init__(self, config, layer_idx: int):
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(hidden, eps=eps)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(config, layer_idx)])
        self.norm = Qwen3_5RMSNorm(hidden, eps=eps)
        assert self.layers[0].block_type == "full_attention"

    def forward(self, embedded: torch.Tensor, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                past: list | None = None, mask: torch.Tensor | None = None):
        """embedded, hidden [B, T, H]; rope: (cos, sin) of the entries' positions. past: the (key, value)
        of earlier passes that these entries may see through `mask` [T, T_past + T] (True: attends);
        None: one causal pass. Returns (out [B, T, H] after the final norm, this pass's (key, value))."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden)], dim=-1))
        layer = self.layers[0]
        attn_out, kv = attention(layer.self_attn, layer.input_layernorm(x), rope, past, mask)
        x = x + attn_out
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x), kv


def attention(attn, h: torch.Tensor, rope, past, mask):
    """HF's Qwen3_5Attention.forward (gated output, q/k norms, partial rotary), with keys and values of
    earlier passes in front of this one's."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb

    b, t, _ = h.shape
    hd = attn.head_dim
    q, gate = torch.chunk(attn.q_proj(h).view(b, t, -1, hd * 2), 2, dim=-1)
    gate = gate.reshape(b, t, -1)
    q = attn.q_norm(q).transpose(1, 2)
    k = attn.k_norm(attn.k_proj(h).view(b, t, -1, hd)).transpose(1, 2)
    v = attn.v_proj(h).view(b, t, -1, hd).transpose(1, 2)
    cos, sin = rope
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    keys, values = k, v
    if past:
        keys = torch.cat([pk for pk, _ in past] + [k], dim=2)
        values = torch.cat([pv for _, pv in past] + [v], dim=2)
    groups = q.shape[1] // k.shape[1]
    keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=mask is None, scale=attn.scaling)
    out = out.transpose(1, 2).reshape(b, t, -1) * torch.sigmoid(gate)
    return attn.o_proj(out), (k, v)


def chain_mask(t: int, step: int, device) -> torch.Tensor:
    """Draft `step` (2..K) of anchors 0..t-1: keys are the first pass's t entries, then drafts 2..step's
    t each. Anchor i sees first-pass entries j <= i and its own drafts 2..step (the runtime's KV then)."""
    blocks = [torch.ones(t, t, dtype=torch.bool, device=device).tril()]
    blocks += [torch.eye(t, dtype=torch.bool, device=device)] * (step - 1)
    return torch.cat(blocks, dim=1)


def last_full_attention_layer(config) -> int:
    return max(i for i, kind in enumerate(config.layer_types) if kind == "full_attention")


def build_mtp(base, init: str, seed: int) -> MTPLayer:
    config = base.config
    idx = last_full_attention_layer(config)
    torch.manual_seed(seed)
    mtp = MTPLayer(config, idx)
    mtp.apply(base._init_weights)  # HF's init: normal(0, initializer_range) linears, zero (= identity) norms
    if init == "copy":
        mtp.layers[0].load_state_dict(base.model.layers[idx].state_dict())
    return mtp.to(next(base.parameters()).device)


# ---- the frozen model and the MTP passes ---------------------------------------------------------------

@torch.no_grad()
def target_pass(base, ids: torch.Tensor):
    """The frozen model over ids [B, L]: (final hidden states after its norm [B, L, H], logits [B, L, V])."""
    hidden = base.model(input_ids=ids, use_cache=False).last_hidden_state
    return hidden, base.lm_head(hidden)


def mtp_passes(mtp: MTPLayer, base, ids: torch.Tensor, hidden: torch.Tensor, t: int, steps: int) -> list[torch.Tensor]:
    """Logits of drafts 1..steps [B, t, V] for anchors 0..t-1 of ids [B, >= t + steps]: draft s of anchor
    i reads x_{i+s} (teacher forced) and predicts x_{i+s+1}."""
    embed, rotary = base.model.embed_tokens, base.model.rotary_emb
    b = ids.shape[0]
    h, past, logits = hidden[:, :t], [], []
    for s in range(1, steps + 1):
        positions = (torch.arange(t, device=ids.device) + s - 1).expand(b, t)
        rope = rotary(h, positions)
        mask = None if s == 1 else chain_mask(t, s, ids.device)
        h, kv = mtp(embed(ids[:, s:s + t]), h, rope, past, mask)
        past.append(kv)
        logits.append(base.lm_head(h))
    return logits


@torch.no_grad()
def chained_drafts(mtp: MTPLayer, base, ids: list[int], k: int) -> list[int]:
    """The k greedy drafts the runtime proposes after ids (runner/speculative.py): one pass over the
    entries of ids (entry i: token ids[i + 1], the model's hidden state at i), then one-entry passes
    that feed the MTP layer's own output back, at the positions after the last entry."""
    dev = next(mtp.parameters()).device
    x = torch.tensor([ids], device=dev)
    n = x.shape[1] - 1
    embed, rotary = base.model.embed_tokens, base.model.rotary_emb
    hidden, _ = target_pass(base, x[:, :-1])
    h, kv = mtp(embed(x[:, 1:]), hidden, rotary(hidden, torch.arange(n, device=dev)[None]))
    keys, values = kv
    h = h[:, -1:]
    drafts = [base.lm_head(h)[0, -1].argmax().item()]
    for s in range(1, k):
        token = torch.tensor([[drafts[-1]]], device=dev)
        rope = rotary(h, torch.tensor([[n - 1 + s]], device=dev))
        mask = torch.ones(1, keys.shape[2] + 1, dtype=torch.bool, device=dev)
        h, (k_new, v_new) = mtp(embed(token), h, rope, [(keys, values)], mask)
        keys, values = torch.cat([keys, k_new], 2), torch.cat([values, v_new], 2)
        drafts.append(base.lm_head(h)[0, -1].argmax().item())
    return drafts


def load_mtp(base, path: str) -> MTPLayer:
    """The MTP layer of a checkpoint folder (its model.safetensors) or of an mtp.safetensors, in float32."""
    from safetensors.torch import load_file

    file = os.path.join(path, "model.safetensors") if os.path.isdir(path) else path
    tensors = {k[len("mtp."):]: v.float() for k, v in load_file(file).items() if k.startswith("mtp.")}
    mtp = MTPLayer(base.config, last_full_attention_layer(base.config))
    mtp.load_state_dict(tensors)
    return mtp.to(next(base.parameters()).device).eval()


def mtp_tensors(mtp: MTPLayer, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {f"mtp.{k}": v.detach().to("cpu", dtype).contiguous() for k, v in mtp.state_dict().items()}
