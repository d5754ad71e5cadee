"""Our trees as SGLang's ``EagleVerifyInput``, and our strict sampler in place of SGLang's ``eagle_sample``.

SGLang's verify step (``run_eagle_verify``) runs the target over the flattened trees, samples, then moves
the accepted path's KV and tokens to the front of each request's block. We give it our trees and answer its
sampling call with the core's :func:`~eagle3_plugin.sampler.verify_tree` (greedy, or recursive rejection
with the draft's real probabilities), in SGLang's output convention:

- ``accept_index [bs, depth + 1]``: flat node indices (``row * N + node``) of the accepted path, root
  first, -1 padded;
- ``predict [bs * N]``: at each accepted node, the token that follows it (the next accepted draft token,
  or the bonus token at the last one);
- ``accept_lens [bs]``: accepted drafts + 1.

The tree mask is SGLang's CPU layout (``QLEN_ONLY``): row ``row * N + i`` holds node i's ancestors and itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from ..output_rules import OutputRules
from ..rng import RowRandom
from ..sampler import SamplingParams, Verdict, verify_tree
from ..tree import DraftTree

from sglang.srt.speculative.eagle_info import EagleVerifyInput


@dataclass
class TreeVerifyInput(EagleVerifyInput):
    """SGLang's verify input plus what our sampler needs; after sampling, :attr:`verdict` holds its decision."""

    trees: Optional[DraftTree] = None
    params: Optional[SamplingParams] = None
    random: Optional[RowRandom] = None
    method: str = "real"
    vocab_size: int = 0
    rules: Optional[OutputRules] = None  # penalties, min_new_tokens, logit_bias, as of the roots (None: none has any)
    verdict: Optional[Verdict] = None
    seconds: float = 0.0  # spent in :meth:`sample`

    def sample(self, logits: torch.Tensor, grammar_mask=None):
        """``logits [bs * N, >= vocab]`` -> ``(predict, accept_lens, accept_index)`` as ``eagle_sample`` returns.
        ``grammar_mask``: SGLang's vocabulary mask for grammar-constrained requests, one row per tree node (its own
        traversal of our tree links). It and the :attr:`rules` apply at each node for its path, in place (SGLang's
        logprobs then read them, as they read its own adjusted logits without speculation); masking first gives what
        SGLang's order gives (penalties, mask, bias), as every rule keeps a masked logit at -inf."""
        began = time.perf_counter()
        bs, n = self.trees.tokens.shape
        if grammar_mask is not None:
            grammar_mask.apply(logits)
        logits = logits[:, :self.vocab_size].float().view(bs, n, self.vocab_size)
        if self.rules is not None:
            self.rules.apply(self.trees, logits)
        self.verdict = verdict = verify_tree(self.trees, logits, self.params, self.method, self.random)
        rows = torch.arange(bs, device=logits.device)
        accepted = verdict.accepted
        flat = torch.where(accepted >= 0, rows[:, None] * n + accepted, -1)
        accept_index = torch.full((bs, self.spec_steps + 1), -1, dtype=torch.int32, device=logits.device)
        accept_index[:, :flat.shape[1]] = flat.to(torch.int32)
        predict = torch.zeros(bs * n, dtype=torch.int32, device=logits.device)
        emitted = verdict.emitted(self.trees)
        predict[flat[accepted >= 0]] = emitted[accepted >= 0].to(torch.int32)
        self.seconds += time.perf_counter() - began
        return predict, (verdict.num_accepted + 1).to(torch.int32), accept_index


def build_verify_input(trees: DraftTree, seq_lens: torch.Tensor, *, params: SamplingParams, random: RowRandom,
                       method: str, vocab_size: int, topk: int,
                       rules: Optional[OutputRules] = None) -> TreeVerifyInput:
    """One tree per request (``trees [bs, N]``, any ``N`` up to SGLang's ``--speculative-num-draft-tokens``, for
    which it allocated slots); ``seq_lens``: committed length per request. The mask is in SGLang's CPU layout (the
    worker refuses other devices at start-up). ``topk``: the configured tree's; a step whose trees are all chains
    (the budget drafted the chain, or nothing) is verified with ``topk`` 1, as SGLang verifies a configured chain:
    its attention skips the tree mask (the causal mask is the same) and its accepted path needs no compaction."""
    bs, n = trees.tokens.shape
    device = seq_lens.device
    next_token, next_sibling = _links(trees)
    if bool(trees.paths().all()):  # chains (or roots alone): verified as such
        topk = 1
    return TreeVerifyInput(
        draft_token=trees.tokens.reshape(-1),
        custom_mask=trees.ancestor_mask().reshape(-1),
        positions=(seq_lens.to(torch.int64)[:, None] + trees.depths).reshape(-1),
        retrieve_index=torch.arange(bs * n, device=device).view(bs, n),
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
        retrieve_cum_len=None,
        spec_steps=int(trees.depths.max()),  # the accepted path's longest: accept_index is spec_steps + 1 wide
        topk=topk,
        draft_token_num=n,
        capture_hidden_mode=None,
        seq_lens_sum=None,
        seq_lens_cpu=None,
        trees=trees, params=params, random=random, method=method, vocab_size=vocab_size, rules=rules,
    )


def _links(tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's tree links: each node's first child, and each node's next sibling (index order), -1 if none."""
    children = tree.children(tree.max_children())  # [B, N, C], index order, -1 padded
    following = torch.cat([children[:, :, 1:], torch.full_like(children[:, :, :1], -1)], dim=2)
    next_sibling = torch.full_like(tree.parents, -1)
    is_child = children >= 0
    rows = torch.arange(children.shape[0], device=children.device)[:, None, None].expand_as(children)
    next_sibling[rows[is_child], children[is_child]] = following[is_child]
    return children[:, :, 0], next_sibling


def eagle_sample(original, verify_input, batch, logits_output, grammar_mask=None, *args, **kwargs):
    """AROUND SGLang's ``eagle_sample``: our sampler for our verify inputs, SGLang's for anything else."""
    if not isinstance(verify_input, TreeVerifyInput):
        return original(verify_input, batch, logits_output, grammar_mask, *args, **kwargs)
    return verify_input.sample(logits_output.next_token_logits, grammar_mask)
