"""The draft's forward for drafting: its weights packed once, and one flat function per use, no module calls.

:class:`~eagle3_plugin.draft.Eagle3Draft` is the model (official weight names, the training path) and the plain
reference for this one. Packing takes what drafting reads every level and lays it out for it: one ``q|k|v``
projection, one ``gate|up`` projection, ``input_layernorm`` of every token's embedding (the norm is per token, so
a table row is exactly the token's normalised embedding), the draft vocabulary's target ids. The forward below is
the module's, op for op, and gives exactly its numbers (``tests/test_draft.py``); what it saves is the module
calls around the ops, a quarter of a level's time at batch 1 on a CPU.

Packing copies the fused weights: pack again after changing the draft's weights (engines pack once, at load).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from .draft import AttentionFn, DraftConfig, Eagle3Draft, Rotary, apply_rope, rms_norm


@dataclass(frozen=True)
class PackedDraft:
    """``embeddings [V, H]``: each token's normalised embedding; ``qkv [(Hq + 2 Hkv) D, 2H]``; ``gate_up [2I, H]``;
    ``hot_ids [Vd]``: the target id of each draft-vocabulary id. The rest are the module's own tensors."""

    config: DraftConfig
    fc: torch.Tensor
    embeddings: torch.Tensor
    hidden_norm: torch.Tensor
    qkv: torch.Tensor
    o_proj: torch.Tensor
    post_attention_norm: torch.Tensor
    gate_up: torch.Tensor
    down_proj: torch.Tensor
    norm: torch.Tensor
    lm_head: torch.Tensor
    hot_ids: torch.Tensor
    rotary: Rotary
    attention_scale: float

    @classmethod
    @torch.no_grad()
    def of(cls, draft: Eagle3Draft) -> "PackedDraft":
        layer, c = draft.midlayer, draft.config
        attn, mlp = layer.self_attn, layer.mlp
        return cls(
            config=c,
            fc=draft.fc.weight.detach(),
            embeddings=layer.input_layernorm(draft.embedding.weight).detach(),
            hidden_norm=layer.hidden_norm.weight.detach(),
            qkv=torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
            o_proj=attn.o_proj.weight.detach(),
            post_attention_norm=layer.post_attention_layernorm.weight.detach(),
            gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]),
            down_proj=mlp.down_proj.weight.detach(),
            norm=draft.norm.weight.detach(),
            lm_head=draft.lm_head.weight.detach(),
            hot_ids=draft.hot_token_ids,
            rotary=attn.rotary,
            attention_scale=attn.scale,
        )

    @property
    def query_groups(self) -> int:
        """Query heads per key head (grouped-query attention)."""
        return self.config.num_attention_heads // self.config.num_key_value_heads

    def reserve_positions(self, positions: int) -> None:
        """Rotary tables for positions ``0 .. positions - 1`` (the longest sequence the engine serves)."""
        self.rotary.reserve(positions)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Target features ``[.., 3 * H_target]`` -> draft hidden ``[.., H]``."""
        return F.linear(features, self.fc)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, attention: AttentionFn,
                queries: Optional[torch.Tensor] = None) -> torch.Tensor:
        """:meth:`Eagle3Draft.forward`: ``tokens [B, Q]``, ``hidden [B, Q, H]``, ``positions [B, Q]``; every token's key
        and value reach ``attention``, the queries are all tokens or ``queries [B, Qq]``. Returns
        ``[B, Q or Qq, H]``."""
        eps, heads = self.config.rms_norm_eps, self.config.num_attention_heads
        rotated, v = self._rotated(self._attention_input(tokens, hidden), positions, 0)
        q, k = rotated[:, :, :heads], rotated[:, :, heads:]
        if queries is not None:
            q = q.gather(1, queries[..., None, None].expand(-1, -1, *q.shape[2:]))
            hidden = hidden.gather(1, queries[..., None].expand(-1, -1, hidden.shape[-1]))
        out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        hidden = hidden + F.linear(out.transpose(1, 2).flatten(2), self.o_proj)
        gate, up = F.linear(rms_norm(hidden, self.post_attention_norm, eps), self.gate_up).chunk(2, dim=-1)
        return hidden + F.linear(F.silu(gate) * up, self.down_proj)

    def keys_values(self, tokens: torch.Tensor, hidden: torch.Tensor,
                    positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Only the keys and values :meth:`forward` would give ``attention``, each ``[B, Hkv, Q, D]``."""
        k, v = self._rotated(self._attention_input(tokens, hidden), positions, self.config.num_attention_heads)
        return k.transpose(1, 2), v.transpose(1, 2)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of the pre-norm output."""
        return F.linear(rms_norm(hidden, self.norm, self.config.rms_norm_eps), self.lm_head)

    def _attention_input(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return torch.cat([F.embedding(tokens, self.embeddings),
                          rms_norm(hidden, self.hidden_norm, self.config.rms_norm_eps)], dim=-1)

    def _rotated(self, x: torch.Tensor, positions: torch.Tensor, first_head: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The heads from ``first_head`` on (0: queries, keys, values; the query heads' count: keys and values only),
        ``[B, Q, heads, D]``: the query and key heads rotated together, and the value heads."""
        c = self.config
        weight = self.qkv[first_head * c.head_dim:] if first_head else self.qkv
        heads = F.linear(x, weight).unflatten(-1, (-1, c.head_dim))
        values_from = c.num_attention_heads + c.num_key_value_heads - first_head
        return apply_rope(heads[:, :, :values_from], *self.rotary.tables(positions)), heads[:, :, values_from:]
