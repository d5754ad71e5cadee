"""Tensor parallelism: every rank runs its shard of the target and the whole draft, and drafts the same trees. vLLM
hands every rank the target's whole captured layers (its all-reduce runs before them) and whole logits (all-gathered);
the draft is small and replicated, and keeps its KV, all of its heads, in the draft layer's cache of each rank
(:func:`full_draft_heads`). Every rank then runs the same ops on the same numbers and draws from generators seeded
alike, as vLLM's own sampler does across ranks, so the ranks draft and verify alike. A rank whose trees differ from the
scheduler's draft tokens (rank 0's) raises (:meth:`~eagle3_plugin.vllm.step.Step.build`), and an error in a follower's
step ends its process (:func:`step_guard`), so vLLM stops the engine with an error instead of emitting wrong tokens or
hanging. The one choice not made from those numbers is the auto budget's: it reads the clock. Rank 0 makes it, and every
step :class:`ShapeBroadcast` hands its shape to the other ranks, which keep a fixed budget (nothing measured or logged
there).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import Optional

import torch

from ..budget import TreeBudget
from ..config import Eagle3Config
from ..speculator import Speculator, TreeShape

logger = logging.getLogger(__name__)


class ShapeBroadcast:
    """Rank 0's tree shape for this step, on every rank of vLLM's tensor-parallel group (one 3-integer broadcast)."""

    def __init__(self, group):
        self.group = group
        self.buffer = torch.zeros(3, dtype=torch.long)

    @classmethod
    def needed(cls, config: Eagle3Config) -> Optional["ShapeBroadcast"]:
        """The broadcast for an auto budget under tensor parallelism; None where every rank chooses alike."""
        from vllm.distributed.parallel_state import get_tp_group

        group = get_tp_group()
        return cls(group) if group.world_size > 1 and config.budget == "auto" else None

    @property
    def leads(self) -> bool:
        return self.group.rank_in_group == 0

    def agree(self, shape: TreeShape) -> TreeShape:
        """``shape`` on rank 0; the shape rank 0 passed, on the others."""
        if self.leads:
            self.buffer.copy_(torch.tensor([shape.depth, shape.top_k, shape.total_tokens]))
        self.group.broadcast(self.buffer, src=0)
        return shape if self.leads else TreeShape(*self.buffer.tolist())


def rank_budget(speculator: Speculator, broadcast: Optional[ShapeBroadcast], dtype, device) -> TreeBudget:
    """A rank's budget: the configured one, or, on a rank that takes rank 0's shapes, a fixed one."""
    if broadcast is None or broadcast.leads:
        return TreeBudget.for_speculator(speculator, dtype, device)
    return TreeBudget(dataclasses.replace(speculator.config, budget="fixed"))


def full_draft_heads(layer, num_kv_heads: int) -> None:
    """Make vLLM allocate the draft layer's cache with all ``num_kv_heads`` of the draft on every rank. vLLM built
    the layer for its own drafter, sharded like the target (its heads split over the ranks); ours is replicated,
    and only our draft reads or writes that cache. Call before vLLM reads the layers' cache specs."""
    layer.num_kv_heads = num_kv_heads


def step_guard():
    """What an engine step runs inside on this rank: nothing on rank 0 (vLLM reports its errors and stops the engine);
    on another rank of a tensor-parallel group, :func:`_end_process_on_error`. vLLM only logs a follower's error and
    waits for the next step, while rank 0 waits for the follower in the step's collectives: the engine would hang.
    Once the follower's process has ended, vLLM's executor stops the engine with an error."""
    from vllm.distributed.parallel_state import get_tp_group

    rank = get_tp_group().rank_in_group
    return contextlib.nullcontext if rank == 0 else lambda: _end_process_on_error(rank)


@contextlib.contextmanager
def _end_process_on_error(rank: int):
    try:
        yield
    except Exception:
        logger.exception("eagle3-plugin: tensor-parallel rank %d failed in its step; ending its process so that vLLM "
                         "stops the engine (rank 0 would wait for this rank in the step's collectives)", rank)
        logging.shutdown()
        os._exit(1)
