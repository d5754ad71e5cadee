"""Reference speculative generator: a transformers target + our draft, chain or tree, batch >= 1.

The golden model the engine integrations are checked against. One round, per batch of rows:

    draft tree from the root (the last emitted token)            tree.build_tree + Eagle3Draft
    one target forward over [root, tree nodes] with tree mask    transformers model, 4D additive mask
    verification                                                 sampler.verify_tree
    KV compaction of the accepted path (target and draft)        kv.compaction_index
    draft catch-up on the accepted tokens with real features     FusedCapture + speculator.Speculator

Rows are ragged: every cache carries a validity mask and positions are counted per row.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from .capture import FusedCapture
from .capture_ids import default_layer_ids
from .checkpoint import load_draft, validate_against_target
from .config import Eagle3Config
from .draft import Eagle3Draft
from .kv import additive_mask, compaction_index, gather_slots
from .rng import RowRandom
from .sampler import SamplingParams, sample_tokens, verify_tree
from .speculator import DraftKV, DraftRows, Speculator


@dataclass
class AcceptanceStats:
    """Counts over drafting rounds (one round = one target forward verifying a tree)."""

    depth: int
    rounds: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list = field(default_factory=list)

    def __post_init__(self):
        self.accepted_per_position = self.accepted_per_position or [0] * self.depth

    def add(self, num_accepted: torch.Tensor) -> None:
        self.rounds += int(num_accepted.numel())
        self.accepted_tokens += int(num_accepted.sum())
        for pos in range(self.depth):
            self.accepted_per_position[pos] += int((num_accepted > pos).sum())

    def merge(self, other: "AcceptanceStats") -> None:
        self.rounds += other.rounds
        self.accepted_tokens += other.accepted_tokens
        self.accepted_per_position = [a + b for a, b in zip(self.accepted_per_position, other.accepted_per_position)]

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per target forward: 1 + accepted draft tokens per round."""
        return 1.0 + self.accepted_tokens / self.rounds if self.rounds else float("nan")

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        """Fraction of rounds whose draft token at position i (1-based i = index + 1) was accepted."""
        return [a / self.rounds if self.rounds else float("nan") for a in self.accepted_per_position]


@dataclass
class Generation:
    tokens: list[list[int]]  # new tokens per prompt (prompt excluded), cut at max_new_tokens / EOS
    stats: Optional[AcceptanceStats]
    seconds: float
    target_forwards: int


class TargetKVCache:
    """A transformers ``DynamicCache`` plus per-slot validity, compacted with :func:`compaction_index`."""

    def __init__(self, cache, batch: int, device):
        self.cache = cache
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)

    def keep(self, keep: torch.Tensor) -> None:
        index, self.valid = compaction_index(keep)
        for layer in self.cache.layers:
            layer.keys, layer.values = gather_slots(layer.keys, index), gather_slots(layer.values, index)


class SpeculativeGenerator:
    """``generate`` (speculative) and ``generate_baseline`` (plain autoregressive, same code paths)."""

    def __init__(self, target, draft: Eagle3Draft, config: Eagle3Config, layer_ids=None):
        self.target = target.eval()
        self.draft = draft.eval()
        ids = layer_ids or config.layer_ids or default_layer_ids(target.config.num_hidden_layers)
        self.layer_ids = validate_against_target(draft, target.config, ids, where="draft")
        draft.attach_embedding(target.get_input_embeddings())
        self.speculator = Speculator(draft, config)
        self.capture = FusedCapture(target, self.layer_ids)
        self.device = next(target.parameters()).device
        # transformers 5.x renamed `past_key_values` to `cache`; take whichever this version has.
        self._cache_kwarg = "cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values"

    @property
    def config(self) -> Eagle3Config:
        return self.speculator.config

    @config.setter
    def config(self, config: Eagle3Config) -> None:
        """Switch speculation settings (chain / tree shape, sampler) without reloading anything."""
        self.speculator.config = config

    @classmethod
    def from_pretrained(cls, target_dir: str, config: Eagle3Config, dtype=torch.float32) -> "SpeculativeGenerator":
        from transformers import AutoModelForCausalLM
        target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype, attn_implementation="sdpa")
        return cls(target, load_draft(config.draft, dtype=dtype), config)

    # -- target forwards -------------------------------------------------------------------------

    def _target_forward(self, kv: TargetKVCache, input_ids, positions, allowed_new, new_valid):
        """Run the target on ``input_ids [B, Q]``; queries see valid cached slots plus ``allowed_new``."""
        b, q = input_ids.shape
        allowed = torch.cat([kv.valid[:, None, :].expand(b, q, -1), allowed_new], dim=2)
        with self.capture:
            out = self.target(input_ids=input_ids, position_ids=positions, attention_mask=additive_mask(
                allowed, self.target.dtype), use_cache=True, **{self._cache_kwarg: kv.cache})
        kv.valid = torch.cat([kv.valid, new_valid], dim=1)
        return out.logits.float(), self.capture.features.clone()

    def _prefill(self, prompts: list[list[int]]) -> "_Prefilled":
        """The target's forward over the prompts, left-padded into one batch."""
        from transformers import DynamicCache
        b, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.zeros(b, width, dtype=torch.long, device=self.device)
        valid = torch.zeros(b, width, dtype=torch.bool, device=self.device)
        for row, p in enumerate(prompts):  # left padding: each row's tokens end at the last column
            ids[row, width - len(p):] = torch.tensor(p, device=self.device)
            valid[row, width - len(p):] = True
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).tril()
        allowed = causal[None] & valid[:, None, :]
        kv = TargetKVCache(DynamicCache(), b, self.device)
        logits, features = self._target_forward(kv, ids, positions, allowed, valid)
        return _Prefilled(kv, ids, valid, logits[:, -1], features)

    # -- generation --------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate_baseline(self, prompts, max_new_tokens: int, params: SamplingParams, eos_token_id=None,
                          seed: int = 0) -> Generation:
        """Non-speculative decoding with the same cache and sampling code (for speed baselines)."""
        generator = torch.Generator(device=self.device).manual_seed(seed)
        start = time.perf_counter()
        prefilled = self._prefill(prompts)
        kv, last_logits = prefilled.kv, prefilled.last_logits
        lengths = kv.valid.sum(1)
        out = _Emitter(len(prompts), max_new_tokens, eos_token_id)
        forwards = 1
        while True:
            token = sample_tokens(last_logits, params, generator)
            out.emit([[t] for t in token.tolist()])
            if out.all_done:
                break
            one = torch.ones(len(prompts), 1, 1, dtype=torch.bool, device=self.device)
            logits, _ = self._target_forward(kv, token[:, None], lengths[:, None], one, one[:, :, 0])
            lengths = lengths + 1
            last_logits = logits[:, -1]
            forwards += 1
        return Generation(out.tokens, None, time.perf_counter() - start, forwards)

    @torch.inference_mode()
    def generate(self, prompts, max_new_tokens: int, params: SamplingParams, eos_token_id=None,
                 seed: int = 0) -> Generation:
        """Speculative decoding of every prompt (lists of target token ids) with ``self.config``."""
        cfg = self.config
        random = RowRandom(torch.Generator(device=self.device).manual_seed(seed))
        b = len(prompts)
        rows = torch.arange(b, device=self.device)
        start = time.perf_counter()
        prefilled = self._prefill(prompts)
        kv, ids, valid, features = prefilled.kv, prefilled.ids, prefilled.valid, prefilled.features
        root = sample_tokens(prefilled.last_logits, params, random)
        out = _Emitter(b, max_new_tokens, eos_token_id)
        out.emit([[t] for t in root.tolist()])
        stats = AcceptanceStats(cfg.depth)
        forwards = 1

        # The draft's store: row b's position p in slot b * span + p. Every round but the last gives each row that is
        # not done at least one token, and any row at most depth + 1 (rows that are done keep running).
        span = ids.shape[1] + max_new_tokens * (cfg.depth + 1) + cfg.total_tokens
        c = self.draft.config
        store = DraftKV.allocate(b * span, c.num_key_value_heads, c.head_dim, features.dtype, self.device)
        slots = torch.arange(b * span, device=self.device).view(b, span)
        # Draft prefill: each prompt's features at 0 .. n - 1 with the tokens after them (the last: the root).
        lengths = valid.sum(1)
        left = (ids.shape[1] - lengths)[:, None] + torch.arange(ids.shape[1], device=self.device)
        left = left.clamp(max=ids.shape[1] - 1)  # left-aligned view of the left-padded prompts
        next_ids = torch.cat([ids[:, 1:], root[:, None]], dim=1)
        draft_rows = DraftRows(slots, torch.zeros_like(lengths), lengths, next_ids.gather(1, left),
                               features[rows[:, None], left])
        while not out.all_done:
            tree = self.speculator.step(store, draft_rows, params, random)
            lengths = kv.valid.sum(1)  # = the root's position
            logits, node_features = self._target_forward(
                kv, tree.tokens, lengths[:, None] + tree.depths, tree.ancestor_mask(),
                torch.ones_like(tree.tokens, dtype=torch.bool))
            forwards += 1
            verdict = verify_tree(tree, logits, params, cfg.tree_sampler, random)
            stats.add(verdict.num_accepted[~out.done_tensor(self.device)])
            path = verdict.accepted  # [B, depth + 1], root first
            on_path = torch.zeros_like(tree.tokens, dtype=torch.bool)
            on_path[rows[:, None].expand_as(path)[path >= 0], path[path >= 0]] = True
            kv.keep(torch.cat([kv.valid[:, :-tree.size], on_path], dim=1))
            out.emit(verdict.output_tokens(tree))

            # Draft catch-up: the path's features (root at the root's position) with the token after each.
            path_c = path.clamp(min=0)
            draft_rows = DraftRows(slots, lengths, verdict.num_accepted + 1, verdict.emitted(tree).clamp(min=0),
                                   node_features[rows[:, None], path_c])
        return Generation(out.tokens, stats, time.perf_counter() - start, forwards)


@dataclass
class _Prefilled:
    """The prompts after the target's forward: its cache, ``ids``/``valid [B, W]`` (left-padded), each row's
    ``last_logits [B, V]`` and the captured ``features [B, W, 3H]``."""

    kv: TargetKVCache
    ids: torch.Tensor
    valid: torch.Tensor
    last_logits: torch.Tensor
    features: torch.Tensor


class _Emitter:
    """Collects emitted tokens per row, stopping a row at ``max_new_tokens`` or its first EOS."""

    def __init__(self, batch: int, max_new_tokens: int, eos_token_id):
        self.tokens = [[] for _ in range(batch)]
        self.done = [max_new_tokens <= 0] * batch
        self.max_new_tokens = max_new_tokens
        self.eos = eos_token_id

    def emit(self, per_row: list[list[int]]) -> None:
        for row, new in enumerate(per_row):
            for token in new:
                if self.done[row]:
                    break
                self.tokens[row].append(token)
                self.done[row] = len(self.tokens[row]) >= self.max_new_tokens or token == self.eos

    def done_tensor(self, device) -> torch.Tensor:
        return torch.tensor(self.done, dtype=torch.bool, device=device)

    @property
    def all_done(self) -> bool:
        return all(self.done)
