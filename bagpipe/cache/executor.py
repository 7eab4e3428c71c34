"""Executing plans: moving rows between a store and the trainer's slot cache.

An *executor* iterates over plans whose fetched rows are installed and ready for the
step, and writes rows back as the plans say. This module holds the plain one,
:class:`PlanExecutor` (everything in the caller's thread: the reference of the
pipelined executor in :mod:`bagpipe.cache.pipelined`, which extends it), and
:class:`DeferredReadExecutor` (Hotline's: a step starts while its misses are read).
Which executor a mode uses is its :class:`~bagpipe.config.modes.ModeSpec`'s
``executor`` (:data:`bagpipe.cache.EXECUTORS`).

Every executor performs, for each plan, the stages the planners rely on
(:class:`~bagpipe.oracle.plan.Plan`):

  1. ``before_evict(plan)`` (the row strategy finishes deferred work on those slots);
  2. write back ``evict_before`` (the previous step's expired rows, then this step's
     forced-out rows: one group labelled ``step - 1``), free ``drop_before``;
  3. read ``fetch_rows`` from the store and install them into ``fetch_slots``;
  4. yield the plan (the step runs on the cache);
  5. :meth:`PlanExecutor.after_step`: write back ``evict_after``, free ``drop_after``.

What differs is when and on which thread stages 2 and 3 touch the store. Rows travel
between the store and the cache through one :class:`~bagpipe.cache.transfer.Transfers`
(staged host-to-device copies on an upload stream, write-backs device-to-host on a
download stream, ordered by events), whatever the executor and the device.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np

from bagpipe.cache.slots import SlotCache
from bagpipe.cache.transfer import Staged, Transfers
from bagpipe.errors import BagpipeError
from bagpipe.oracle.plan import Plan
from bagpipe.store.base import EmbeddingStore

Fetched = Staged
"""A plan's fetched rows on their way to the device: (M, D) weights and (M, S) optimizer
state, in ``fetch_rows`` order."""


@dataclass
class PipelineTimes:
    """Seconds the trainer's thread spent on embedding traffic."""

    wait_embeddings: float = 0.0
    """Waiting for a plan and its fetched rows, and installing them into the cache."""
    wait_plan: float = 0.0
    """The part of ``wait_embeddings`` during which the step's plan did not exist yet: the
    trainer waited for the planner, not for rows (every step but the first; synchronously
    the planner runs in the trainer's thread, so all its time counts)."""
    plan_waits: int = 0
    """Steps (the first left out) whose trainer waited for their plan: 0 when the planner kept up."""
    first_plan_wait: float = 0.0
    """The first step's wait for its plan (the pipeline filling: L + 1 batches read first)."""
    writeback: float = 0.0
    """Copying expired rows out of the cache (and, synchronously, writing them)."""
    fetch_busy: float = 0.0
    """The background fetch thread's store reads (pipelined; for reference)."""
    writeback_busy: float = 0.0
    """The background write-back thread's store writes (pipelined; for reference)."""
    planner_busy: float = 0.0
    """The background planner thread's reading and planning of batches (pipelined; for reference)."""

    def as_dict(self) -> dict:
        return asdict(self)


class PlanExecutor:
    """The synchronous executor: every stage in the caller's (the trainer's) thread.

    Threads: none. When asked for the next plan it takes it from the planner (the
    planner runs in this thread too), writes back, marks the previous step's label as
    written, reads the misses from the store (with the plan's ``fetch_after``) and
    installs them, then yields. ``nocache`` and ``lru`` run on it: their plans depend
    on the previous step (``fetch_after = step - 1``), so nothing could run ahead. The
    mark and the label are what let several trainers run them against shared embedding
    servers (a server holds a read until every trainer has marked its label).

    Args:
        store: where the rows live.
        cache: the trainer's slots.
        plans: the planner's plans, in step order.
        depth: how many plans may be fetched ahead (pipelined executors only).
        start_step: the first plan's step (a resumed run starts past 0): every
            write-back before it is in the store.
        before_evict: called with each plan before its slots are freed or refilled.
        transfers: the copy path between the store and the cache's device (default: the
            cache in host memory, nothing staged).

    Call :meth:`after_step` after each step's update, :meth:`drain` and
    :meth:`write_cached` to make the store hold every row, :meth:`close` at the end.
    """

    def __init__(
        self,
        store: EmbeddingStore,
        cache: SlotCache,
        plans: Iterator[Plan],
        *,
        depth: int = 2,
        start_step: int = 0,
        before_evict: Callable[[Plan], None] | None = None,
        transfers: Transfers | None = None,
    ):
        self.store = store
        self.cache = cache
        self.plans = plans
        self.depth = depth
        self.before_evict = before_evict
        self.transfers = Transfers() if transfers is None else transfers
        self.times = PipelineTimes()
        self._threads: list[threading.Thread] = []  # background threads (none here)
        # label of the last step whose write-backs reached the store; before the first
        # planned step the store holds everything
        self._written = start_step - 1
        self._planned_at: dict[int, float] = {}  # step -> when a planner thread handed its plan over
        self._first = True

    # -------------------------------------------------------------- the stages
    def __iter__(self) -> Iterator[Plan]:
        while True:
            t0 = time.perf_counter()
            item = self._next()
            if item is None:
                return
            plan, fetched = item
            t1 = time.perf_counter()
            self.times.wait_embeddings += t1 - t0
            self._count_plan_wait(t0, min(self._planned_at.pop(plan.step, t1), t1))
            if self.before_evict is not None:
                self.before_evict(plan)
            self._write_back(plan.evict_before_slots, plan.evict_before_rows, closes=plan.step - 1)
            self.cache.drop(plan.drop_before_slots)
            self._fetch(plan, fetched)
            yield plan
            self._stepped(plan)

    def _next(self) -> tuple[Plan, Fetched | None] | None:
        """The next plan and its rows if they were read already (None: the plans ended)."""
        plan = next(self.plans, None)
        return None if plan is None else (plan, None)

    def _count_plan_wait(self, t0: float, planned: float) -> None:
        """The trainer began waiting for the next step at ``t0``; its plan existed from ``planned``."""
        waited = max(0.0, planned - t0)
        if self._first:
            self._first = False
            self.times.first_plan_wait = waited
        elif waited > 0:
            self.times.wait_plan += waited
            self.times.plan_waits += 1

    def _fetch(self, plan: Plan, fetched: Fetched | None) -> None:
        """Make the plan's misses present in the cache before it is yielded."""
        t0 = time.perf_counter()
        # with the plan's label: embedding servers hold the read until every trainer wrote back up to it
        staged = (
            fetched
            if fetched is not None
            else self.transfers.stage(*self.store.read(plan.fetch_rows, after=plan.fetch_after))
        )
        self.transfers.install(self.cache, plan.fetch_slots, plan.fetch_rows, staged)
        self.times.wait_embeddings += time.perf_counter() - t0

    def _stepped(self, plan: Plan) -> None:
        """Called when the caller asks for the plan after ``plan`` (its step ran)."""

    def _write_back(self, slots: np.ndarray, rows: np.ndarray, closes: int | None) -> None:
        """Copy ``slots`` out of the cache and write their ``rows`` back; ``closes``: every
        write-back labelled <= closes is issued once this one is."""
        t0 = time.perf_counter()
        if len(slots):
            w, s = self.transfers.download(*self.cache.take(slots)).result()
            self.store.write(rows, w, s)
        if closes is not None and closes >= 0:  # other trainers' reads of a remote store wait for this label
            self.store.mark_written(closes)
        self.times.writeback += time.perf_counter() - t0

    # ------------------------------------------------------------ the caller's side
    def install(self) -> None:
        """The current plan's fetched rows are in the cache (a no-op here: they are)."""

    def after_step(self, plan: Plan) -> None:
        """The step's optimizer update is done: its expired rows may leave."""
        self._write_back(plan.evict_after_slots, plan.evict_after_rows, closes=None)
        self.cache.drop(plan.drop_after_slots)

    def drain(self) -> None:
        """Wait until every write-back issued so far has reached the store (they have here)."""

    def write_cached(self, chunk_rows: int = 1 << 16) -> None:
        """Write every cached row to the store (rows stay cached); call :meth:`drain` first.

        In chunks: a hot tier holds millions of rows, and one copy of them all (plus the
        store's own) would show as a spike in the run's peak memory at every checkpoint."""
        slots, rows = self.cache.occupied()
        for a in range(0, len(slots), chunk_rows):
            w, s = self.transfers.download(*self.cache.read(slots[a : a + chunk_rows])).result()
            self.store.write(rows[a : a + chunk_rows], w, s)

    def close(self, abandon: bool = False) -> None:
        """Stop (nothing runs in the background here). ``abandon=True`` when closing because
        of another error: the run has failed and its last checkpoint is what survives."""


class DeferredReadExecutor(PlanExecutor):
    """Hotline's executor: a step starts before its misses are in the cache.

    Threads: one reader (``bagpipe-read``). Each plan is yielded as soon as its
    write-backs are done, while the reader reads its misses from the store; the step
    computes what needs none of them (Hotline's all-hot inputs), then calls
    :meth:`install`, which waits for the read and puts the rows in. A step that never
    calls it is an error, raised when the next plan is asked for.
    """

    def __init__(self, store: EmbeddingStore, cache: SlotCache, plans: Iterator[Plan], **kwargs):
        super().__init__(store, cache, plans, **kwargs)
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="bagpipe-read")
        self._pending: tuple[Plan, Future] | None = None

    def _fetch(self, plan: Plan, fetched: Fetched | None) -> None:
        self._pending = (plan, self._reader.submit(self._read, plan.fetch_rows))

    def _read(self, rows: np.ndarray) -> Staged:
        return self.transfers.stage(*self.store.read(rows))

    def _stepped(self, plan: Plan) -> None:
        if self._pending is not None:
            raise BagpipeError(f"step {plan.step} ran without installing its fetched rows (PlanExecutor.install)")

    def install(self) -> None:
        """The current plan's fetched rows are in the cache: waits for the read."""
        if self._pending is None:
            return
        t0 = time.perf_counter()
        plan, read = self._pending
        self._pending = None
        self.transfers.install(self.cache, plan.fetch_slots, plan.fetch_rows, read.result())
        self.times.wait_embeddings += time.perf_counter() - t0

    def close(self, abandon: bool = False) -> None:
        self._reader.shutdown(wait=not abandon, cancel_futures=True)
