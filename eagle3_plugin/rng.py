"""Random numbers for a batch whose rows may bring their own generator (seeded requests).

Every random draw of the tree builder and the sampler goes through :class:`RowRandom`: one draw for all rows
from the shared generator, then the rows with a generator of their own redrawn from it, so a seeded request
repeats whatever else is in the batch.
"""

from __future__ import annotations

from typing import Optional, Union

import torch


class RowRandom:
    def __init__(self, shared: Optional[torch.Generator] = None, rows: Optional[dict[int, torch.Generator]] = None):
        self.shared, self.rows = shared, rows or {}

    def uniform(self, shape, device) -> torch.Tensor:
        """``[B, ...]`` uniform in [0, 1)."""
        u = torch.rand(shape, generator=self.shared, device=device)
        for row, generator in self.rows.items():
            u[row] = torch.rand(shape[1:], generator=generator, device=device)
        return u

    def categorical(self, probs: torch.Tensor) -> torch.Tensor:
        """One index per row of ``probs [B, V]`` (inverse CDF; never a zero-probability index)."""
        cdf = probs.double().cumsum(-1)
        u = self.uniform(probs.shape[:1], probs.device).double() * cdf[:, -1]
        index = torch.searchsorted(cdf, u[:, None], right=True)[:, 0]
        return index.clamp(max=probs.shape[-1] - 1)


def as_row_random(generator: Union[RowRandom, torch.Generator, None]) -> RowRandom:
    return generator if isinstance(generator, RowRandom) else RowRandom(generator)
