"""The pipelined executor: the lookahead mode's prefetch and write-back in the background.

:class:`PipelinedExecutor` extends the synchronous :class:`~bagpipe.cache.executor.PlanExecutor`
(its reference: both perform the same stages on the same plans, and every mode's digest
equals ``--mode full``'s) by moving the store traffic onto three background threads, so
the trainer's thread only copies rows in and out of the cache. On a GPU the fetch thread
also starts the staged rows' copies to the device (upload stream) and the write-back
thread waits for the rows' copies to the host (download stream) before it writes them
(:mod:`bagpipe.cache.transfer`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bagpipe.cache.executor import Fetched, PlanExecutor
from bagpipe.cache.slots import SlotCache
from bagpipe.cache.transfer import Download
from bagpipe.errors import BagpipeError
from bagpipe.oracle.plan import Plan
from bagpipe.store.base import EmbeddingStore

_DONE = object()
_NO_ROWS = np.zeros((0, 0), np.float32)


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


@dataclass
class _WriteBack:
    rows: np.ndarray
    rows_out: Download | None  # the rows' values on their way to host memory (None: no rows)
    closes: int | None = None  # when set: every write-back labelled <= closes is done after this one


class PipelinedExecutor(PlanExecutor):
    """Plans executed ahead of the step that uses them.

    Threads and stages:

    ``bagpipe-planner``
        runs the planner (which reads the batch stream) into a queue of ``max(2, depth)`` plans.
    ``bagpipe-fetch``
        for each plan, waits until every write-back labelled ``<= plan.fetch_after`` has
        reached the store, then reads the plan's misses and stages them (starts their copy
        to the device); at most ``depth`` plans wait fetched (plus one in its hands).
    ``bagpipe-writeback``
        waits for each group of rows the trainer copied out to reach host memory, writes
        it, in order, and publishes the label of the last completed group (``closes``),
        which releases the fetches waiting on it.
    the caller's thread (the trainer)
        takes the next fetched plan, starts copying its write-backs out of the cache into
        the write-back queue, installs the staged rows (after their copy), runs the step,
        starts copying the expired rows out.

    A failure on any thread reaches the trainer's thread as that exception.
    """

    def __init__(self, store: EmbeddingStore, cache: SlotCache, plans: Iterator[Plan], **kwargs):
        super().__init__(store, cache, plans, **kwargs)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._closed = False
        self._wb_error: BaseException | None = None
        self._plan_q: queue.Queue = queue.Queue(maxsize=max(2, self.depth))
        self._ready_q: queue.Queue = queue.Queue(maxsize=max(1, self.depth))
        # bounded: a writer behind the trainer holds the trainer back instead of letting
        # copied-out rows pile up in memory (the budget counts depth + 1 groups)
        self._wb_q: queue.Queue = queue.Queue(maxsize=max(2, self.depth + 1))
        for target, name in (
            (self._lingering(self._plan_loop), "bagpipe-planner"),
            (self._lingering(self._fetch_loop), "bagpipe-fetch"),
            (self._lingering(self._wb_loop), "bagpipe-writeback"),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    # background threads -------------------------------------------------------------
    def _lingering(self, loop):
        """``loop``, then wait for :meth:`close`: a thread that has done its work stays until
        the run's figures are read, so its CPU time is counted (:mod:`bagpipe.train.threadcpu`)."""

        def run() -> None:
            try:
                loop()
            finally:
                self._stop.wait()

        return run

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
            t0 = time.perf_counter()
            for plan in self.plans:
                self._planned_at[plan.step] = t = time.perf_counter()
                self.times.planner_busy += t - t0  # reading the batch and planning it
                if not self._put(self._plan_q, plan):
                    return
                t0 = time.perf_counter()
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
                staged = self.transfers.stage(*self.store.read(plan.fetch_rows, after=plan.fetch_after))
                self.times.fetch_busy += time.perf_counter() - t0
                if not self._put(self._ready_q, (plan, staged)):
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
                w, s = item.rows_out.result() if item.rows_out is not None else (_NO_ROWS, _NO_ROWS)
                self.store.write(item.rows, w, s)
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
    def _next(self) -> tuple[Plan, Fetched | None] | None:
        while True:
            try:
                item = self._ready_q.get(timeout=0.5)
            except queue.Empty:
                self._check_wb()
                if not any(t.is_alive() for t in self._threads[:2]):
                    raise BagpipeError("the prefetch pipeline stopped without a result") from None
                continue
            if isinstance(item, _Failure):
                raise item.exc
            if item is _DONE:
                return None
            plan, staged = item
            return plan, staged

    def _write_back(self, slots: np.ndarray, rows: np.ndarray, closes: int | None) -> None:
        t0 = time.perf_counter()
        if len(slots) or closes is not None:
            out = self.transfers.download(*self.cache.take(slots)) if len(slots) else None
            self._check_wb()
            self._queue_wb(_WriteBack(rows, out, closes))
        self.times.writeback += time.perf_counter() - t0

    def _queue_wb(self, item) -> None:
        """Put ``item`` on the write-back queue, waiting while it is full; gives up when
        the writer has stopped (its error, if any, is raised)."""
        while True:
            try:
                self._wb_q.put(item, timeout=0.1)
                return
            except queue.Full:
                if item is not _DONE:
                    self._check_wb()
                if not self._threads[2].is_alive():
                    return

    def _check_wb(self) -> None:
        if self._wb_error is not None:
            raise self._wb_error

    def drain(self) -> None:
        """Wait until every queued write-back has reached the store; raises the write-back
        thread's error if it failed (then the rest of the queue will never be written)."""
        if self._closed:
            return
        q = self._wb_q
        with q.all_tasks_done:
            while q.unfinished_tasks:
                self._check_wb()
                q.all_tasks_done.wait(timeout=0.1)
        self._check_wb()

    def close(self, abandon: bool = False) -> None:
        """Stop the background threads, after draining the write-backs.

        ``abandon=True`` when closing because of another error: pending write-backs are
        dropped and the threads are not waited for long -- with a remote store they may
        be blocked on a peer that is gone, and the caller's error is what to report
        (the run has failed; its last checkpoint is what survives)."""
        if self._closed:
            return
        try:
            if not abandon:
                self.drain()
        finally:
            self._closed = True
            self._stop.set()
            self._queue_wb(_DONE)
            with self._cond:
                self._cond.notify_all()
            for t in self._threads:
                t.join(timeout=0.5 if abandon else 10)
