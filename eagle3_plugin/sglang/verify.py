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

from dataclasses import dataclass, field

import torch

from ..sampler import SamplingParams, Verdict, verify_tree
from ..tree import DraftTree

from sglang.srt.speculative.eagle_info import EagleVerifyInput


@dataclass
class TreeVerifyInput(EagleVerifyInput):
    """SGLang's verify input plus what our sampler needs; after sampling, :attr:`verdicts` holds its decisions."""

    trees: list[DraftTree] = field(default_factory=list)
    params: list[SamplingParams] = field(default_factory=list)
    generators: list = field(default_factory=list)
    method: str = "real"
    vocab_size: int = 0
    verdicts: list[Verdict] = field(default_factory=list)

    def sample(self, logits: torch.Tensor):
        """``logits [bs * N, >= vocab]`` -> ``(predict, accept_lens, accept_index)`` as ``eagle_sample`` returns."""
        bs, n = len(self.trees), self.draft_token_num
        logits = logits[:, :self.vocab_size].float().view(bs, n, self.vocab_size)
        predict = torch.zeros(bs * n, dtype=torch.int32, device=logits.device)
        accept_index = torch.full((bs, self.spec_steps + 1), -1, dtype=torch.int32, device=logits.device)
        accept_lens = torch.empty(bs, dtype=torch.int32, device=logits.device)
        self.verdicts = []
        for row, (tree, params, generator) in enumerate(zip(self.trees, self.params, self.generators)):
            verdict = verify_tree(tree, logits[row:row + 1], params, self.method, generator)
            k = int(verdict.num_accepted[0])
            flat = row * n + verdict.accepted[0, :k + 1]
            predict[flat] = torch.tensor(verdict.output_tokens(tree)[0], dtype=torch.int32, device=logits.device)
            accept_index[row, :k + 1] = flat.to(torch.int32)
            accept_lens[row] = k + 1
            self.verdicts.append(verdict)
        return predict, accept_lens, accept_index


def build_verify_input(trees: list[DraftTree], seq_lens: torch.Tensor, *, params, generators, method: str,
                       vocab_size: int, num_steps: int, topk: int, num_draft_tokens: int) -> TreeVerifyInput:
    """One tree per request (all with ``num_draft_tokens`` nodes); ``seq_lens``: committed length per request.
    The mask is in SGLang's CPU layout (the worker refuses other devices at start-up)."""
    sizes = {tree.size for tree in trees}
    if sizes != {num_draft_tokens}:
        raise RuntimeError(f"draft trees have {sorted(sizes)} nodes, SGLang verifies {num_draft_tokens}")
    bs, n = len(trees), num_draft_tokens
    device = seq_lens.device
    batch = DraftTree(*(torch.cat([getattr(t, name) for t in trees]).to(device)
                        for name in ("tokens", "parents", "depths")))
    next_token, next_sibling = _links(batch)
    return TreeVerifyInput(
        draft_token=batch.tokens.reshape(-1),
        custom_mask=batch.ancestor_mask().reshape(-1),
        positions=(seq_lens.to(torch.int64)[:, None] + batch.depths).reshape(-1),
        retrieve_index=torch.arange(bs * n, device=device).view(bs, n),
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
        retrieve_cum_len=None,
        spec_steps=num_steps,
        topk=topk,
        draft_token_num=n,
        capture_hidden_mode=None,
        seq_lens_sum=None,
        seq_lens_cpu=None,
        trees=trees, params=params, generators=generators, method=method, vocab_size=vocab_size,
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
    if grammar_mask is not None:
        raise RuntimeError("eagle3-plugin: grammar-constrained requests are refused at admission")
    return verify_input.sample(logits_output.next_token_logits)
