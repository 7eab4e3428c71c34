"""The Plan: one batch rewritten into cache-slot ids, with its fetches and write-backs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from bagpipe.data.batch import Batch

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class Plan:
    """Everything a trainer needs to run step ``step`` on a cache of C slots.

    Execution order the planners rely on:
      1. write back ``evict_before`` (rows leaving their slots to make room), after
         the previous step's ``evict_after``;
      2. install ``fetch_rows`` into ``fetch_slots`` (values read from the store);
      3. run the step on ``slots`` (the batch's unique rows, ascending by row);
      4. write back ``evict_after`` (rows whose last use in the window was this step).
    The fetch of this plan may be *issued* (read from the store) only once every
    write-back of steps <= ``fetch_after`` has reached the store: that is what makes
    a stale read impossible.

    Attributes (all int64 numpy arrays):
        rows: (U,) the batch's unique global rows, ascending.
        slots: (U,) the slot of each of ``rows``.
        inverse: (N,) index into ``rows``/``slots`` of every lookup of the batch.
        fetch_rows / fetch_slots: (M,) misses to read from the store before the step.
        evict_before_rows / _slots: rows forced out before this step (capacity).
        evict_after_rows / _slots: rows written back and freed after this step.
        next_use: (U,) the step of each row's next use within the window, -1 for none
            (lookahead oracle only; empty from planners that do not look ahead).
        drop_before_slots / drop_after_slots: slots freed at the same moments *without*
            a write-back, because another trainer writes that row back (data-parallel
            plans only; see :mod:`bagpipe.distributed.partition`).
    """

    step: int
    batch: Batch
    rows: np.ndarray
    slots: np.ndarray
    inverse: np.ndarray
    fetch_rows: np.ndarray = field(default_factory=lambda: _EMPTY)
    fetch_slots: np.ndarray = field(default_factory=lambda: _EMPTY)
    evict_before_rows: np.ndarray = field(default_factory=lambda: _EMPTY)
    evict_before_slots: np.ndarray = field(default_factory=lambda: _EMPTY)
    evict_after_rows: np.ndarray = field(default_factory=lambda: _EMPTY)
    evict_after_slots: np.ndarray = field(default_factory=lambda: _EMPTY)
    fetch_after: int = -1
    drop_before_slots: np.ndarray = field(default_factory=lambda: _EMPTY)
    drop_after_slots: np.ndarray = field(default_factory=lambda: _EMPTY)
    next_use: np.ndarray = field(default_factory=lambda: _EMPTY)

    @property
    def hits(self) -> int:
        return len(self.rows) - len(self.fetch_rows)

    @property
    def misses(self) -> int:
        return len(self.fetch_rows)


def same_plan(a: Plan, b: Plan) -> bool:
    """Whether two plans are equal: the same type, every array field equal with the same
    dtype, every other field but the batch equal (the batch is what was planned, not the plan)."""
    if type(a) is not type(b):
        return False
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "batch":
            continue
        if isinstance(x, np.ndarray):
            if not (isinstance(y, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y)):
                return False
        elif x != y:
            return False
    return True


@dataclass
class PlanStats:
    """Counters over every plan a planner made."""

    steps: int = 0
    lookups: int = 0
    unique_rows: int = 0
    hits: int = 0
    misses: int = 0
    rows_fetched: int = 0
    rows_written_back: int = 0
    forced_evictions: int = 0
    retained_evictions: int = 0  # rows kept past their window, written back when their slot was needed
    max_occupied: int = 0
    seconds: float = 0.0  # the planner's own time (reading the batches excluded)
    state_mb: float = 0.0  # the lookahead oracle's state at its largest (row map, ring, free slots), MiB

    def add(self, plan: Plan, occupied: int) -> None:
        self.steps += 1
        self.lookups += len(plan.inverse)
        self.unique_rows += len(plan.rows)
        self.hits += plan.hits
        self.misses += plan.misses
        self.rows_fetched += len(plan.fetch_rows)
        self.rows_written_back += len(plan.evict_before_rows) + len(plan.evict_after_rows)
        self.max_occupied = max(self.max_occupied, occupied)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["hit_rate"] = self.hits / self.unique_rows if self.unique_rows else 0.0
        d["planning_ms_per_step"] = 1000 * self.seconds / self.steps if self.steps else 0.0
        return d
