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
  the last H holding the hot rows for the whole run. :func:`cached_backend` builds one
  from a :class:`~bagpipe.cache.setup.CachePlan` for both topologies: what differs
  between them is only the store and the plan source, which the backend is generic in
  (a data-parallel trainer's is a ``CachedBackend[RemoteStore, RemotePlans]``).

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
from typing import Generic, TypeVar

import numpy as np
import torch

from bagpipe.accel.hot import HotSet, hot_section
from bagpipe.budget import Fit
from bagpipe.cache import EXECUTORS
from bagpipe.cache.executor import PlanExecutor
from bagpipe.cache.setup import CachePlan
from bagpipe.cache.slots import SlotCache
from bagpipe.cache.transfer import Transfers
from bagpipe.checkpoint import CheckpointReader, Snapshot, restore_rows, take_snapshot
from bagpipe.checkpoint.parts import RowCut, bits_chunks
from bagpipe.config.modes import ExecutorName
from bagpipe.data.prefetch import Prefetched
from bagpipe.data.stream import BatchStream
from bagpipe.device import Device, HostDevice
from bagpipe.errors import ConfigError
from bagpipe.oracle.plan import Plan
from bagpipe.store.base import EXPORT_CHUNK_ROWS, EmbeddingStore
from bagpipe.store.init import RowInitializer
from bagpipe.train.protocols import IdRows, PlanSource, Rows, StepInput
from bagpipe.train.summary import CacheStats

HOT_LOAD_ROWS = 1 << 16  # hot rows read from the store at a time when training starts (bounds the copy)
TOUCHED_CHUNK = 1 << 18  # rows read at a time for the digest


def touched_rows(rows: np.ndarray, peek, chunk_rows: int = TOUCHED_CHUNK) -> IdRows:
    """(rows, weights, state) chunks of at most ``chunk_rows`` of ascending ``rows``, values
    from ``peek`` (a store's chunks follow its memory budget: the digest's copies are the
    largest thing the end of a run allocates)."""
    for a in range(0, len(rows), chunk_rows):
        ids = rows[a : a + chunk_rows]
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

    hot: HotSet | None = None
    """No hot tier: every row is in the device's memory (any rows can be watched)."""

    def __init__(self, init: RowInitializer, state_dim: int, device: Device | None = None, *, fit: Fit | None = None):
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
        self.fit = fit  # the memory budget's check of the run, for the summary

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

    def take_dirty_bits(self) -> np.ndarray:
        bits = np.packbits(self._dirty, bitorder="little")
        self._dirty[:] = False
        return bits

    def written_bits(self) -> np.ndarray:
        return np.packbits(self._written, bitorder="little")

    def restore(self, reader: CheckpointReader) -> None:
        restore_rows(self, reader)

    def snapshot(self, everything: bool) -> Snapshot:
        return take_snapshot(self, everything)

    def cut(self, everything: bool) -> RowCut:
        return RowCut.take(self, everything)

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

    def watched(self, rows: np.ndarray) -> Callable[[], torch.Tensor]:
        """Any rows: each call gathers (H, D) of the tables."""
        index = torch.from_numpy(np.asarray(rows, dtype=np.int64))

        def read() -> torch.Tensor:
            return self.weights.index_select(0, index)

        return read

    def phase_seconds(self) -> dict:
        return {}

    def stats(self) -> None:
        return None

    def close(self, abandon: bool = False) -> None:
        pass


class _CachedRows:
    """The cache's rows at a cut (ascending), their values read from the cache on demand
    (:class:`~bagpipe.checkpoint.parts.Overlay`)."""

    def __init__(self, backend: CachedBackend, slots: np.ndarray, rows: np.ndarray):
        order = np.argsort(rows)
        self.rows, self._slots, self._backend = rows[order], slots[order], backend

    def values(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b = self._backend
        # through the copy path every write-back takes (the cache may be on a device)
        w, s = b.transfers.download(*b.cache.read(self._slots[at])).result()
        return np.asarray(w), np.asarray(s)


S = TypeVar("S", bound=EmbeddingStore)
P = TypeVar("P", bound=PlanSource)


class CachedBackend(Generic[S, P]):
    """Rows in a store ``S``, a C-slot cache in the trainer, plans from a :class:`PlanSource` ``P``.

    Built by :func:`cached_backend` (its arguments are described there). ``store`` and
    ``source`` keep their own types, so a topology reaches its own store's and source's
    members (a trainer's servers, the oracle's report) without a downcast.
    """

    def __init__(
        self,
        plan: CachePlan,
        store: S,
        source: P,
        executor: type[PlanExecutor],
        *,
        writes_cached: bool,
        device: Device,
    ):
        self.store: S = store
        self.source: P = source
        self.depth = plan.staged
        self.fit = plan.fit
        self.executor_class = executor
        self.cold_rows = plan.cache_rows
        self.hot = plan.hot
        self.device = device
        self.transfers = Transfers(self.device)
        slots = self.cold_rows + (len(self.hot) if self.hot is not None else 0)
        self.cache = SlotCache(slots, store.dim, store.state_dim, self.device.torch)
        self.writes_cached = writes_cached
        self.autotune = plan.autotune
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

    def cut(self, everything: bool) -> RowCut:
        """The cut's rows without their copy (:class:`RowCut`): the store's written since the
        previous cut as a bitmap (write-backs drained first: the store is quiescent until
        training goes on), the cached rows over them (read from the cache chunk by chunk)."""
        if self.executor is not None:
            self.executor.drain()
        overlay = None
        if not self._finished:  # (after finish the store holds the cached rows too)
            slots, rows = self.cache.occupied()
            if len(slots):
                overlay = _CachedRows(self, slots, rows)
        return RowCut.take(self.store, everything, overlay)

    def touched(self) -> IdRows:
        """Every row the store holds a written value of (after :meth:`finish`: every row
        trained), for the digest; the rows never written are not read. The rows come from
        the store's bitmap a chunk at a time (no array of every written row)."""
        store, chunk = self.store, self.store.chunk_rows
        for ids in bits_chunks(store.written_bits(), store.num_rows, chunk):
            w, s = store.peek(ids)
            yield ids, w, s

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

    def watched(self, rows: np.ndarray) -> Callable[[], torch.Tensor]:
        """The hot tier's rows only (slots C..C+H-1 of the cache, there the whole run):
        each call copies (H, D) of the cache. ValueError for any other rows."""
        hot = self.hot
        if hot is None or not np.array_equal(np.asarray(rows, dtype=np.int64), hot.rows):
            raise ValueError("a cached backend watches its hot tier's rows only")
        C, H = self.cold_rows, len(hot)

        def read() -> torch.Tensor:
            return self.cache.weights[C : C + H].clone()

        return read

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
            store=self.store.stats.as_dict() | self.store.layout_summary(),
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


def cached_backend(
    plan: CachePlan,
    store: S,
    source: P,
    device: Device,
    executor: ExecutorName,
    *,
    writes_cached: bool = True,
) -> CachedBackend[S, P]:
    """The cached backend of a run, for every topology: the cache ``plan`` describes (C
    slots, plus H for its hot rows, on ``device``), over the rows of ``store``, the plans
    of ``source`` run by the mode's ``executor`` (:data:`bagpipe.cache.EXECUTORS`).

    ``plan``'s hot rows are read from the store when training starts, so the source's
    plans must then come through a ``HotSplit`` of C slots. ``writes_cached``: whether
    :meth:`CachedBackend.flush` writes the cached rows to the store (in a data-parallel
    job the cached rows are equal on every trainer: one writes them)."""
    if plan.hot is not None and plan.hot.num_rows != store.num_rows:  # (a plan from the oracle role names its R)
        raise ConfigError(f"hot rows of a row space of {plan.hot.num_rows:,} rows, not the store's {store.num_rows:,}")
    return CachedBackend(plan, store, source, EXECUTORS[executor], writes_cached=writes_cached, device=device)
