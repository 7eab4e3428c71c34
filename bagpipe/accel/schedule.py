"""FAE's schedule (``--mode fae --fae-schedule split``): each epoch regrouped into all-hot
batches and the others.

FAE trains its *hot* inputs (every lookup a hot row) in batches of their own, which
need nothing from the slow tier, and the other inputs in separate batches. Here: the
epoch's inputs, in the order the plain stream would give them, are split into the hot
ones and the rest; the hot ones fill ``n_h = hot // B`` batches, the few left over join
the others (after them), which fill ``n_o = rest // B`` batches (a last partial batch
is dropped, as the plain stream does); the two kinds are interleaved evenly (hot batch
i at (i + 1/2) / n_h of the epoch, other batch j at (j + 1/2) / n_o). This changes the
data order, so it is an approximation of the mini-batch maths: its AUC and log loss are
reported beside the exact run's (``bagpipe bench accel``).

Batch k is still a pure function of (seed, hot rows, k), so resumed runs replay it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from bagpipe.accel.profile import HotSet, all_hot_inputs
from bagpipe.data.batch import Batch
from bagpipe.data.stream import BatchStream


class FaeSchedule:
    """The batches of ``stream``'s samples regrouped as FAE does (see the module docstring).

    Quacks like a :class:`BatchStream` for the planners: :meth:`batch`, :meth:`numbered`,
    :attr:`batch_size`, :attr:`batches_per_epoch`.
    """

    def __init__(self, stream: BatchStream, hot: HotSet):
        self.stream = stream
        self.batch_size = stream.batch_size
        flags = all_hot_inputs(stream.dataset, stream.split, hot)
        self._first = np.concatenate([[0], np.cumsum([len(f) for f in flags])]).astype(np.int64)
        self._hot = np.concatenate(flags) if flags else np.zeros(0, bool)  # (samples,) by (shard, sample)
        # an input is named by its index in (shard, sample) order: 4 bytes each while that fits
        self._index_type = np.int32 if stream.num_samples < 2**31 else np.int64
        B, n_hot = self.batch_size, int(self._hot.sum())
        self.hot_batches = n_hot // B  # per epoch: the same inputs are hot in every epoch
        self.other_batches = (stream.num_samples - self.hot_batches * B) // B
        self.batches_per_epoch = self.hot_batches + self.other_batches
        self._epochs: dict[int, np.ndarray] = {}

    def _epoch(self, epoch: int) -> np.ndarray:
        """(batches, B): the inputs of every batch of epoch ``epoch``, in regrouped order."""
        if epoch not in self._epochs:
            B, nh, no = self.batch_size, self.hot_batches, self.other_batches
            shard, start, length = self.stream.epoch_blocks(epoch)
            base = self._first[shard] + start - np.concatenate([[0], np.cumsum(length)[:-1]])
            t = self._index_type  # the inputs in the plain epoch's order, built in that type
            inputs = np.repeat(base.astype(t), length) + np.arange(self.stream.num_samples, dtype=t)
            is_hot = self._hot[inputs]
            hot, other = inputs[is_hot], inputs[~is_hot]  # each in epoch order
            del inputs, is_hot
            # the fewer than B hot inputs left over join the others, after them
            batches = np.concatenate([hot, other, hot[nh * B :]])
            batches = np.concatenate([batches[: nh * B], batches[len(hot) : len(hot) + no * B]]).reshape(nh + no, B)
            keys = np.concatenate([(np.arange(nh) + 0.5) / max(nh, 1), (np.arange(no) + 0.5) / max(no, 1)])
            if len(self._epochs) > 2:
                self._epochs.clear()
            self._epochs[epoch] = batches[np.argsort(keys, kind="stable")]
        return self._epochs[epoch]

    def batch(self, index: int) -> Batch:
        """Batch ``index`` (counting across epochs) of the regrouped schedule."""
        epoch, k = divmod(index, self.batches_per_epoch)
        inputs = self._epoch(epoch)[k].astype(np.int64)
        shard = np.searchsorted(self._first, inputs, side="right") - 1
        return self.stream.gather(shard, inputs - self._first[shard])

    def numbered(self, start: int, stop: int) -> Iterator[tuple[int, Batch]]:
        for k in range(start, stop):
            yield k, self.batch(k)
