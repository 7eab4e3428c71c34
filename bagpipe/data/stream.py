"""Deterministic batch streams over a dataset.

The order of samples is a seeded shuffle of fixed-size *blocks* (contiguous runs of
samples inside a shard); within a block samples keep their file order. Epoch e uses
the permutation drawn from ``(seed, e)``. Batch k of a stream is therefore a pure
function of (dataset, split, batch_size, block_size, seed, k): any component (the
reference trainer, the oracle, a resumed run) replays exactly the same batches, and
:meth:`BatchStream.batches` can start at any batch index without reading the ones
before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bagpipe.config.sections import DataConfig
from bagpipe.data.batch import Batch, make_batch
from bagpipe.data.shards import Dataset
from bagpipe.errors import ConfigError, DataError

DEFAULT_BLOCK_SIZE = 4096


@dataclass(frozen=True)
class _EpochLayout:
    shard: np.ndarray  # (nblocks,) shard index of each block, in epoch order
    start: np.ndarray  # (nblocks,) first sample of the block inside its shard
    length: np.ndarray  # (nblocks,)
    cum: np.ndarray  # (nblocks + 1,) first position of each block in the epoch sequence


class BatchStream:
    """Batches of one split, in deterministic order.

    Args:
        dataset: the dataset to read.
        split: ``"train"`` or ``"eval"``.
        batch_size: B, samples per batch.
        seed: shuffles the block order per epoch; ignored when ``shuffle`` is False.
        shuffle: False reads the split in file order (evaluation).
        drop_last: drop each epoch's final partial batch (training does; eval does not).
        block_size: samples per shuffled block.
    """

    def __init__(
        self,
        dataset: Dataset,
        split: str,
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ):
        if batch_size <= 0:
            raise ConfigError(f"batch_size must be > 0, got {batch_size}")
        if block_size <= 0:
            raise ConfigError(f"block_size must be > 0, got {block_size}")
        self.dataset = dataset
        self.meta = dataset.meta
        self.split = split
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.block_size = block_size
        sizes = dataset.shard_sizes(split)
        self.num_samples = int(sum(sizes))
        if self.num_samples == 0:
            raise DataError(f"{dataset.dir}: split {split!r} is empty")
        if drop_last and self.num_samples < batch_size:
            raise ConfigError(f"batch size {batch_size} exceeds the {self.num_samples} samples of split {split!r}")
        shard, start, length = [], [], []
        for s, n in enumerate(sizes):
            for b0 in range(0, n, block_size):
                shard.append(s)
                start.append(b0)
                length.append(min(block_size, n - b0))
        self._blocks = (np.array(shard, np.int64), np.array(start, np.int64), np.array(length, np.int64))
        self._layouts: dict[int, _EpochLayout] = {}
        self.table_offsets = np.concatenate([[0], np.cumsum(self.meta.table_sizes)]).astype(np.int64)

    @property
    def batches_per_epoch(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    def _layout(self, epoch: int) -> _EpochLayout:
        if epoch not in self._layouts:
            shard, start, length = self._blocks
            if self.shuffle:
                perm = np.random.default_rng([self.seed, epoch]).permutation(len(shard))
                shard, start, length = shard[perm], start[perm], length[perm]
            cum = np.concatenate([[0], np.cumsum(length)])
            if len(self._layouts) > 4:
                self._layouts.clear()
            self._layouts[epoch] = _EpochLayout(shard, start, length, cum)
        return self._layouts[epoch]

    def batch(self, index: int) -> Batch:
        """Batch number ``index`` (0-based, counting across epochs)."""
        if index < 0:
            raise ValueError("batch index must be >= 0")
        per_epoch = self.batches_per_epoch
        epoch, k = divmod(index, per_epoch)
        lo = k * self.batch_size
        hi = min(lo + self.batch_size, self.num_samples)
        return self._read(self._layout(epoch), lo, hi)

    def batches(self, start: int = 0, stop: int | None = None) -> Iterator[Batch]:
        """Batches ``start, start+1, ...`` up to ``stop`` (exclusive; None: one epoch past start)."""
        if stop is None:
            stop = start + self.batches_per_epoch
        for i in range(start, stop):
            yield self.batch(i)

    def numbered(self, start: int, stop: int) -> Iterator[tuple[int, Batch]]:
        """``(k, batch k)`` for k in [start, stop): what planners and trainers consume."""
        for k in range(start, stop):
            yield k, self.batch(k)

    def epoch_blocks(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The blocks of epoch ``epoch`` in epoch order: (shard, first sample, samples) of each;
        position p of the epoch is batch p // B's sample p % B."""
        lay = self._layout(epoch)
        return lay.shard, lay.start, lay.length

    def gather(self, shard: np.ndarray, sample: np.ndarray) -> Batch:
        """The samples ``(shard[i], sample[i])`` as one batch, ordered by (shard, sample) (a
        regrouped schedule's batches: :mod:`bagpipe.accel.schedule`)."""
        labels, dense, sparse = [], [], []
        mh: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {f.name: [] for f in self.meta.multihot_features}
        for s in np.unique(shard):
            idx = np.sort(sample[shard == s])
            sh = self.dataset.shard(self.split, int(s))
            labels.append(sh.labels[idx])
            dense.append(sh.dense[idx])
            sparse.append(sh.sparse[idx])
            for name, (values, offsets) in sh.multihot.items():
                mh[name].append(bag_values(values, offsets, idx))
        return self._to_batch(np.concatenate(labels), np.concatenate(dense), np.concatenate(sparse), mh)

    def _read(self, lay: _EpochLayout, lo: int, hi: int) -> Batch:
        b0 = int(np.searchsorted(lay.cum, lo, side="right")) - 1
        b1 = int(np.searchsorted(lay.cum, hi, side="left"))
        labels, dense, sparse = [], [], []
        mh: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {f.name: [] for f in self.meta.multihot_features}
        for b in range(b0, b1):
            s0 = int(lay.start[b]) + max(0, lo - int(lay.cum[b]))
            s1 = int(lay.start[b]) + min(int(lay.length[b]), hi - int(lay.cum[b]))
            sh = self.dataset.shard(self.split, int(lay.shard[b]))
            self.dataset.check_block(
                self.split, int(lay.shard[b]), int(lay.start[b]), int(lay.start[b] + lay.length[b])
            )
            labels.append(sh.labels[s0:s1])
            dense.append(sh.dense[s0:s1])
            sparse.append(sh.sparse[s0:s1])
            for name, (values, offsets) in sh.multihot.items():
                o = np.asarray(offsets[s0 : s1 + 1])
                mh[name].append((np.asarray(values[o[0] : o[-1]]), np.diff(o)))
        return self._to_batch(np.concatenate(labels), np.concatenate(dense), np.concatenate(sparse), mh)

    def _to_batch(self, labels, dense, sparse, mh) -> Batch:
        multihot = {
            name: (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
            for name, parts in mh.items()
        }
        return make_batch(self.meta.features, self.table_offsets, labels, dense, sparse, multihot)


def train_stream(dataset: Dataset, data: DataConfig, seed: int) -> BatchStream:
    """The training batches of a run: the one place they are defined (the training loop,
    the oracle role and Slipstream's sampler read the same stream)."""
    return BatchStream(dataset, "train", data.batch_size, seed=seed, block_size=data.block_size)


def bag_values(values: np.ndarray, offsets: np.ndarray, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A multi-hot feature's ids of ``samples`` (ascending) of one shard: (their ids
    concatenated, (n,) lengths), from the shard's (nnz,) ``values`` and (n + 1,) ``offsets``."""
    starts = np.asarray(offsets[samples], dtype=np.int64)
    lengths = np.asarray(offsets[samples + 1], dtype=np.int64) - starts
    first = np.cumsum(lengths) - lengths  # where each sample's ids start in the output
    pos = np.repeat(starts - first, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)
    return np.asarray(values[pos]), lengths
