"""The batch type every model, trainer and oracle takes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bagpipe.data.schema import FeatureSpec


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


def make_batch(
    features: Sequence[FeatureSpec],
    table_offsets: np.ndarray,
    labels: np.ndarray,
    dense: np.ndarray,
    sparse: np.ndarray,
    multihot: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> Batch:
    """A :class:`Batch` in global row space from table-local ids.

    ``features``: the F features in schema order; ``table_offsets`` (F + 1,) each table's
    first global row; labels (B,), dense (B, Dd); sparse (B, F1) ids of the one-hot
    features in schema order; multihot: name -> (ids (nnz,), lengths (B,)) of each
    multi-hot feature. The batch stream and ``bagpipe predict`` both build batches here.
    """
    B = len(labels)
    F = len(features)
    offs = table_offsets
    if not multihot:
        rows = (sparse.astype(np.int64) + offs[None, :-1]).T.reshape(-1)
        offsets = np.arange(F * B + 1, dtype=np.int64)
    else:
        parts, lengths = [], []
        j = 0
        for f_idx, f in enumerate(features):
            if f.multi_hot:
                vals = multihot[f.name][0].astype(np.int64)
                lens = multihot[f.name][1].astype(np.int64)
            else:
                vals = sparse[:, j].astype(np.int64)
                lens = np.ones(B, np.int64)
                j += 1
            parts.append(vals + offs[f_idx])
            lengths.append(lens)
        rows = np.concatenate(parts)
        offsets = np.zeros(F * B + 1, np.int64)
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
    return Batch(
        labels=torch.from_numpy(np.ascontiguousarray(labels, dtype=np.float32)),
        dense=torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)),
        rows=torch.from_numpy(np.ascontiguousarray(rows)),
        offsets=torch.from_numpy(offsets),
        num_features=F,
    )


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
