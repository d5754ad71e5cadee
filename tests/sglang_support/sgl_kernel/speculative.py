"""EAGLE bookkeeping kernels of sgl-kernel's CPU build (csrc/cpu/speculative_decoding.cpp), in plain torch.

Index tensors are read as Python lists and written back in place; every function mutates only the
arguments marked ``(a!)`` in its schema. Shapes: ``bs`` requests, ``D`` draft tokens per request.
"""

import torch

from ._registry import op


def _prefix(start, end):
    """Exclusive prefix sums of ``end - start`` (where each request's run starts in a packed output)."""
    out, acc = [], 0
    for s, e in zip(start, end):
        out.append(acc)
        acc += e - s
    return out


@op("verify_tree_greedy_cpu(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, "
    "Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, Tensor retrive_next_sibling, "
    "Tensor target_predict) -> ()")
def verify_tree_greedy_cpu(predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict):
    """Greedy walk of each request's draft tree against the target's argmax tokens.

    candidates/retrive_*: [bs, D]; retrive_index holds flat token indices (b * D + i); target_predict is
    indexed by flat token index; accept_index: [bs, S] (column 0 = root). From the root, at each level the
    first child (following next_sibling links) whose draft token equals the target token at the last
    accepted node is accepted: predicts[last] = that token, accept_index[b, n] = its flat index. Stops at
    the first level without a match. accept_token_num[b] = accepted drafts (root not counted);
    predicts[last accepted] = the target token there (the bonus token).
    """
    bs, num_draft = candidates.shape
    steps = accept_index.shape[1]
    cand, ri = candidates.tolist(), retrive_index.tolist()
    nxt, sib = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    tp = target_predict.reshape(-1).tolist()
    pred = predicts.view(-1)
    for b in range(bs):
        last = ri[b][0]
        accepted = [last]
        cur = 0
        for _ in range(1, steps):
            cur = nxt[b][cur]
            while cur != -1:
                if cand[b][cur] == tp[last]:
                    pred[last] = tp[last]
                    last = ri[b][cur]
                    accepted.append(last)
                    break
                cur = sib[b][cur]
            if cur == -1:
                break
        accept_index[b, :len(accepted)] = torch.tensor(accepted, dtype=accept_index.dtype)
        accept_token_num[b] = len(accepted) - 1
        pred[last] = tp[last]


def _tree_row(sel, parents, topk, tid, num_draft):
    """Ancestors of draft node ``tid`` (> 0) as columns 1..D-1, and its depth below the root."""
    cols, depth, cur = [], 0, tid - 1
    while True:
        depth += 1
        cols.append(cur + 1)
        parent_tb = sel[cur] // topk
        if parent_tb == 0:
            return cols, depth
        token_idx = parents[parent_tb]
        if token_idx not in sel[:num_draft - 1]:
            return cols, depth
        cur = sel.index(token_idx)


@op("build_tree_kernel_efficient_cpu(Tensor parent_list, Tensor selected_index, Tensor verified_seq_len, "
    "Tensor(a!) tree_mask, Tensor(b!) positions, Tensor(c!) retrive_index, Tensor(d!) retrive_next_token, "
    "Tensor(e!) retrive_next_sibling, int topk, int depth, int draft_token_num, int tree_mask_mode) -> ()")
def build_tree_kernel_efficient_cpu(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                    retrive_index, retrive_next_token, retrive_next_sibling, topk, depth,
                                    draft_token_num, tree_mask_mode):
    """Turn EAGLE's top-k draft selection into tree links, positions and the verify attention mask.

    parent_list: [bs, topk * (depth - 1) + 1]; selected_index: [bs, D - 1] (node i + 1 of the tree is
    selected_index[b, i]; its parent is parent_list[b, selected_index // topk], 0 = the root).
    Writes retrive_index[b, i] = b * D + i; retrive_next_token[b, p] = last-listed child of node p, and
    retrive_next_sibling links the earlier children (both pre-filled with -1 by the caller);
    positions[b * D + i] = seq_len + depth of node i. tree_mask_mode 1 (QLEN_ONLY): the bool mask row
    (b * D + i) * D .. + D marks node i's ancestors and itself (column 0 = root always true).
    Mode 0 (FULL_MASK): rows of width seq_len + D after each request's prefix block; the prefix columns
    are left as the caller filled them. Mode 2 (bit-packed) is not supported, as upstream on CPU.
    """
    if tree_mask_mode not in (0, 1):
        raise NotImplementedError("build_tree_kernel_efficient_cpu: QLEN_ONLY_BITPACKING is not supported")
    num_draft = draft_token_num
    sels, parents = selected_index.tolist(), parent_list.tolist()
    seq_lens = verified_seq_len.tolist()
    pos, mask = positions.view(-1), tree_mask.view(-1)
    full_offset = 0
    for b, seq_len in enumerate(seq_lens):
        sel, par, off = sels[b], parents[b], b * num_draft
        retrive_index[b] = torch.arange(off, off + num_draft, dtype=retrive_index.dtype)
        nxt, sib = retrive_next_token[b], retrive_next_sibling[b]
        for i in range(num_draft - 1, 0, -1):
            parent_tb = sel[i - 1] // topk
            parent_pos = 0
            if parent_tb > 0:
                token_idx = par[parent_tb]
                if token_idx not in sel[:num_draft - 1]:
                    continue
                parent_pos = sel.index(token_idx) + 1
            if int(nxt[parent_pos]) != -1:
                sib[i] = nxt[parent_pos]
            nxt[parent_pos] = i
        node_pos = [seq_len]
        for tid in range(num_draft):
            if tree_mask_mode == 1:
                row = (off + tid) * num_draft
            else:
                row = full_offset + b * num_draft * num_draft + (seq_len + num_draft) * tid + seq_len
            visible = torch.zeros(num_draft, dtype=torch.bool)
            visible[0] = True
            if tid > 0:
                cols, node_depth = _tree_row(sel, par, topk, tid, num_draft)
                visible[cols] = True
                node_pos.append(seq_len + node_depth)
            mask[row:row + num_draft] = visible
        pos[off:off + num_draft] = torch.tensor(node_pos, dtype=pos.dtype)
        full_offset += seq_len * num_draft


@op("assign_req_to_token_pool_cpu(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, "
    "Tensor end_offset, Tensor out_cache_loc, int pool_len) -> ()")
def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len):
    """req_to_token[req_pool_indices[b], start[b]:end[b]] = the b-th run of the packed out_cache_loc."""
    start, end = start_offset.tolist(), end_offset.tolist()
    for b, (row, s, e, o) in enumerate(zip(req_pool_indices.tolist(), start, end, _prefix(start, end))):
        req_to_token[row, s:e] = out_cache_loc[o:o + e - s].to(req_to_token.dtype)


@op("assign_draft_cache_locs_contiguous_cpu(Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, "
    "Tensor(a!) out_cache_loc, int pool_len, int topk, int num_steps) -> ()")
def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len,
                                           topk, num_steps):
    """out_cache_loc[b * n:(b + 1) * n] = req_to_token[req_pool_indices[b], seq_lens[b]:+n], n = topk * num_steps."""
    n = topk * num_steps
    for b, (row, s) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[b * n:(b + 1) * n] = req_to_token[row, s:s + n].to(out_cache_loc.dtype)


@op("assign_extend_cache_locs_cpu(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, "
    "Tensor end_offset, Tensor(a!) out_cache_loc, int pool_len) -> ()")
def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len):
    """Pack req_to_token[req_pool_indices[b], start[b]:end[b]] for every b, in order, into out_cache_loc."""
    start, end = start_offset.tolist(), end_offset.tolist()
    for row, s, e, o in zip(req_pool_indices.tolist(), start, end, _prefix(start, end)):
        out_cache_loc[o:o + e - s] = req_to_token[row, s:e].to(out_cache_loc.dtype)


@op("build_draft_decode_metadata_cpu(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, int topk, "
    "int num_steps, int pool_len) -> Tensor")
def build_draft_decode_metadata_cpu(req_to_token, req_pool_indices, seq_lens, topk, num_steps, pool_len):
    """A [bs * topk, pool_len] table: row b * topk + k = request b's first seq_lens[b] slots, then the
    num_steps draft slots of candidate k (req_to_token[..., seq_len + k * num_steps:+num_steps]).
    Entries past seq_len + num_steps are zero (upstream leaves them undefined)."""
    out = torch.zeros((len(req_pool_indices) * topk, pool_len), dtype=req_to_token.dtype)
    for b, (row, s) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        src = req_to_token[row]
        for k in range(topk):
            out[b * topk + k, :s] = src[:s]
            out[b * topk + k, s:s + num_steps] = src[s + k * num_steps:s + (k + 1) * num_steps]
    return out


@op("fill_bonus_tokens_cpu(Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, "
    "int accept_stride) -> ()")
def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """bonus_tokens[b] = accept_tokens.flat[accept_stride * b + accept_lens[b] - 1] (the last accepted token)."""
    idx = torch.arange(len(accept_lens)) * accept_stride + accept_lens.long() - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype))


@op("fill_accept_out_cache_loc_cpu(Tensor accept_index, Tensor out_cache_loc, Tensor(a!) accept_out_cache_loc, "
    "int? size=None) -> ()")
def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc, size=None):
    """Compact: accept_out_cache_loc[:n] = out_cache_loc[i] for the entries i > -1 of accept_index, in order
    (the first ``size`` entries of the flattened accept_index; all of them when size is None)."""
    flat = accept_index.reshape(-1)
    if size is not None:
        flat = flat[:size]
    kept = flat[flat > -1].long()
    accept_out_cache_loc[:kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


@op("rotate_input_ids_cpu(Tensor(a!) input_ids, Tensor extend_start_loc, Tensor extend_seq_lens, "
    "Tensor topk_index, Tensor? select_index=None) -> ()")
def rotate_input_ids_cpu(input_ids, extend_start_loc, extend_seq_lens, topk_index, select_index=None):
    """Per request: shift its run input_ids[start:start+len] left by one and write topk_index[b] at the end
    of the run (or at input_ids[select_index[b]] when select_index is given)."""
    new_tokens = topk_index.reshape(-1).tolist()
    selects = select_index.reshape(-1).tolist() if select_index is not None else None
    for b, (s, n) in enumerate(zip(extend_start_loc.tolist(), extend_seq_lens.tolist())):
        if n > 1:
            input_ids[s:s + n - 1] = input_ids[s + 1:s + n].clone()
        if n > 0:
            input_ids[selects[b] if selects is not None else s + n - 1] = new_tokens[b]
