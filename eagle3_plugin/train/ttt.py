"""Training-time test (TTT): the draft unrolled over ``steps`` of its own outputs, token loss only.

Step 0 feeds slot t with ``(fc(g_t), x_{t+1})`` at position t; step s feeds it the step s-1 output with
``x_{t+s+1}`` at position ``t + s`` (exactly where a depth-s tree node sits at inference). Its query sees
step 0's keys at slots <= t (the causal prefix) and its own earlier steps' keys at slot t (the diagonal),
the same attention a depth-s node gets at inference. Step s at slot t learns the target's distribution
for token ``x_{t+s+2}``, restricted to the draft vocabulary; weights decay as 0.8^s (EAGLE-3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..draft import ConcatAttention, Eagle3Draft

STEP_WEIGHT_DECAY = 0.8


def ttt_mask(length: int, step: int, device=None) -> torch.Tensor:
    """``[T, (step + 1) * T]`` bool: causal over step 0's keys, diagonal over each later step's."""
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    eye = torch.eye(length, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * step, dim=1)


def shift_left(x: torch.Tensor, by: int, fill) -> torch.Tensor:
    """``x[:, by:]`` padded on the right with ``fill`` to the original length."""
    if by == 0:
        return x
    pad = torch.full_like(x[:, :by], fill)
    return torch.cat([x[:, by:], pad], dim=1)


def ttt_loss(draft: Eagle3Draft, input_ids: torch.Tensor, features: torch.Tensor, target_logits: torch.Tensor,
             loss_mask: torch.Tensor, steps: int) -> tuple[torch.Tensor, list[float]]:
    """Weighted TTT loss over ``steps`` and per-step top-1 accuracy (against the target's argmax).

    ``input_ids [B, T]``, ``features [B, T, 3H]`` and ``target_logits [B, T, V]`` from the target;
    ``loss_mask [B, T]`` marks tokens to learn (1 at a response token).
    """
    b, length = input_ids.shape
    t2d = draft.t2d
    target_in_draft = target_logits[..., t2d].float()  # [B, T, Vd], draft-vocabulary order
    target_argmax_in_vocab = t2d[target_logits.argmax(-1)]
    positions = torch.arange(length, device=input_ids.device)[None].expand(b, -1)
    hidden = draft.fuse(features)
    keys, values = None, None
    total, weight_sum, accuracies = 0.0, 0.0, []
    for step in range(steps):
        tokens = shift_left(input_ids, step + 1, 0)
        allowed = ttt_mask(length, step, input_ids.device)[None].expand(b, -1, -1)
        attention = ConcatAttention(allowed, keys, values, draft.attention_scale)
        out = draft(tokens, hidden, positions + step, attention)
        keys, values = attention.keys, attention.values
        labels = shift_left(target_in_draft, step + 1, 0.0)
        mask = (shift_left(loss_mask, step + 2, 0) * shift_left(target_argmax_in_vocab, step + 1, False)).float()
        logp = F.log_softmax(draft.logits(out).float(), dim=-1)
        per_slot = -(F.softmax(labels, dim=-1) * logp).sum(-1)
        count = mask.sum().clamp(min=1.0)
        weight = STEP_WEIGHT_DECAY ** step
        total = total + weight * (per_slot * mask).sum() / count
        weight_sum += weight
        hits = (logp.argmax(-1) == labels.argmax(-1)).float()
        accuracies.append(float((hits * mask).sum() / count))
        hidden = out
    return total / weight_sum, accuracies
