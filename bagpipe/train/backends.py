"""Embedding backends: where a step's unique rows come from and where their updates go.

* :class:`FullBackend` (``--mode full``, the reference): every table in one (R, D)
  tensor in process memory.
* :class:`CachedBackend` (``nocache``, ``lru``, ``lookahead``, ``fae``, ``hotline``, and
  every distributed trainer): the rows live in an :class:`EmbeddingStore` (in this
  process, or on embedding servers behind a ``RemoteStore``); a plan source decides which
  slot of a small (C, D) cache each row occupies, and a :class:`PlanExecutor` moves rows
  between store and cache. With a hot tier (:mod:`bagpipe.accel.hot`) the cache has
  C + H slots, the last H holding the hot rows for the whole run.

Both hand the training step the same thing: a table tensor plus the indices (global
rows or slots) of the batch's unique rows in ascending global-row order, and the
inverse map of every lookup. That is why their results agree bit for bit.
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol

import numpy as np
import torch

from bagpipe.accel.hot import HotSet, HotSplit, hot_section
from bagpipe.cache.pipeline import PlanExecutor
from bagpipe.cache.slots import SlotCache
from bagpipe.data.prefetch import Prefetched
from bagpipe.data.stream import BatchStream
from bagpipe.oracle.lookahead import LookaheadOracle
from bagpipe.oracle.plan import Plan
from bagpipe.oracle.policies import LRUPlanner, NoCachePlanner
from bagpipe.store.base import EXPORT_CHUNK_ROWS, EmbeddingStore
from bagpipe.store.init import RowInitializer
from bagpipe.train.step import StepInput

Rows = Iterator[tuple[int, np.ndarray, np.ndarray]]
HOT_LOAD_ROWS = 1 << 16  # hot rows read from the store at a time when training starts (bounds the copy)


def store_lookup(store: EmbeddingStore, rows: torch.Tensor) -> torch.Tensor:
    """(U, D) current weights of ``rows`` from a store, for evaluation (not counted as training reads)."""
    w, _ = store.peek(rows.cpu().numpy())
    return torch.from_numpy(np.ascontiguousarray(w))


class FullBackend:
    """All tables in memory: the reference.

    It is also a checkpoint's row source (:class:`bagpipe.checkpoint.parts.RowSource`):
    the rows each step updates are remembered for the next incremental checkpoint.
    """

    mode = "full"

    def __init__(self, init: RowInitializer, state_dim: int):
        self.init = init
        self.num_rows, self.dim, self.state_dim = init.num_rows, init.dim, int(state_dim)
        self.weights = torch.empty(init.num_rows, init.dim)
        for a in range(0, init.num_rows, EXPORT_CHUNK_ROWS):
            b = min(a + EXPORT_CHUNK_ROWS, init.num_rows)
            self.weights[a:b] = torch.from_numpy(init.range(a, b))
        self.state = torch.zeros(init.num_rows, state_dim)
        self._dirty = np.zeros(init.num_rows, dtype=bool)  # rows updated since the last checkpoint part

    def load_rows(self, start: int, weights: np.ndarray, state: np.ndarray) -> None:
        n = len(weights)
        self.weights[start : start + n] = torch.from_numpy(np.asarray(weights))
        self.state[start : start + n] = torch.from_numpy(np.asarray(state))

    def row_source(self) -> "FullBackend":
        return self

    def chunks(self) -> Rows:
        return self.export()

    def peek(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = torch.from_numpy(np.asarray(rows, dtype=np.int64))
        return self.weights.index_select(0, idx).numpy(), self.state.index_select(0, idx).numpy()

    def take_dirty(self) -> np.ndarray:
        rows = np.flatnonzero(self._dirty)
        self._dirty[:] = False
        return rows

    def steps(self, stream: BatchStream, start: int, stop: int, before_evict=None) -> Iterator[StepInput]:
        def prepare():
            for step, batch in stream.numbered(start, stop):
                uniq, inverse = torch.unique(batch.rows, sorted=True, return_inverse=True)
                yield step, batch, uniq, inverse

        loader = Prefetched(prepare())
        try:
            for step, batch, uniq, inverse in loader:
                yield StepInput(step, batch, self.weights, self.state, uniq, inverse)
        finally:
            loader.close()

    def after_step(self, inp: StepInput) -> None:
        self._dirty[inp.index.numpy()] = True

    def flush(self, label: int) -> None:
        pass

    def finish(self) -> None:
        pass

    def export(self) -> Rows:
        for a in range(0, self.init.num_rows, EXPORT_CHUNK_ROWS):
            b = min(a + EXPORT_CHUNK_ROWS, self.init.num_rows)
            yield a, self.weights[a:b].numpy(), self.state[a:b].numpy()

    def lookup(self, rows: torch.Tensor) -> torch.Tensor:
        return self.weights.index_select(0, rows)

    def phase_seconds(self) -> dict:
        return {}

    def stats(self) -> dict:
        return {}

    def close(self, abandon: bool = False) -> None:
        pass


class PlanSource(Protocol):
    """Where a :class:`CachedBackend`'s plans come from."""

    lookahead: int | None
    pipelined: bool

    def plans(self, stream: BatchStream, start: int, stop: int) -> Iterator[Plan]: ...

    def stats(self) -> dict: ...


class LocalPlanner:
    """A planner in this process: the lookahead oracle, or the lru / nocache baselines;
    behind a :class:`HotSplit` when a hot tier serves the hot rows."""

    def __init__(self, mode: str, num_rows: int, cache_rows: int, lookahead: int, hot: HotSplit | None = None,
                 enough: int | None = None):
        self.mode = mode
        self.num_rows, self.cache_rows = num_rows, cache_rows
        self.enough = enough  # cache rows that hold every batch of the run (the hint of a too-small cache)
        self.lookahead = lookahead if mode == "lookahead" else None
        # the baselines' plans depend on the previous step: nothing could run ahead anyway
        self.pipelined = mode == "lookahead"
        self.hot = hot
        self.planner = None

    def plans(self, stream: BatchStream, start: int, stop: int) -> Iterator[Plan]:
        if self.mode == "nocache":
            self.planner = NoCachePlanner(self.cache_rows)
        elif self.mode == "lru":
            self.planner = LRUPlanner(self.num_rows, self.cache_rows, self.enough)
        elif self.mode == "lookahead":
            self.planner = LookaheadOracle(self.num_rows, self.cache_rows, self.lookahead, self.enough)
        else:
            raise ValueError(self.mode)
        if self.hot is not None:
            return self.hot.plans(self.planner, stream, start, stop)
        return self.planner.plans(stream.numbered(start, stop))

    def stats(self) -> dict:
        out = self.planner.stats.as_dict() if self.planner else {}
        return out | ({"hot": self.hot.report()} if self.hot is not None else {})


class CachedBackend:
    """Rows in a store, a C-slot cache in the trainer, plans from a :class:`PlanSource`.

    Args:
        store: where the rows live.
        cache_rows: C.
        source: the plans.
        writes_cached: whether :meth:`flush` writes the cached rows to the store (in a
            data-parallel job the cached rows are equal on every trainer: one writes them).
        hot: the hot rows (slots C..C+H-1, read from the store when training starts), if any;
            the source's plans must then come through a :class:`HotSplit` of C slots.
        defer_install: yield each step before its misses are read (Hotline; see
            :class:`PlanExecutor`).
    """

    def __init__(self, store: EmbeddingStore, cache_rows: int, source: PlanSource, *, writes_cached: bool = True,
                 hot: HotSet | None = None, defer_install: bool = False):
        self.store = store
        self.source = source
        self.cold_rows = cache_rows
        self.hot = hot
        self.cache = SlotCache(cache_rows + (len(hot) if hot is not None else 0), store.dim, store.state_dim)
        self.writes_cached = writes_cached
        self.defer_install = defer_install
        self.executor: PlanExecutor | None = None
        self.extra_stats: dict = {}

    @property
    def lookahead(self) -> int | None:
        return self.source.lookahead

    def load_rows(self, start: int, weights: np.ndarray, state: np.ndarray) -> None:
        self.store.load(np.arange(start, start + len(weights), dtype=np.int64), weights, state)

    def row_source(self) -> EmbeddingStore:
        return self.store

    def steps(self, stream: BatchStream, start: int, stop: int, before_evict: Callable[[Plan], None] | None = None) -> Iterator[StepInput]:
        if start:  # resumed: every write-back before the start is in the store (it was restored)
            self.store.mark_written(start - 1)
        if self.hot is not None:  # after a resume has written the checkpoint's rows to the store
            slots = self.cold_rows + np.arange(len(self.hot), dtype=np.int64)
            for a in range(0, len(slots), HOT_LOAD_ROWS):
                rows = self.hot.rows[a : a + HOT_LOAD_ROWS]
                w, s = self.store.read(rows)
                self.cache.install(slots[a : a + HOT_LOAD_ROWS], rows, w, s)
        self.executor = PlanExecutor(
            self.store, self.cache, self.source.plans(stream, start, stop),
            pipelined=self.source.pipelined, depth=(self.lookahead or 1) + 1, start_step=start,
            before_evict=before_evict, defer_install=self.defer_install,
        )
        for plan in self.executor:
            yield StepInput(
                plan.step, plan.batch, self.cache.weights, self.cache.state,
                torch.from_numpy(plan.slots), torch.from_numpy(plan.inverse), plan, self.executor.install,
            )

    def after_step(self, inp: StepInput) -> None:
        self.executor.after_step(inp.plan)

    def flush(self, label: int) -> None:
        """After plan ``label`` (0-based) is done: the store holds every row's latest
        value, durably, and reads without a label of their own (evaluation, export) see it."""
        if self.executor is not None:
            self.executor.drain()
            if self.writes_cached:
                self.executor.write_cached()
        self.store.settle(label)
        self.store.flush()

    def finish(self) -> None:
        """After the last step: every row in the store, the pipeline stopped."""
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

    def stats(self) -> dict:
        out = dict(self.source.stats())
        hot = out.pop("hot", {})
        out["cache_rows"] = self.cold_rows
        out["hot"] = hot_section(self.hot, self.store.dim, self.store.state_dim, hot) if self.hot is not None else None
        out["lookahead"] = self.lookahead
        out["store"] = self.store.stats.as_dict()
        out["pipeline_s"] = self.phase_seconds()
        return out | self.extra_stats

    def close(self, abandon: bool = False) -> None:
        """Stop the pipeline and close the store; ``abandon`` after a failure (see
        :meth:`PlanExecutor.close` and :meth:`EmbeddingStore.abandon`)."""
        if self.executor is not None:
            self.executor.close(abandon=abandon)
        if abandon:
            self.store.abandon()
        else:
            self.store.close()
