"""The EAGLE-3 draft decoder in plain torch, with the official EAGLE weight names and shapes.

One decoder layer whose attention sees ``[input_layernorm(embed(token)); hidden_norm(h)]`` (2H wide),
where ``h`` is either ``fc(g)``, the fused target features ``g = [low; mid; high]`` (3 * H_target), or the
draft's own previous output. ``norm`` + ``lm_head`` give logits over the draft vocabulary, whose id ``i``
is target token ``i + d2t[i]``; ``t2d[t]`` tells whether target token ``t`` is in the draft vocabulary.
The token embedding is the target's (frozen, shared): it is attached, not owned.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .kv import additive_mask


@dataclass(frozen=True)
class DraftConfig:
    """Shapes of the draft; written as ``config.json`` in the EAGLE layout (a 1-layer Llama config)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    target_hidden_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int) -> "DraftConfig":
        """A draft shaped like one layer of ``target_config`` (a transformers config)."""
        heads = target_config.num_attention_heads
        return cls(
            hidden_size=target_config.hidden_size,
            intermediate_size=target_config.intermediate_size,
            num_attention_heads=heads,
            num_key_value_heads=getattr(target_config, "num_key_value_heads", None) or heads,
            head_dim=getattr(target_config, "head_dim", None) or target_config.hidden_size // heads,
            vocab_size=target_config.vocab_size,
            draft_vocab_size=draft_vocab_size,
            target_hidden_size=target_config.hidden_size,
            rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(target_config),
            max_position_embeddings=target_config.max_position_embeddings,
        )

    def to_json_dict(self) -> dict:
        d = asdict(self)
        d.update(architectures=["LlamaForCausalLMEagle3"], model_type="llama", num_hidden_layers=1,
                 hidden_act="silu", torch_dtype="float32")
        return d

    @classmethod
    def from_json_dict(cls, d: dict) -> "DraftConfig":
        d = dict(d)
        d.setdefault("draft_vocab_size", d.get("vocab_size"))
        d.setdefault("target_hidden_size", d.get("hidden_size"))
        d.setdefault("num_key_value_heads", d.get("num_attention_heads"))
        if d.get("head_dim") is None and d.get("hidden_size") and d.get("num_attention_heads"):
            d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        if "rope_theta" not in d and isinstance(d.get("rope_parameters"), dict):
            d["rope_theta"] = d["rope_parameters"].get("rope_theta", 10000.0)
        names = {f.name for f in fields(cls)}
        missing = [n for n in names if d.get(n) is None and n not in ("rms_norm_eps", "rope_theta",
                                                                       "max_position_embeddings")]
        if missing:
            raise KeyError(", ".join(sorted(missing)))
        return cls(**{k: v for k, v in d.items() if k in names})


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        params = getattr(config, "rope_parameters", None) or {}
        theta = params.get("rope_theta", 10000.0)
    return float(theta)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama rotary embedding (rotate-half layout) of ``x [B, H, Q, D]`` at ``positions [B, Q]``."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    angles = positions[:, None, :, None].float() * inv_freq
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class DraftAttention(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def forward(self, x, positions, past_keys, past_values, allowed):
        """``allowed [B, Q, K_past + Q]``: which of past-then-new keys each query sees."""
        b, q_len, _ = x.shape
        c = self.c
        q = self.q_proj(x).view(b, q_len, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, q_len, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, q_len, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, positions, c.rope_theta), apply_rope(k, positions, c.rope_theta)
        keys = k if past_keys is None else torch.cat([past_keys, k], dim=2)
        values = v if past_values is None else torch.cat([past_values, v], dim=2)
        groups = c.num_attention_heads // c.num_key_value_heads
        out = F.scaled_dot_product_attention(
            q, keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1),
            attn_mask=additive_mask(allowed, q.dtype), scale=1.0 / math.sqrt(c.head_dim))
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1)), k, v


class DraftMLP(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """EAGLE-3's ``midlayer``: attention over the 2H concatenation, residual on the hidden stream."""

    def __init__(self, c: DraftConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DraftAttention(c)
        self.mlp = DraftMLP(c)

    def forward(self, embeds, hidden, positions, past_keys, past_values, allowed):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        attn, k, v = self.self_attn(x, positions, past_keys, past_values, allowed)
        hidden = hidden + attn
        hidden = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return hidden, k, v


class Eagle3Draft(nn.Module):
    """The draft. ``state_dict()`` uses the official names: fc, midlayer.*, norm, lm_head, d2t, t2d."""

    def __init__(self, config: DraftConfig):
        super().__init__()
        c = self.config = config
        self.fc = nn.Linear(3 * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = DraftLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool) if
                             c.draft_vocab_size == c.vocab_size else torch.zeros(c.vocab_size, dtype=torch.bool))
        self._embed: Optional[nn.Embedding] = None

    def attach_embedding(self, embedding: nn.Embedding) -> None:
        """Share the target's token embedding (not registered: not trained, not saved)."""
        if embedding.weight.shape != (self.config.vocab_size, self.config.hidden_size):
            raise ValueError(f"target embedding {tuple(embedding.weight.shape)} does not match the draft's "
                             f"(vocab_size, hidden_size) = ({self.config.vocab_size}, {self.config.hidden_size})")
        self.__dict__["_embed"] = embedding

    @property
    def hot_token_ids(self) -> torch.Tensor:
        """Target id of each draft-vocabulary id: ``arange + d2t``."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features ``[.., 3 * H_target]`` -> draft hidden ``[.., H]``."""
        return self.fc(features)

    def forward(self, input_ids, hidden, positions, past_keys=None, past_values=None, allowed=None):
        """One draft step over ``Q`` query tokens per row.

        ``input_ids [B, Q]`` (target vocab), ``hidden [B, Q, H]`` (``fuse``d features or previous draft
        outputs), ``positions [B, Q]``, optional past ``keys/values [B, H_kv, K, D]``, and
        ``allowed [B, Q, K + Q]`` (causal over the new tokens when omitted). Returns the pre-norm
        output ``[B, Q, H]`` (the next step's ``hidden``) and the new keys and values.
        """
        if self._embed is None:
            raise RuntimeError("attach the target's embedding first (Eagle3Draft.attach_embedding)")
        if allowed is None:
            q_len = input_ids.shape[1]
            past = 0 if past_keys is None else past_keys.shape[2]
            causal = torch.ones(q_len, past + q_len, dtype=torch.bool, device=input_ids.device).tril(past)
            allowed = causal.expand(input_ids.shape[0], -1, -1)
        return self.midlayer(self._embed(input_ids), hidden, positions, past_keys, past_values, allowed)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of the pre-norm output."""
        return self.lm_head(self.norm(hidden))
