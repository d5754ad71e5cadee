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

    def uniform(self, shape, device, drawing: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``[B, ...]`` uniform in [0, 1). ``drawing [B]`` (bool): the rows whose values are read; a row with its own
        generator draws only then, so what it consumes depends on its own path alone, not on how long the other rows
        keep a batched loop going (its other values are the shared draw's)."""
        u = torch.rand(shape, generator=self.shared, device=device)
        rows = self.rows.items() if drawing is None else [(r, g) for r, g in self.rows.items() if bool(drawing[r])]
        for row, generator in rows:
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
