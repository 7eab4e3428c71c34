"""Executes Plans against a store and a SlotCache, synchronously or pipelined.

Pipelined (the lookahead mode) runs three background threads:

    planner thread   runs the planner (which reads the batch stream) into a queue
    fetch thread     for each plan, waits until the write-backs it depends on
                     (``plan.fetch_after``) have reached the store, then reads the
                     plan's misses into staging arrays, up to ``depth`` plans ahead
    write-back thread writes evicted rows to the store in order and publishes the
                     label of the last completed step

while the trainer (the caller's thread) only copies rows in and out of the cache.
Synchronous execution (nocache, lru) does the same work in the caller's thread; with
``defer_install`` (Hotline) it reads a plan's misses on one reader thread while the
caller computes what needs none of them, and :meth:`PlanExecutor.install` puts them in.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from bagpipe.cache.slots import SlotCache
from bagpipe.errors import BagpipeError
from bagpipe.oracle.plan import Plan
from bagpipe.store.base import EmbeddingStore

_DONE = object()


@dataclass
class PipelineTimes:
    """Seconds the trainer's thread spent on embedding traffic."""

    wait_embeddings: float = 0.0
    writeback: float = 0.0
    fetch_busy: float = 0.0  # background fetch thread, for reference
    writeback_busy: float = 0.0  # background write-back thread

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


@dataclass
class _WriteBack:
    rows: np.ndarray
    weights: np.ndarray
    state: np.ndarray
    closes: int | None = None  # when set: every write-back labelled <= closes is done after this one


class PlanExecutor:
    """Iterate over plans whose fetched rows are installed and ready for the step.

    Call :meth:`after_step` after each step's optimizer update, and :meth:`close`
    at the end (writes back everything still pending).

    ``defer_install`` (synchronous execution only): each plan is yielded while its misses
    are still being read; the step calls :meth:`install` before it touches them.
    """

    def __init__(
        self,
        store: EmbeddingStore,
        cache: SlotCache,
        plans: Iterator[Plan],
        *,
        pipelined: bool,
        depth: int = 2,
        start_step: int = 0,
        before_evict: Callable[[Plan], None] | None = None,
        defer_install: bool = False,
    ):
        self.store = store
        self.cache = cache
        self.plans = plans
        self.pipelined = pipelined
        self.before_evict = before_evict  # called with each plan before its slots are freed or refilled
        self.times = PipelineTimes()
        # label of the last step whose write-backs reached the store; before the first
        # planned step the store holds everything
        self._written = start_step - 1
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="bagpipe-read") if defer_install and not pipelined else None
        self._pending: tuple[Plan, Future] | None = None
        if pipelined:
            self._plan_q: queue.Queue = queue.Queue(maxsize=max(2, depth))
            self._ready_q: queue.Queue = queue.Queue(maxsize=max(1, depth))
            self._wb_q: queue.Queue = queue.Queue()
            for target, name in ((self._plan_loop, "bagpipe-planner"), (self._fetch_loop, "bagpipe-fetch"), (self._wb_loop, "bagpipe-writeback")):
                t = threading.Thread(target=target, name=name, daemon=True)
                t.start()
                self._threads.append(t)

    # background threads -------------------------------------------------------------
    def _put(self, q: queue.Queue, item) -> bool:
        while not self._stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _plan_loop(self) -> None:
        try:
            for plan in self.plans:
                if not self._put(self._plan_q, plan):
                    return
            self._put(self._plan_q, _DONE)
        except BaseException as e:  # noqa: BLE001 - handed to the trainer thread
            self._put(self._plan_q, _Failure(e))

    def _fetch_loop(self) -> None:
        try:
            while not self._stop.is_set():
                try:  # with a timeout: a planner stopped by close() hands over nothing more
                    plan = self._plan_q.get(timeout=0.1)
                except queue.Empty:
                    continue
                if plan is _DONE or isinstance(plan, _Failure):
                    self._put(self._ready_q, plan)
                    return
                with self._cond:
                    while self._written < plan.fetch_after and not self._stop.is_set():
                        self._cond.wait(timeout=0.1)
                t0 = time.perf_counter()
                w, s = self.store.read(plan.fetch_rows, after=plan.fetch_after)
                self.times.fetch_busy += time.perf_counter() - t0
                if not self._put(self._ready_q, (plan, w, s)):
                    return
        except BaseException as e:  # noqa: BLE001
            self._put(self._ready_q, _Failure(e))

    def _wb_loop(self) -> None:
        while True:
            item = self._wb_q.get()
            if item is _DONE:
                self._wb_q.task_done()
                return
            if self._stop.is_set():  # closed with abandon=True (a plain close drains first): drop it
                self._wb_q.task_done()
                continue
            try:
                t0 = time.perf_counter()
                self.store.write(item.rows, item.weights, item.state)
                if item.closes is not None:
                    self.store.mark_written(item.closes)  # a remote store tells its servers
                self.times.writeback_busy += time.perf_counter() - t0
            except BaseException as e:  # noqa: BLE001
                self._wb_error = e
                self._stop.set()
                with self._cond:
                    self._cond.notify_all()
                return
            finally:
                self._wb_q.task_done()
            if item.closes is not None:
                with self._cond:
                    self._written = item.closes
                    self._cond.notify_all()

    # trainer side -------------------------------------------------------------------
    def _write_back(self, slots: np.ndarray, rows: np.ndarray, closes: int | None) -> None:
        t0 = time.perf_counter()
        w, s = self.cache.take(slots) if len(slots) else (None, None)
        if self.pipelined:
            if len(slots) or closes is not None:
                self._check_wb()
                self._wb_q.put(_WriteBack(rows, w, s, closes) if len(slots) else _WriteBack(rows, np.zeros((0, 0), np.float32), np.zeros((0, 0), np.float32), closes))
        else:
            if len(slots):
                self.store.write(rows, w, s)
            if closes is not None and closes >= 0:  # other trainers' reads of a remote store wait for this label
                self.store.mark_written(closes)
        self.times.writeback += time.perf_counter() - t0

    def _check_wb(self) -> None:
        err = getattr(self, "_wb_error", None)
        if err is not None:
            raise err

    def __iter__(self) -> Iterator[Plan]:
        while True:
            t0 = time.perf_counter()
            if self.pipelined:
                item = self._get_ready()
                if item is _DONE:
                    return
                plan, w, s = item
            else:
                plan = next(self.plans, None)
                if plan is None:
                    return
            self.times.wait_embeddings += time.perf_counter() - t0
            if self.before_evict is not None:
                self.before_evict(plan)
            # write-backs labelled step-1: the previous step's expired rows, then this step's forced-out rows
            self._write_back(plan.evict_before_slots, plan.evict_before_rows, closes=plan.step - 1)
            self.cache.drop(plan.drop_before_slots)
            if self._reader is not None:
                self._pending = (plan, self._reader.submit(self.store.read, plan.fetch_rows))
                yield plan
                if self._pending is not None:
                    raise BagpipeError(f"step {plan.step} ran without installing its fetched rows (PlanExecutor.install)")
                continue
            t0 = time.perf_counter()
            if not self.pipelined:
                w, s = self.store.read(plan.fetch_rows, after=plan.fetch_after)
            self.cache.install(plan.fetch_slots, plan.fetch_rows, w, s)
            self.times.wait_embeddings += time.perf_counter() - t0
            yield plan

    def install(self) -> None:
        """The current plan's fetched rows are in the cache: waits for a deferred read (a no-op otherwise)."""
        if self._pending is None:
            return
        t0 = time.perf_counter()
        plan, read = self._pending
        self._pending = None
        w, s = read.result()
        self.cache.install(plan.fetch_slots, plan.fetch_rows, w, s)
        self.times.wait_embeddings += time.perf_counter() - t0

    def _get_ready(self):
        while True:
            try:
                item = self._ready_q.get(timeout=0.5)
            except queue.Empty:
                self._check_wb()
                if not any(t.is_alive() for t in self._threads[:2]):
                    raise BagpipeError("the prefetch pipeline stopped without a result")
                continue
            if isinstance(item, _Failure):
                raise item.exc
            return item

    def after_step(self, plan: Plan) -> None:
        """The step's optimizer update is done: its expired rows may leave."""
        self._write_back(plan.evict_after_slots, plan.evict_after_rows, closes=None)
        self.cache.drop(plan.drop_after_slots)

    def drain(self) -> None:
        """Wait until every queued write-back has reached the store; raises the write-back
        thread's error if it failed (then the rest of the queue will never be written)."""
        if self.pipelined and not self._closed:
            q = self._wb_q
            with q.all_tasks_done:
                while q.unfinished_tasks:
                    self._check_wb()
                    q.all_tasks_done.wait(timeout=0.1)
            self._check_wb()

    def write_cached(self, chunk_rows: int = 1 << 16) -> None:
        """Write every cached row to the store (rows stay cached); call :meth:`drain` first.

        In chunks: a hot tier holds millions of rows, and one copy of them all (plus the
        store's own) would show as a spike in the run's peak memory at every checkpoint."""
        slots, rows = self.cache.occupied()
        for a in range(0, len(slots), chunk_rows):
            part = torch.from_numpy(slots[a : a + chunk_rows])
            w = self.cache.weights.index_select(0, part).numpy()
            s = self.cache.state.index_select(0, part).numpy()
            self.store.write(rows[a : a + chunk_rows], w, s)

    def close(self, abandon: bool = False) -> None:
        """Stop the background threads, after draining the write-backs.

        ``abandon=True`` when closing because of another error: pending write-backs are
        dropped and the threads are not waited for long -- with a remote store they may
        be blocked on a peer that is gone, and the caller's error is what to report
        (the run has failed; its last checkpoint is what survives)."""
        if self._reader is not None:
            self._reader.shutdown(wait=not abandon, cancel_futures=True)
        if self.pipelined and not self._closed:
            try:
                if not abandon:
                    self.drain()
            finally:
                self._closed = True
                self._stop.set()
                self._wb_q.put(_DONE)
                with self._cond:
                    self._cond.notify_all()
                for t in self._threads:
                    t.join(timeout=0.5 if abandon else 10)
