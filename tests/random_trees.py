"""Random draft trees for tests (node ``j``'s parent drawn among nodes ``0 .. j - 1``)."""

import torch

from eagle3_plugin.tree import DraftTree


def random_trees(b: int, n: int, ids: int, gen: torch.Generator) -> DraftTree:
    """``b`` trees of ``n`` nodes over token ids ``0 .. ids - 1`` (few ids: repeats on paths)."""
    parents = torch.full((b, n), -1, dtype=torch.long)
    depths = torch.zeros(b, n, dtype=torch.long)
    for row in range(b):
        for node in range(1, n):
            parent = int(torch.randint(0, node, (1,), generator=gen))
            parents[row, node], depths[row, node] = parent, depths[row, parent] + 1
    return DraftTree(torch.randint(0, ids, (b, n), generator=gen), parents, depths)
