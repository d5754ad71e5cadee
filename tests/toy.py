"""A toy bigram target and draft for exact distribution tests of the tree builder and the sampler."""

from __future__ import annotations

import torch

from eagle3_plugin.sampler import SamplingParams, target_probs, verify_tree
from eagle3_plugin.tree import build_tree


class Bigram:
    """Target logits ``P[prev]`` over ``vocab`` tokens; the draft sees a noisy copy over ``hot_ids`` only."""

    def __init__(self, vocab: int = 6, draft_vocab: int = 5, noise: float = 1.0, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.target = 2.0 * torch.randn(vocab, vocab, generator=g)
        self.hot_ids = torch.sort(torch.randperm(vocab, generator=g)[:draft_vocab]).values
        self.draft = (self.target + noise * torch.randn(vocab, vocab, generator=g))[:, self.hot_ids]
        self.vocab = vocab

    def exact_two_token(self, root: int, params: SamplingParams) -> torch.Tensor:
        """``[V, V]`` exact joint distribution of the next two tokens after ``root``."""
        one = params.select(torch.zeros(1, dtype=torch.long))
        first = target_probs(self.target[root][None], one)[0]
        second = target_probs(self.target[None], one)[0]
        return first[:, None] * second

    def one_round(self, roots, depth, top_k, total, params, method, sample, generator, verify=verify_tree):
        def expand(level, tokens, parent_slot):
            return self.draft[tokens]

        tree = build_tree(roots, self.draft[roots], expand, depth, top_k, total, params.temperature,
                          sample, self.hot_ids, generator)
        verdict = verify(tree, self.target[tree.tokens], params, method, generator)
        return tree, verdict

    def sample_two_tokens(self, n: int, root: int, depth: int, top_k: int, total: int, params_row: dict,
                          method: str, sample: bool, seed: int = 0, verify=verify_tree) -> torch.Tensor:
        """``[n, 2]`` first two emitted tokens of ``n`` independent speculative runs from ``root``."""
        g = torch.Generator().manual_seed(seed)
        params = SamplingParams.uniform(n, **params_row)
        roots = torch.full((n,), root, dtype=torch.long)
        tree, verdict = self.one_round(roots, depth, top_k, total, params, method, sample, g, verify)
        first_path = tree.tokens.gather(1, verdict.accepted[:, 1:2].clamp(min=0))[:, 0]
        first = torch.where(verdict.num_accepted >= 1, first_path, verdict.bonus)
        second_path = tree.tokens.gather(1, verdict.accepted[:, 2:3].clamp(min=0))[:, 0] if depth >= 2 else first
        second = torch.where(verdict.num_accepted >= 2, second_path, verdict.bonus)
        # Rows that emitted a single token continue with a second round rooted at it.
        next_round = self._first_token(first, depth, top_k, total, params, method, sample, g, verify)
        second = torch.where(verdict.num_accepted >= 1, second, next_round)
        return torch.stack([first, second], dim=1)

    def _first_token(self, roots, depth, top_k, total, params, method, sample, g, verify):
        tree, verdict = self.one_round(roots, depth, top_k, total, params, method, sample, g, verify)
        path = tree.tokens.gather(1, verdict.accepted[:, 1:2].clamp(min=0))[:, 0]
        return torch.where(verdict.num_accepted >= 1, path, verdict.bonus)
