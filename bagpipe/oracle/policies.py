"""Baseline planners, expressed as Plans so the same executor runs them.

* :class:`NoCachePlanner`: every step fetches all its unique rows and writes them
  all back after the step (a parameter-server round trip per batch).
* :class:`LRUPlanner`: a backward-looking cache of C slots with least-recently-used
  eviction at step granularity (as FBGEMM/TorchRec's LRU caches, whose timestamp is
  the iteration), misses fetched synchronously.

Both are meant for *synchronous* execution: their ``fetch_after`` is the previous
step, so a pipelined executor could not run ahead of them anyway.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import numpy as np

from bagpipe.data.batch import Batch
from bagpipe.errors import CapacityError, ConfigError
from bagpipe.oracle.lookahead import too_small
from bagpipe.oracle.plan import Plan, PlanStats
from bagpipe.oracle.unique import unique_inverse


def unique_rows(batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    uniq, inverse = unique_inverse(batch.rows.numpy())
    return uniq, inverse.astype(np.int64, copy=False)


class NoCachePlanner:
    """Slots 0..U-1 hold the step's rows; everything is fetched and written back."""

    def __init__(self, cache_rows: int):
        self.C = int(cache_rows)
        self.stats = PlanStats()

    def plans(self, batches: Iterable[tuple[int, Batch]]) -> Iterator[Plan]:
        for step, batch in batches:
            t0 = time.perf_counter()
            rows, inverse = unique_rows(batch)
            n = len(rows)
            if n > self.C:
                raise CapacityError(f"step {step} has {n} unique rows but the staging area holds {self.C}")
            slots = np.arange(n, dtype=np.int64)
            plan = Plan(
                step=step,
                batch=batch,
                rows=rows,
                slots=slots,
                inverse=inverse,
                fetch_rows=rows,
                fetch_slots=slots,
                evict_after_rows=rows,
                evict_after_slots=slots,
                fetch_after=step - 1,
            )
            self.stats.add(plan, n)
            self.stats.seconds += time.perf_counter() - t0
            yield plan


class LRUPlanner:
    """Least-recently-used cache of C slots (one int32 per table row for the row -> slot map)."""

    def __init__(self, num_rows: int, cache_rows: int, enough: int | None = None):
        if cache_rows < 1:
            raise ConfigError(f"cache_rows must be >= 1, got {cache_rows}")
        self.C = int(cache_rows)
        self.row_slot = np.full(int(num_rows), -1, dtype=np.int32)
        self.slot_row = np.full(self.C, -1, dtype=np.int64)
        self.slot_used = np.full(self.C, -1, dtype=np.int64)  # last step that used the slot
        self.n_used = 0  # slots [0, n_used) have been handed out at least once
        self.enough = enough  # a cache size that holds every batch of the run (for the error's hint)
        self.stats = PlanStats()

    def plans(self, batches: Iterable[tuple[int, Batch]]) -> Iterator[Plan]:
        for step, batch in batches:
            t0 = time.perf_counter()
            plan = self._plan(step, batch)
            self.stats.seconds += time.perf_counter() - t0
            yield plan

    def _plan(self, step: int, batch: Batch) -> Plan:
        rows, inverse = unique_rows(batch)
        n = len(rows)
        slots = self.row_slot[rows].astype(np.int64)
        hit = slots >= 0
        self.slot_used[slots[hit]] = step
        miss = ~hit
        m = int(miss.sum())
        fresh = min(m, self.C - self.n_used)
        new = np.arange(self.n_used, self.n_used + fresh, dtype=np.int64)
        self.n_used += fresh
        self.slot_used[new] = step  # not candidates for eviction below
        ev_rows = ev_slots = np.zeros(0, np.int64)
        k = m - fresh
        if k > 0:
            cand = np.flatnonzero(self.slot_used < step)
            if len(cand) < k:
                raise CapacityError(too_small(self.C, step, n, self.enough))
            order = np.lexsort((cand, self.slot_used[cand]))[:k]  # oldest first, then slot
            ev_slots = cand[order]
            ev_rows = self.slot_row[ev_slots].copy()
            self.row_slot[ev_rows] = -1
            new = np.concatenate([new, ev_slots])
        slots[miss] = new
        self.row_slot[rows[miss]] = new.astype(np.int32)
        self.slot_row[new] = rows[miss]
        self.slot_used[new] = step
        plan = Plan(
            step=step,
            batch=batch,
            rows=rows,
            slots=slots,
            inverse=inverse,
            fetch_rows=rows[miss],
            fetch_slots=slots[miss],
            evict_before_rows=ev_rows,
            evict_before_slots=ev_slots,
            fetch_after=step - 1,
        )
        self.stats.add(plan, self.n_used)
        self.stats.forced_evictions += k
        return plan
