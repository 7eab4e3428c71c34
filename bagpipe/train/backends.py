"""Embedding backends: where a step's unique rows come from and where their updates go.

* :class:`FullBackend` (``--mode full``, the reference): every table in one (R, D)
  tensor in process memory.
* :class:`CachedBackend` (``nocache``, ``lru``, ``lookahead``): the rows live in an
  :class:`EmbeddingStore`; a planner decides which slot of a small (C, D) cache each
  row occupies, and a :class:`PlanExecutor` moves rows between store and cache.

Both hand the training step the same thing: a table tensor plus the indices (global
rows or slots) of the batch's unique rows in ascending global-row order, and the
inverse map of every lookup. That is why their results agree bit for bit.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from bagpipe.cache.pipeline import PlanExecutor
from bagpipe.cache.slots import SlotCache
from bagpipe.data.batch import Batch
from bagpipe.data.stream import BatchStream
from bagpipe.oracle.lookahead import LookaheadOracle
from bagpipe.oracle.plan import Plan
from bagpipe.oracle.policies import LRUPlanner, NoCachePlanner
from bagpipe.store.base import EXPORT_CHUNK_ROWS, EmbeddingStore
from bagpipe.store.init import RowInitializer



@dataclass
class StepInput:
    """What one training step needs from the embedding side.

    weights/state: (R or C, D) / (R or C, S) the tensors the rows live in.
    index: (U,) int64 positions in ``weights`` of the batch's unique rows (ascending row).
    inverse: (N,) int64 position in ``index`` of every lookup.
    """

    step: int
    batch: Batch
    weights: torch.Tensor
    state: torch.Tensor
    index: torch.Tensor
    inverse: torch.Tensor
    plan: Plan | None = None


class Prefetched:
    """Runs a generator in a background thread, ``depth`` items ahead."""

    def __init__(self, gen: Iterator, depth: int = 4):
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(gen,), daemon=True, name="bagpipe-loader")
        self._t.start()

    def _run(self, gen) -> None:
        try:
            for item in gen:
                while not self._stop.is_set():
                    try:
                        self._q.put(("item", item), timeout=0.1)
                        break
                    except queue.Full:
                        pass
                if self._stop.is_set():
                    return
            self._q.put(("done", None))
        except BaseException as e:  # noqa: BLE001
            self._q.put(("error", e))

    def __iter__(self):
        while True:
            kind, item = self._q.get()
            if kind == "done":
                return
            if kind == "error":
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()


def store_lookup(store: EmbeddingStore, rows: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """(U, D) current weights of ``rows`` from a store, for evaluation (not counted as training reads)."""
    w, _ = store.peek(rows.cpu().numpy())
    return torch.from_numpy(np.ascontiguousarray(w)).to(device)


def numbered(stream: BatchStream, start: int, stop: int) -> Iterator[tuple[int, Batch]]:
    for step in range(start, stop):
        yield step, stream.batch(step)


class FullBackend:
    """All tables in memory: the reference."""

    mode = "full"

    def __init__(self, init: RowInitializer, state_dim: int, device: torch.device | str = "cpu"):
        self.init = init
        self.device = torch.device(device)
        self.weights = torch.empty(init.num_rows, init.dim)
        for a in range(0, init.num_rows, EXPORT_CHUNK_ROWS):
            b = min(a + EXPORT_CHUNK_ROWS, init.num_rows)
            self.weights[a:b] = torch.from_numpy(init.range(a, b))
        self.weights = self.weights.to(self.device)
        self.state = torch.zeros(init.num_rows, state_dim, device=self.device)
        self.times: dict = {}

    def load_rows(self, start: int, weights: np.ndarray, state: np.ndarray) -> None:
        n = len(weights)
        self.weights[start : start + n] = torch.from_numpy(np.asarray(weights))
        self.state[start : start + n] = torch.from_numpy(np.asarray(state))

    def steps(self, stream: BatchStream, start: int, stop: int) -> Iterator[StepInput]:
        def prepare():
            for step, batch in numbered(stream, start, stop):
                uniq, inverse = torch.unique(batch.rows, sorted=True, return_inverse=True)
                yield step, batch, uniq, inverse

        loader = Prefetched(prepare())
        try:
            for step, batch, uniq, inverse in loader:
                yield StepInput(step, batch.to(self.device), self.weights, self.state, uniq.to(self.device), inverse.to(self.device))
        finally:
            loader.close()

    def after_step(self, inp: StepInput) -> None:
        pass

    def flush(self) -> None:
        pass

    def export(self) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        for a in range(0, self.init.num_rows, EXPORT_CHUNK_ROWS):
            b = min(a + EXPORT_CHUNK_ROWS, self.init.num_rows)
            yield a, self.weights[a:b].cpu().numpy(), self.state[a:b].cpu().numpy()

    def lookup(self, rows: torch.Tensor) -> torch.Tensor:
        return self.weights.index_select(0, rows.to(self.device))

    def stats(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class CachedBackend:
    """Rows in a store, a C-slot cache in the trainer, plans from a planner."""

    def __init__(
        self,
        mode: str,
        store: EmbeddingStore,
        cache_rows: int,
        *,
        lookahead: int = 8,
        device: torch.device | str = "cpu",
    ):
        self.mode = mode
        self.store = store
        self.cache = SlotCache(cache_rows, store.dim, store.state_dim, device)
        self.lookahead = lookahead
        self.device = torch.device(device)
        self.planner = None
        self.executor: PlanExecutor | None = None
        self._times: dict = {}

    def _make_planner(self):
        n, C = self.store.num_rows, self.cache.capacity
        if self.mode == "nocache":
            return NoCachePlanner(C)
        if self.mode == "lru":
            return LRUPlanner(n, C)
        if self.mode == "lookahead":
            return LookaheadOracle(n, C, self.lookahead)
        raise ValueError(self.mode)

    def load_rows(self, start: int, weights: np.ndarray, state: np.ndarray) -> None:
        rows = np.arange(start, start + len(weights), dtype=np.int64)
        self.store.write(rows, weights, state)

    def steps(self, stream: BatchStream, start: int, stop: int) -> Iterator[StepInput]:
        self.planner = self._make_planner()
        pipelined = self.mode == "lookahead"
        self.executor = PlanExecutor(
            self.store, self.cache, self.planner.plans(numbered(stream, start, stop)),
            pipelined=pipelined, depth=self.lookahead + 1, start_step=start,
        )
        try:
            for plan in self.executor:
                yield StepInput(
                    plan.step,
                    plan.batch.to(self.device),
                    self.cache.weights,
                    self.cache.state,
                    torch.from_numpy(plan.slots).to(self.device),
                    torch.from_numpy(plan.inverse).to(self.device),
                    plan,
                )
        finally:
            self._times = self.executor.times.as_dict()
            self.executor.close()

    def after_step(self, inp: StepInput) -> None:
        self.executor.after_step(inp.plan)

    def flush(self) -> None:
        """Write every cached row back; the store then holds the whole model."""
        if self.executor is not None:
            self.executor.flush_cached()
        else:
            self.store.flush()

    def export(self) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        return self.store.chunks()

    def lookup(self, rows: torch.Tensor) -> torch.Tensor:
        return store_lookup(self.store, rows, self.device)

    def stats(self) -> dict:
        out = dict(self.planner.stats.as_dict()) if self.planner else {}
        out["cache_rows"] = self.cache.capacity
        out["store"] = self.store.stats.as_dict()
        out["pipeline_s"] = dict(self.executor.times.as_dict()) if self.executor else {}
        return out

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
        self.store.close()
