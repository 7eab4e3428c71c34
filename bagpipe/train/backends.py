"""Embedding backends: where a step's unique rows come from and where their updates go.

Both are :class:`~bagpipe.train.protocols.Backend` implementations:

* :class:`FullBackend` (a mode without a planner: ``--mode full``, the reference): every
  table in one (R, D) tensor in process memory.
* :class:`CachedBackend` (every mode with a store, and every distributed trainer): the
  rows live in an :class:`EmbeddingStore` (in this process, or on embedding servers
  behind a ``RemoteStore``); a :class:`~bagpipe.train.protocols.PlanSource` decides which
  slot of a small (C, D) cache each row occupies, and an executor
  (:mod:`bagpipe.cache.executor`, the mode's ``ModeSpec.executor``) moves rows between
  store and cache. With a hot tier (:mod:`bagpipe.accel.hot`) the cache has C + H slots,
  the last H holding the hot rows for the whole run.

Both hand the training step the same thing: a table tensor plus the indices (global
rows or slots) of the batch's unique rows in ascending global-row order, and the
inverse map of every lookup. That is why their results agree bit for bit.

Both live on a :class:`~bagpipe.device.Device`: the full tables, or the cache and its
optimizer state, in its memory (a GPU's on ``--device cuda``), the index and inverse
put there for each step; the store stays in host memory or on disk, and a cached
backend's rows travel through one :class:`~bagpipe.cache.transfer.Transfers`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

from bagpipe.accel.hot import HotSet, hot_section
from bagpipe.cache.executor import PlanExecutor
from bagpipe.cache.slots import SlotCache
from bagpipe.cache.transfer import Transfers
from bagpipe.checkpoint import CheckpointReader, Snapshot, restore_rows, take_snapshot
from bagpipe.data.prefetch import Prefetched
from bagpipe.data.stream import BatchStream
from bagpipe.device import Device, HostDevice
from bagpipe.memory import Fit
from bagpipe.oracle.plan import Plan
from bagpipe.store.base import EXPORT_CHUNK_ROWS, EmbeddingStore
from bagpipe.store.init import RowInitializer
from bagpipe.train.protocols import IdRows, PlanSource, Rows, StepInput
from bagpipe.train.summary import CacheStats

HOT_LOAD_ROWS = 1 << 16  # hot rows read from the store at a time when training starts (bounds the copy)
TOUCHED_CHUNK = 1 << 18  # rows read at a time for the digest


def touched_rows(rows: np.ndarray, peek) -> IdRows:
    """(rows, weights, state) chunks of ascending ``rows``, values from ``peek``."""
    for a in range(0, len(rows), TOUCHED_CHUNK):
        ids = rows[a : a + TOUCHED_CHUNK]
        w, s = peek(ids)
        yield ids, w, s


def store_lookup(store: EmbeddingStore, rows: torch.Tensor) -> torch.Tensor:
    """(U, D) current weights of ``rows`` from a store, for evaluation (not counted as training reads)."""
    w, _ = store.peek(rows.cpu().numpy())
    return torch.from_numpy(np.ascontiguousarray(w))


class FullBackend:
    """All tables in the device's memory (on ``--device cuda``, the GPU's): the reference.

    It is also a checkpoint's row source (:class:`bagpipe.checkpoint.parts.RowSource`)
    and a restore's target (:class:`bagpipe.checkpoint.reader.RowTarget`): the rows each
    step updates are remembered, for the next checkpoint's cut and for the digest.
    """

    def __init__(self, init: RowInitializer, state_dim: int, device: Device | None = None):
        self.init = init
        self.device = HostDevice() if device is None else device
        self.num_rows, self.dim, self.state_dim = init.num_rows, init.dim, int(state_dim)
        dev = self.device.torch
        self.weights = torch.empty(init.num_rows, init.dim, device=dev)
        for a in range(0, init.num_rows, EXPORT_CHUNK_ROWS):
            b = min(a + EXPORT_CHUNK_ROWS, init.num_rows)
            self.weights[a:b] = torch.from_numpy(init.range(a, b))
        self.state = torch.zeros(init.num_rows, state_dim, device=dev)
        self._dirty = np.zeros(init.num_rows, dtype=bool)  # rows updated since the last checkpoint's cut
        self._written = np.zeros(init.num_rows, dtype=bool)  # rows updated (or restored) since initialisation
        self.memory: Fit | None = None  # the memory budget's check of the run, for the summary

    # a restore's target (RowTarget) and a cut's source (RowSource)
    def load(self, rows: np.ndarray, weights: np.ndarray, state: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        put = self.device.put
        idx = put(torch.from_numpy(rows))
        self.weights.index_copy_(0, idx, put(torch.from_numpy(np.ascontiguousarray(weights, np.float32))))
        self.state.index_copy_(0, idx, put(torch.from_numpy(np.ascontiguousarray(state, np.float32))))
        self._written[rows] = True

    def reset(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        idx = self.device.put(torch.from_numpy(rows))
        self.weights.index_copy_(0, idx, self.device.put(torch.from_numpy(self.init.rows(rows))))
        self.state.index_fill_(0, idx, 0.0)
        self._written[rows] = False

    def written_rows(self) -> np.ndarray:
        return np.flatnonzero(self._written).astype(np.int64)

    def peek(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = self.device.put(torch.from_numpy(np.asarray(rows, dtype=np.int64)))
        return self.weights.index_select(0, idx).cpu().numpy(), self.state.index_select(0, idx).cpu().numpy()

    def take_dirty(self) -> np.ndarray:
        rows = np.flatnonzero(self._dirty).astype(np.int64)
        self._dirty[:] = False
        return rows

    def restore(self, reader: CheckpointReader) -> None:
        restore_rows(self, reader)

    def snapshot(self, everything: bool) -> Snapshot:
        return take_snapshot(self, everything)

    def touched(self) -> IdRows:
        return touched_rows(self.written_rows(), self.peek)

    def steps(self, stream: BatchStream, start: int, stop: int, before_evict=None) -> Iterator[StepInput]:
        def prepare():
            for step, batch in stream.numbered(start, stop):
                uniq, inverse = torch.unique(batch.rows, sorted=True, return_inverse=True)
                yield step, batch, uniq, inverse

        loader = Prefetched(prepare())
        put = self.device.put
        try:
            for step, batch, uniq, inverse in loader:
                rows = uniq.numpy()  # no checkpoint's cut comes before the step is done
                self._dirty[rows] = True
                self._written[rows] = True
                yield StepInput(step, batch, self.weights, self.state, put(uniq), put(inverse))
        finally:
            loader.close()

    def after_step(self, inp: StepInput) -> None:
        pass

    def flush(self, label: int, durable: bool = True) -> None:
        pass

    def finish(self) -> None:
        pass

    def export(self) -> Rows:
        for a in range(0, self.init.num_rows, EXPORT_CHUNK_ROWS):
            b = min(a + EXPORT_CHUNK_ROWS, self.init.num_rows)
            yield a, self.weights[a:b].cpu().numpy(), self.state[a:b].cpu().numpy()

    def lookup(self, rows: torch.Tensor) -> torch.Tensor:
        return self.weights.index_select(0, self.device.put(rows))

    def phase_seconds(self) -> dict:
        return {}

    def stats(self) -> None:
        return None

    def close(self, abandon: bool = False) -> None:
        pass


class CachedBackend:
    """Rows in a store, a C-slot cache in the trainer, plans from a :class:`PlanSource`.

    Args:
        store: where the rows live.
        cache_rows: C.
        source: the plans.
        executor: the executor class that runs them (:data:`bagpipe.cache.EXECUTORS`).
        writes_cached: whether :meth:`flush` writes the cached rows to the store (in a
            data-parallel job the cached rows are equal on every trainer: one writes them).
        hot: the hot rows (slots C..C+H-1, read from the store when training starts), if any;
            the source's plans must then come through a ``HotSplit`` of C slots.
        autotune: the auto-tuner's choice of C and L, for the summary (None when not used).
        depth: plans the executor fetches ahead (its ``depth``); None: L + 1.
        device: where the cache lives (default: host memory).

    ``memory`` is the memory budget's fit of the run (:class:`bagpipe.memory.Fit`), set by
    the topology that sized it, for the summary.
    """

    def __init__(
        self,
        store: EmbeddingStore,
        cache_rows: int,
        source: PlanSource,
        executor: type[PlanExecutor],
        *,
        writes_cached: bool = True,
        hot: HotSet | None = None,
        autotune: dict | None = None,
        depth: int | None = None,
        device: Device | None = None,
    ):
        self.store = store
        self.depth = depth
        self.memory: Fit | None = None
        self.source = source
        self.executor_class = executor
        self.cold_rows = cache_rows
        self.hot = hot
        self.device = HostDevice() if device is None else device
        self.transfers = Transfers(self.device)
        slots = cache_rows + (len(hot) if hot is not None else 0)
        self.cache = SlotCache(slots, store.dim, store.state_dim, self.device.torch)
        self.writes_cached = writes_cached
        self.autotune = autotune
        self.executor: PlanExecutor | None = None
        self._finished = False

    @property
    def lookahead(self) -> int | None:
        return self.source.lookahead

    def restore(self, reader: CheckpointReader) -> None:
        restore_rows(self.store, reader)

    def snapshot(self, everything: bool) -> Snapshot:
        """The cut's copy: the store's rows written since the previous cut (write-backs
        drained first), then every cached row over them (the cache holds the newest values)."""
        if self.executor is not None:
            self.executor.drain()
        snap = take_snapshot(self.store, everything)
        slots, rows = self.cache.occupied()
        if len(slots) and not self._finished:  # (after finish the store holds them too)
            # through the copy path every write-back takes (the cache may be on a device)
            w, st = self.transfers.download(*self.cache.read(slots)).result()
            snap = snap.overlay(rows, w, st)
        return snap

    def touched(self) -> IdRows:
        """Every row the store holds a written value of (after :meth:`finish`: every row
        trained), for the digest; the rows never written are not read."""
        return touched_rows(self.store.written_rows(), self.store.peek)

    def steps(
        self, stream: BatchStream, start: int, stop: int, before_evict: Callable[[Plan], None] | None = None
    ) -> Iterator[StepInput]:
        if start:  # resumed: every write-back before the start is in the store (it was restored)
            self.store.mark_written(start - 1)
        if self.hot is not None:  # after a resume has written the checkpoint's rows to the store
            slots = self.cold_rows + np.arange(len(self.hot), dtype=np.int64)
            for a in range(0, len(slots), HOT_LOAD_ROWS):
                rows = self.hot.rows[a : a + HOT_LOAD_ROWS]
                self.transfers.install(
                    self.cache, slots[a : a + HOT_LOAD_ROWS], rows, self.transfers.stage(*self.store.read(rows))
                )
        self.executor = executor = self.executor_class(
            self.store,
            self.cache,
            self.source.plans(stream, start, stop),
            depth=self.depth if self.depth is not None else (self.lookahead or 1) + 1,
            start_step=start,
            before_evict=before_evict,
            transfers=self.transfers,
        )
        for plan in executor:
            yield StepInput(
                plan.step,
                plan.batch,
                self.cache.weights,
                self.cache.state,
                self.cache.index(plan.slots),
                self.device.put(torch.from_numpy(plan.inverse)),
                plan,
                executor.install,
            )

    def after_step(self, inp: StepInput) -> None:
        assert self.executor is not None and inp.plan is not None
        self.executor.after_step(inp.plan)

    def flush(self, label: int, durable: bool = True) -> None:
        """After plan ``label`` (0-based) is done: the store holds every row's latest
        value (``durable``: on disk), and reads without a label of their own (evaluation,
        export, a checkpoint's cut on the servers) see it."""
        if self.executor is not None and not self._finished:
            self.executor.drain()
            if self.writes_cached:
                self.executor.write_cached()
        self.store.settle(label)
        if durable:
            self.store.flush()

    def finish(self) -> None:
        """After the last step: every row in the store, the pipeline stopped."""
        self._finished = True
        if self.executor is not None:
            self.executor.drain()
            if self.writes_cached:
                self.executor.write_cached()
            self.executor.close()
        self.store.finish_writes()
        self.store.flush()

    def export(self) -> Rows:
        return self.store.chunks()

    def lookup(self, rows: torch.Tensor) -> torch.Tensor:
        return store_lookup(self.store, rows)

    def phase_seconds(self) -> dict:
        return self.executor.times.as_dict() if self.executor is not None else {}

    def stats(self) -> CacheStats:
        plan = dict(self.source.stats())
        hot = plan.pop("hot", {})
        return CacheStats(
            **{k: plan[k] for k in CacheStats.plan_keys() if k in plan},
            cache_rows=self.cold_rows,
            lookahead=self.lookahead,
            hot=hot_section(self.hot, self.store.dim, self.store.state_dim, hot) if self.hot is not None else None,
            store=self.store.stats.as_dict(),
            pipeline_s=self.phase_seconds(),
            autotune=self.autotune,
        )

    def close(self, abandon: bool = False) -> None:
        """Stop the pipeline and close the store; ``abandon`` after a failure (see
        :meth:`PlanExecutor.close` and :meth:`EmbeddingStore.abandon`)."""
        if self.executor is not None:
            self.executor.close(abandon=abandon)
        if abandon:
            self.store.abandon()
        else:
            self.store.close()
