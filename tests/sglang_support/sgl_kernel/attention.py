"""Paged attention kernels of sgl-kernel's CPU build (csrc/cpu/decode.cpp, extend.cpp), in plain torch.

KV layout: k_buffer [slots, kv_heads, head_dim], v_buffer [slots, kv_heads, v_head_dim]; request b's
tokens live in the slots req_to_token[req_pool_indices[b], :seq_lens[b]]. Queries may have more heads
than the cache (GQA: query head h reads kv head h // (heads / kv_heads)). Softmax in float32.
Not supported here (they raise): cross-attention, sliding windows, attention sinks, scaled (fp8) caches.
"""

import torch

from ._registry import op


def _check_supported(k_scale, v_scale, is_cross_attn, sliding_window_size, sinks):
    if is_cross_attn or sliding_window_size > 0 or sinks is not None or k_scale != 1.0 or v_scale != 1.0:
        raise NotImplementedError("test sgl_kernel: cross-attention, sliding windows, sinks and KV scales "
                                  "are not implemented")


def _attend(q, keys, values, sm_scale, logit_cap, visible=None):
    """Softmax attention of q [M, H, D] over keys [L, Hkv, D] / values [L, Hkv, Dv]; visible: bool [M, L]."""
    group = q.shape[1] // keys.shape[1]
    keys = keys.float().repeat_interleave(group, dim=1)
    values = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,lhd->hml", q.float(), keys) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hml,lhd->mhd", torch.softmax(scores, dim=-1), values)


@op("decode_attention_cpu(Tensor query, Tensor(a!) k_buffer, Tensor(b!) v_buffer, float k_scale, float v_scale, "
    "Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor(d!) attn_logits, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, bool is_cross_attn, "
    "int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()")
def decode_attention_cpu(query, k_buffer, v_buffer, k_scale, v_scale, output, key, value, loc, attn_logits,
                         req_to_token, req_pool_indices, seq_lens, sm_scale, logit_cap, is_cross_attn,
                         sliding_window_size, encoder_lens, sinks):
    """One query token per sequence (query/output: [num_seqs, heads, dim]).

    When key/value are given they are first stored at k_buffer[loc] / v_buffer[loc] (one slot per
    sequence); then sequence b attends to all its seq_lens[b] cached tokens (the new one included).
    attn_logits is the kernel's split-KV scratch buffer and is left untouched.
    """
    _check_supported(k_scale, v_scale, is_cross_attn, sliding_window_size, sinks)
    if key is not None:
        k_buffer[loc] = key.reshape(-1, *k_buffer.shape[1:]).to(k_buffer.dtype)
        v_buffer[loc] = value.reshape(-1, *v_buffer.shape[1:]).to(v_buffer.dtype)
    rows = req_to_token[req_pool_indices].long()
    for b, n in enumerate(seq_lens.tolist()):
        slots = rows[b, :n]
        output[b] = _attend(query[b:b + 1], k_buffer[slots], v_buffer[slots], sm_scale, logit_cap)[0]


@op("extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
    "Tensor k_buffer, Tensor v_buffer, float k_scale, float v_scale, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, "
    "int? max_len_extend, float sm_scale, float logit_cap, bool is_cross_attn, int sliding_window_size, "
    "Tensor? encoder_lens, Tensor? sinks, Tensor? tree_mask, bool is_causal) -> ()")
def extend_attention_cpu(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, k_scale, v_scale,
                         req_to_token, req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc,
                         max_len_extend, sm_scale, logit_cap, is_cross_attn, sliding_window_size, encoder_lens,
                         sinks, tree_mask, is_causal):
    """Prefill/extend: sequence b has E = extend_seq_lens[b] new tokens at rows extend_start_loc[b]:+E of
    q_extend/k_extend/v_extend/o_extend and P = seq_lens[b] - E cached prefix tokens.

    Every new token sees the whole prefix (from the cache). Among the new tokens: with tree_mask
    (QLEN_ONLY layout, bool, request b's [E, E] block starting at sum of earlier E*E) token i sees token j
    iff tree_mask[i, j]; otherwise causally (j <= i) when is_causal, all of them when not. Without
    k_extend/v_extend the new tokens' K/V are read from the cache as well.
    """
    _check_supported(k_scale, v_scale, is_cross_attn, sliding_window_size, sinks)
    kv_shape = k_buffer.shape[1:]
    rows = req_to_token[req_pool_indices].long()
    mask_offset = 0
    for b, (n, e, s) in enumerate(zip(seq_lens.tolist(), extend_seq_lens.tolist(), extend_start_loc.tolist())):
        if e == 0:
            continue
        prefix = n - e
        if k_extend is None:
            slots = rows[b, :n]
            keys, values = k_buffer[slots], v_buffer[slots]
        else:
            slots = rows[b, :prefix]
            keys = torch.cat([k_buffer[slots].float(), k_extend[s:s + e].reshape(e, *kv_shape).float()])
            values = torch.cat([v_buffer[slots].float(),
                                v_extend[s:s + e].reshape(e, v_buffer.shape[1], -1).float()])
        if tree_mask is not None:
            new_visible = tree_mask.reshape(-1)[mask_offset:mask_offset + e * e].view(e, e).bool()
            mask_offset += e * e
        elif is_causal:
            new_visible = torch.ones(e, e, dtype=torch.bool).tril()
        else:
            new_visible = torch.ones(e, e, dtype=torch.bool)
        visible = torch.cat([torch.ones(e, prefix, dtype=torch.bool), new_visible], dim=1)
        o_extend[s:s + e] = _attend(q_extend[s:s + e], keys, values, sm_scale, logit_cap, visible)
