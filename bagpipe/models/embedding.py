"""The embedding collection: pooled lookups over all tables at once.

Every table lives in one global row space, so one ``embedding_bag`` over a small
(U, D) tensor of the batch's unique rows serves all F features. Where those U rows
come from (the full tables, or the slots of a cache) is the caller's business: the
models only ever see the pooled (B, F, D) result.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gather_rows(weights: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """A leaf copy of ``weights[index]`` (U, D) that collects the rows' gradients."""
    return weights.index_select(0, index).requires_grad_(True)


def pool(
    rows_u: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor, batch_size: int, num_features: int
) -> torch.Tensor:
    """Sum-pool lookups into one vector per (sample, feature).

    Args:
        rows_u: (U, D) values of the batch's unique rows.
        inverse: (N,) position in ``rows_u`` of every lookup (feature-major order).
        offsets: (F*B + 1,) bag boundaries into ``inverse``.
    Returns:
        (B, F, D) pooled embeddings.
    """
    bags = F.embedding_bag(inverse, rows_u, offsets, mode="sum", include_last_offset=True)  # (F*B, D)
    return bags.view(num_features, batch_size, -1).transpose(0, 1)
