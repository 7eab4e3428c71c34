"""The batch type every model, trainer and oracle takes."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """One mini-batch in global row space.

    Categorical lookups are stored feature-major, like TorchRec's KeyedJaggedTensor:
    all bags of feature 0 (one per sample), then all bags of feature 1, ...

    Attributes:
        labels: (B,) float32 click labels in {0, 1}.
        dense: (B, Dd) float32 dense features.
        rows: (N,) int64 global row indices (table offset + id) of every lookup.
        offsets: (F*B + 1,) int64; bag j = feature j // B of sample j % B covers
            ``rows[offsets[j]:offsets[j+1]]``. For one-hot data N = F*B and
            offsets = arange(F*B + 1).
        num_features: F.
    """

    labels: torch.Tensor
    dense: torch.Tensor
    rows: torch.Tensor
    offsets: torch.Tensor
    num_features: int

    @property
    def batch_size(self) -> int:
        return int(self.labels.shape[0])
