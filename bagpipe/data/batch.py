"""The batch type every model, trainer and oracle takes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
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


def select_samples(batch: Batch, samples: np.ndarray) -> tuple[Batch, np.ndarray]:
    """Samples ``samples`` (ascending) of ``batch`` -> (the sub-batch, (n,) positions of its
    lookups in ``batch.rows``): a data-parallel trainer's slice, Hotline's micro-batches."""
    samples = np.asarray(samples, dtype=np.int64)
    B, F = batch.batch_size, batch.num_features
    offsets = batch.offsets.numpy()
    bags = (np.arange(F, dtype=np.int64)[:, None] * B + samples[None, :]).ravel()  # feature-major
    starts, ends = offsets[bags], offsets[bags + 1]
    lengths = ends - starts
    new_offsets = np.zeros(len(bags) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    # positions of every lookup of the selected bags, in order
    pos = np.repeat(starts - new_offsets[:-1], lengths) + np.arange(new_offsets[-1], dtype=np.int64)
    index = torch.from_numpy(samples)
    sub = Batch(
        labels=batch.labels[index],
        dense=batch.dense[index],
        rows=batch.rows[torch.from_numpy(pos)],
        offsets=torch.from_numpy(new_offsets),
        num_features=F,
    )
    return sub, pos
