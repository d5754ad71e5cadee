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
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn



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
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalised in float32, scaled in the input's dtype (as Llama does)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    return weight * F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype)


class Rotary:
    """Llama rotary embedding (rotate-half layout); cos/sin tables per device, grown when a position needs it. The
    sine table carries rotate-half's sign (``-sin`` on the first half), so :func:`apply_rope` only swaps halves."""

    def __init__(self, head_dim: int, theta: float, max_positions: int):
        self.head_dim, self.theta, self.size = head_dim, theta, max_positions
        self._tables: dict = {}

    def reserve(self, positions: int) -> None:
        """Make room for positions ``0 .. positions - 1`` (an engine's longest sequence) ahead of use."""
        if positions > self.size:
            self.size, self._tables = positions, {}

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``, signed ``sin`` ``[B, Q, 1, D]`` (float32) at ``positions [B, Q]``, read in one lookup."""
        table = self._tables.get(positions.device)
        if table is None:
            d = self.head_dim
            inv_freq = 1.0 / (self.theta ** (torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d))
            angles = torch.arange(self.size, device=positions.device, dtype=torch.float32)[:, None] * inv_freq
            sin = angles.sin()
            table = self._tables[positions.device] = torch.stack(
                [torch.cat([angles.cos()] * 2, -1), torch.cat([-sin, sin], -1)], dim=1)  # [P, 2, D]
        cos_sin = table.index_select(0, positions.flatten()).view(*positions.shape, 2, -1)  # [B, Q, 2, D]
        return cos_sin[:, :, 0:1], cos_sin[:, :, 1:2]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, Q, H, D]`` by the tables of :meth:`Rotary.tables`: ``x cos + rotate_half(x) sin``, with
    rotate-half's sign already in ``sin`` (exactly the same numbers)."""
    swapped = x.roll(x.shape[-1] // 2, -1)  # [x2, x1]: the halves swapped
    if x.dtype == torch.float32:
        return x * cos + swapped * sin
    return (x.float() * cos + swapped.float() * sin).to(x.dtype)


# attention(q [B, Hq, Q, D], k [B, Hkv, Q, D], v) -> [B, Hq, Q, D]: where the keys live is the caller's business
AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """Softmax attention of ``q [B, Hq, Q, D]`` over ``keys/values [B, Hkv, L, D]`` where ``allowed [B, Q, L]``
    (every query must see at least one key). Grouped-query heads share their key head without copying it."""
    return masked_attention(q, keys, values, grouped_mask(allowed, q.shape[1] // keys.shape[1], q.dtype), scale)


def grouped_mask(allowed: torch.Tensor, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """``allowed [B, Q, L]`` as the additive mask of :func:`masked_attention` (0 or -inf, what SDPA makes of a
    boolean mask), ``[B, 1, groups * Q, L]``: for callers that attend many times with one mask."""
    b, q_len, length = allowed.shape
    bias = torch.zeros(b, 1, groups, q_len, length, dtype=dtype, device=allowed.device)
    bias.masked_fill_(~allowed[:, None, None], float("-inf"))
    return bias.view(b, 1, groups * q_len, length)


def masked_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """:func:`grouped_attention` with its mask already built (:func:`grouped_mask`)."""
    b, hq, q_len, d = q.shape
    hkv = keys.shape[1]
    out = F.scaled_dot_product_attention(q.reshape(b, hkv, hq // hkv * q_len, d), keys, values, attn_mask=mask,
                                         scale=scale)
    return out.reshape(b, hq, q_len, d)  # a view on a CPU; CUDA kernels may lay it out otherwise


class ConcatAttention:
    """Attention over ``keys/values [B, Hkv, K, D]`` seen so far plus each call's new ones, which it keeps
    (training and simple callers); ``allowed [B, Q, K + Q]`` (causal over the new tokens when None)."""

    def __init__(self, allowed=None, keys=None, values=None, scale: float = 1.0):
        self.allowed, self.keys, self.values, self.scale = allowed, keys, values, scale

    def __call__(self, q, k, v):
        self.keys = k if self.keys is None else torch.cat([self.keys, k], dim=2)
        self.values = v if self.values is None else torch.cat([self.values, v], dim=2)
        allowed = self.allowed
        if allowed is None:
            q_len, total = q.shape[2], self.keys.shape[2]
            allowed = torch.ones(q_len, total, dtype=torch.bool, device=q.device).tril(total - q_len)
            allowed = allowed.expand(q.shape[0], -1, -1)
        return grouped_attention(q, self.keys, self.values, allowed, self.scale)


class DraftAttention(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.c = c
        self.scale = 1.0 / math.sqrt(c.head_dim)
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        self.rotary = Rotary(c.head_dim, c.rope_theta, c.max_position_embeddings)

    def forward(self, x, positions, attention: AttentionFn, queries: Optional[torch.Tensor] = None):
        """Keys and values of every token of ``x [B, Q, 2H]``; queries of all of them, or of ``queries [B, Qq]``
        (indices into Q) only. Returns ``[B, Q or Qq, H]``."""
        c = self.c
        rotated, v = self._rotated(x, positions, 0)
        q, k = rotated[:, :, :c.num_attention_heads], rotated[:, :, c.num_attention_heads:]
        if queries is not None:
            q = q.gather(1, queries[..., None, None].expand(-1, -1, *q.shape[2:]))
        out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.o_proj(out.transpose(1, 2).flatten(2))

    def keys_values(self, x, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """Only the keys and values of ``x [B, Q, 2H]``, each ``[B, Hkv, Q, D]``."""
        k, v = self._rotated(x, positions, self.c.num_attention_heads)
        return k.transpose(1, 2), v.transpose(1, 2)

    def _rotated(self, x, positions, first_head: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The projections of ``x`` to the heads from ``first_head`` on (queries, keys, values: 0 for all of them,
        the number of query heads for keys and values only), ``[B, Q, heads, D]``: the query and key heads rotated
        together, and the value heads."""
        c = self.c
        projections = (self.q_proj, self.k_proj, self.v_proj)[1 if first_head else 0:]
        heads = torch.cat([p(x) for p in projections], dim=-1).unflatten(-1, (-1, c.head_dim))
        values_from = c.num_attention_heads + c.num_key_value_heads - first_head
        return apply_rope(heads[:, :, :values_from], *self.rotary.tables(positions)), heads[:, :, values_from:]


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

    def forward(self, normed_embeds, hidden, positions, attention: AttentionFn,
                queries: Optional[torch.Tensor] = None):
        """``normed_embeds``: ``input_layernorm(embed(tokens))`` (:meth:`Eagle3Draft.normed_embeddings`)."""
        x = self.attention_input(normed_embeds, hidden)
        if queries is not None:
            hidden = hidden.gather(1, queries[..., None].expand(-1, -1, hidden.shape[-1]))
        hidden = hidden + self.self_attn(x, positions, attention, queries)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def attention_input(self, normed_embeds, hidden):
        return torch.cat([normed_embeds, self.hidden_norm(hidden)], dim=-1)


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

    def forward(self, input_ids, hidden, positions, attention: Optional[AttentionFn] = None,
                queries: Optional[torch.Tensor] = None):
        """One draft step over ``Q`` tokens per row: ``input_ids [B, Q]`` (target vocab), ``hidden [B, Q, H]``
        (``fuse``d features or previous draft outputs), ``positions [B, Q]``; ``attention`` keeps and attends
        the keys (default: causal over these tokens alone, :class:`ConcatAttention`). Every token's key and value
        reach ``attention``; the queries are all tokens, or ``queries [B, Qq]`` (indices into Q) only. Returns the
        pre-norm output of the queries, ``[B, Q or Qq, H]``, the next step's ``hidden``."""
        attention = attention or ConcatAttention(scale=self.attention_scale)
        return self.midlayer(self.normed_embeddings(input_ids), hidden, positions, attention, queries)

    def keys_values(self, input_ids, hidden, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """What :meth:`forward` would give ``attention`` as keys and values (``[B, Hkv, Q, D]`` each), alone."""
        layer = self.midlayer
        return layer.self_attn.keys_values(layer.attention_input(self.normed_embeddings(input_ids), hidden),
                                           positions)

    def normed_embeddings(self, input_ids):
        """``input_layernorm(embed(input_ids))``."""
        return self.midlayer.input_layernorm(self.embedding(input_ids))

    @property
    def embedding(self) -> nn.Embedding:
        """The target's token embedding (:meth:`attach_embedding`)."""
        if self._embed is None:
            raise RuntimeError("attach the target's embedding first (Eagle3Draft.attach_embedding)")
        return self._embed

    @property
    def attention_scale(self) -> float:
        return self.midlayer.self_attn.scale

    @property
    def query_groups(self) -> int:
        """Query heads per key head (grouped-query attention)."""
        return self.config.num_attention_heads // self.config.num_key_value_heads

    def reserve_positions(self, positions: int) -> None:
        """Rotary tables for positions ``0 .. positions - 1`` (the longest sequence the engine serves)."""
        self.midlayer.self_attn.rotary.reserve(positions)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of the pre-norm output."""
        return self.lm_head(self.norm(hidden))
