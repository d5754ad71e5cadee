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
        rows = list(self.rows) if drawing is None else self.seeded_rows_where(drawing)
        for row in rows:
            u[row] = torch.rand(shape[1:], generator=self.rows[row], device=device)
        return u

    def seeded_rows_where(self, flags: torch.Tensor) -> list[int]:
        """The rows with a generator of their own whose ``flags [B]`` (bool) entry is set, ascending: one host read
        for all of them (none without seeded rows)."""
        seeded = sorted(self.rows)
        if not seeded:
            return []
        chosen = flags[torch.tensor(seeded, device=flags.device)].tolist()
        return [row for row, flag in zip(seeded, chosen) if flag]

    def categorical(self, probs: torch.Tensor) -> torch.Tensor:
        """One index per row of ``probs [B, V]`` (inverse CDF; never a zero-probability index)."""
        cdf = probs.double().cumsum(-1)
        u = self.uniform(probs.shape[:1], probs.device).double() * cdf[:, -1]
        index = torch.searchsorted(cdf, u[:, None], right=True)[:, 0]
        return index.clamp(max=probs.shape[-1] - 1)


def as_row_random(generator: Union[RowRandom, torch.Generator, None]) -> RowRandom:
    return generator if isinstance(generator, RowRandom) else RowRandom(generator)
