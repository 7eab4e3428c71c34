"""The plan executors (``bagpipe/cache/executor.py``, ``bagpipe/cache/pipelined.py``), tested
directly: threads and an in-memory network, no processes.

:class:`PlanExecutor` and :class:`PipelinedExecutor` run over a store that logs every
read, write and ``mark_written`` in the order they reach it (and can hold writes at
a gate, or fail on the n-th call). Pipelined, the executor never issues a plan's fetch before
every write-back labelled <= ``fetch_after`` has reached the store (a fetch waits
while such a write-back is held, then sees its value), and runs ahead
``depth`` + 1 fetches when nothing gates it; a failure in the planner, in a store
read (fetch thread), a store write or a mark (write-back thread) reaches the
trainer's thread as that very exception within seconds; ``close(abandon=True)``
returns within seconds while a write-back hangs on a store that never answers, and
drops the write-backs queued behind it; ``close()`` first drains every queued
write-back; ``close()`` while the planner is still working ends every thread at
once. Synchronous mode does the same reads and writes in the caller's thread, in
plan order, only when asked for the next plan, marking each step's label after its
write-backs and reading with the plan's ``fetch_after`` (what lets several trainers
run lru / nocache plans against shared embedding servers). The time the trainer's
thread waits for a plan (a slow planner) is counted apart from the time it waits for
rows (held write-backs gating a fetch), pipelined and synchronously. Over lookahead-oracle plans with
forced evictions (and no-cache plans synchronously), the store ends bit-identical
to applying every step's update to a plain array, with the store in process or
behind two embedding servers (``tests/concurrency.py``'s :class:`Cluster`).

Every thread a test starts must have ended when it finishes (``every_thread_ends``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import chain, islice
from typing import NamedTuple

import numpy as np
import pytest
import torch
from concurrency import (
    HELD,
    S_DIM,
    SOON,
    Background,
    D,
    small_table,
    wait_until,
)

from bagpipe.cache.executor import PlanExecutor
from bagpipe.cache.pipelined import PipelinedExecutor
from bagpipe.cache.slots import SlotCache
from bagpipe.data.batch import Batch
from bagpipe.oracle.lookahead import LookaheadOracle
from bagpipe.oracle.plan import Plan
from bagpipe.oracle.policies import NoCachePlanner
from bagpipe.store.init import RowInitializer
from bagpipe.store.memory import MemoryStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60), pytest.mark.usefixtures("every_thread_ends")]


# a store that logs what reaches it -------------------------------------------------
class Op(NamedTuple):
    kind: str  # "read" (when issued), "write" (when done), "mark"
    rows: tuple
    label: int | None  # a read's ``after``; a mark's label
    thread: str


class RecordingStore(MemoryStore):
    """A :class:`MemoryStore` that logs every training read, write and mark in order.

    ``gate``: cleared, every write waits at it (``held`` is set meanwhile) -- a slow or
    dead peer. ``fail(kind, n, exc)``: the n-th call of that kind raises ``exc``.
    """

    def __init__(self, init: RowInitializer, state_dim: int):
        super().__init__(init, state_dim)
        self.log: list[Op] = []
        self.gate = threading.Event()
        self.gate.set()
        self.held = threading.Event()
        self._faults: dict[str, tuple[int, BaseException]] = {}
        self._calls: Counter = Counter()
        self._lock = threading.Lock()

    def fail(self, kind: str, nth: int, exc: BaseException) -> None:
        self._faults[kind] = (nth, exc)

    def ops(self, kind: str | None = None) -> list[Op]:
        with self._lock:
            return [op for op in self.log if kind in (None, op.kind)]

    def _enter(self, kind: str, rows=(), label=None) -> None:
        with self._lock:
            self._calls[kind] += 1
            fault = self._faults.get(kind)
            if fault is not None and self._calls[kind] == fault[0]:
                raise fault[1]
            if kind != "write":
                self.log.append(Op(kind, tuple(int(r) for r in rows), label, threading.current_thread().name))

    def _read_after(self, rows, after):
        self._enter("read", rows, after)
        return super()._read_after(rows, after)

    def _write(self, rows, weights, state) -> None:
        self._enter("write")
        if not self.gate.is_set():
            self.held.set()
            self.gate.wait()
        super()._write(rows, weights, state)
        with self._lock:
            self.log.append(Op("write", tuple(int(r) for r in rows), None, threading.current_thread().name))

    def mark_written(self, label: int) -> None:
        self._enter("mark", label=int(label))


def assert_fetches_gated(log: list[Op], start: int = -1) -> None:
    """Every read that needs write-backs labelled <= a comes after a mark >= a (the write-back
    thread marks only after those writes returned)."""
    marked = start
    for i, op in enumerate(log):
        if op.kind == "mark":
            assert op.label is not None  # a mark's label
            marked = max(marked, op.label)
        elif op.kind == "read":
            assert op.label is not None and op.label <= marked, (
                f"op {i}: read of rows {op.rows} needing label {op.label} issued when only {marked} was written: {log[: i + 1]}"
            )


# plans, steps and their expected result --------------------------------------------
def batch_of(rows) -> Batch:
    rows = torch.as_tensor(np.asarray(rows, dtype=np.int64))
    n = len(rows)
    return Batch(labels=torch.zeros(n), dense=torch.zeros(n, 1), rows=rows, offsets=torch.arange(n + 1), num_features=1)


def hand_plan(step: int, holds: dict[int, int], fetch=(), after=(), fetch_after: int = -1) -> Plan:
    """Step ``step`` uses the rows of ``holds`` (row -> slot); ``fetch`` and ``after`` are some of them."""
    rows = np.array(sorted(holds), np.int64)

    def slots(rs):
        return np.array([holds[r] for r in rs], np.int64)

    return Plan(
        step=step,
        batch=batch_of(rows),
        rows=rows,
        slots=slots(rows),
        inverse=np.arange(len(rows)),
        fetch_rows=np.array(fetch, np.int64),
        fetch_slots=slots(fetch),
        evict_after_rows=np.array(after, np.int64),
        evict_after_slots=slots(after),
        fetch_after=fetch_after,
    )


def hand_plans() -> list[Plan]:
    """Four steps on two slots; steps 2 and 3 refetch rows written back after steps 0 and 1."""
    return [
        hand_plan(0, {0: 0, 1: 1}, fetch=[0, 1], after=[0]),
        hand_plan(1, {1: 1, 2: 0}, fetch=[2], after=[1, 2]),
        hand_plan(2, {0: 0}, fetch=[0], after=[0], fetch_after=0),
        hand_plan(3, {1: 1}, fetch=[1], after=[1], fetch_after=1),
    ]


class Reference:
    """What the store must hold: every step's update applied to plain arrays."""

    def __init__(self, init: RowInitializer):
        self.w = init.range(0, init.num_rows)
        self.s = np.zeros((init.num_rows, S_DIM), np.float32)

    def update(self, plan: Plan) -> None:
        self.w[plan.rows] += np.float32(plan.step + 1)
        self.s[plan.rows] += np.float32(1)


def train_step(cache: SlotCache, plan: Plan) -> None:
    """The step's update, on the cache (as the optimizer would)."""
    idx = torch.from_numpy(plan.slots)
    cache.weights[idx] += float(plan.step + 1)
    cache.state[idx] += 1.0


def run_steps(
    ex: PlanExecutor, ref: Reference | None = None, done: list | None = None, steps: int | None = None, plans=None
) -> None:
    """The trainer's loop over ``steps`` plans (all by default) of ``plans`` (default ``iter(ex)``)."""
    for plan in islice(iter(ex) if plans is None else plans, steps):
        train_step(ex.cache, plan)
        if ref is not None:
            ref.update(plan)
        ex.after_step(plan)
        if done is not None:
            done.append(plan.step)


def assert_store_holds(store, ref: Reference, stop: int) -> None:
    """Rows [0, stop) of the store are the reference's, bit for bit."""
    w, s = store.read_range(0, stop)
    np.testing.assert_array_equal(w, ref.w[:stop])
    np.testing.assert_array_equal(s, ref.s[:stop])


@pytest.fixture
def init() -> RowInitializer:
    return small_table()


@pytest.fixture
def store(init) -> Iterator[RecordingStore]:
    s = RecordingStore(init, S_DIM)
    yield s
    s.gate.set()  # a test that failed with writes held must not leave its write-back thread blocked


@pytest.fixture
def executors(store) -> Iterator[Callable[..., PlanExecutor]]:
    """``executors(plans, pipelined=True, depth=2, cache_rows=4, on=store)``; all abandoned and joined afterwards."""
    made: list[PlanExecutor] = []

    def make(plans, *, pipelined: bool = True, depth: int = 2, cache_rows: int = 4, on=None) -> PlanExecutor:
        kind = PipelinedExecutor if pipelined else PlanExecutor
        ex = kind(store if on is None else on, SlotCache(cache_rows, D, S_DIM), iter(plans), depth=depth)
        made.append(ex)
        return ex

    yield make
    store.gate.set()
    for ex in made:
        ex.close(abandon=True)
        for t in ex._threads:
            t.join(SOON)


# PlanExecutor ----------------------------------------------------------------------
def test_a_fetch_waits_for_the_write_backs_it_depends_on(store, executors, init):
    ex = executors(hand_plans())
    store.gate.clear()  # write-backs are held
    it = iter(ex)
    p0 = next(it)
    train_step(ex.cache, p0)
    ex.after_step(p0)  # row 0 (updated) goes back: label 0, held at the gate
    p1 = next(it)  # fetches nothing written back: not held
    assert p1.step == 1 and store.held.wait(SOON)
    # step 2 refetches row 0 (fetch_after=0): its read must not be issued while row 0 is held
    assert not wait_until(lambda: any(op.label == 0 for op in store.ops("read")), HELD), store.ops()
    train_step(ex.cache, p1)
    ex.after_step(p1)
    store.gate.set()
    p2 = next(it)
    # the read saw the written-back value (init + step 0's update), not the initial one
    np.testing.assert_array_equal(ex.cache.weights[0].numpy(), init.rows(np.array([0]))[0] + np.float32(1))
    assert p2.step == 2
    log = store.ops()
    assert_fetches_gated(log)
    first_read_after_0 = next(i for i, op in enumerate(log) if op.kind == "read" and op.label == 0)
    assert (
        log.index(Op("write", (0,), None, "bagpipe-writeback"))
        < log.index(Op("mark", (), 0, "bagpipe-writeback"))
        < first_read_after_0
    )


def test_the_fetch_thread_runs_ahead_depth_plus_one_plans(store, executors):
    n, depth = 8, 2
    ex = executors([hand_plan(k, {k: k}, fetch=[k]) for k in range(n)], depth=depth, cache_rows=n)
    it = iter(ex)

    def reads_at_least(k: int) -> bool:
        return len(store.ops("read")) >= k

    for consumed in range(n - depth):
        # ``depth`` fetched plans wait in the queue, one more in the fetch thread's hand
        expect = min(n, consumed + depth + 1)
        assert wait_until(partial(reads_at_least, expect)), store.ops()
        assert not wait_until(partial(reads_at_least, expect + 1), 0.1 if consumed else HELD)
        assert next(it).step == consumed
    assert [op.rows for op in store.ops("read")] == [(k,) for k in range(n)]
    assert {op.thread for op in store.ops("read")} == {"bagpipe-fetch"}


def broken_planner(plans: list[Plan], good: int, exc: BaseException) -> Iterator[Plan]:
    yield from plans[:good]
    raise exc


FAULTS = {  # where -> (the store operation that fails and on which call, or None: the planner; steps done before)
    "planner": (None, 2),
    "read": (("read", 2), 1),
    "write": (("write", 1), None),  # asynchronous: how many steps pass first is timing
    "mark": (("mark", 2), None),
}


@pytest.mark.parametrize(
    "where,pipelined",
    [(w, True) for w in FAULTS] + [(w, False) for w in FAULTS if w != "mark"],  # synchronous execution marks nothing
    ids=lambda v: {True: "pipelined", False: "sync"}.get(v, v) if isinstance(v, bool) else v,
)
def test_a_failure_in_any_thread_reaches_the_trainer_as_itself(where, pipelined, store, executors):
    fault, steps_before = FAULTS[where]
    exc = (ValueError if where == "planner" else OSError)(f"{where} failed")
    plans = hand_plans()
    source: Iterable[Plan] = plans
    if fault is None:
        assert steps_before is not None  # the planner's fault: after a known number of plans
        source = broken_planner(plans, steps_before, exc)
    else:
        store.fail(*fault, exc)
    ex = executors(source, pipelined=pipelined)
    done: list[int] = []
    t0 = time.monotonic()
    with pytest.raises(type(exc)) as caught:
        run_steps(ex, done=done)
    assert caught.value is exc
    assert time.monotonic() - t0 < SOON
    if steps_before is not None:
        assert done == list(range(steps_before))
    t0 = time.monotonic()
    ex.close(abandon=True)
    assert time.monotonic() - t0 < SOON


def test_a_write_back_failure_reaches_drain_and_close(store, executors):
    exc = OSError("write failed")
    store.fail("write", 1, exc)
    ex = executors(hand_plans())
    p0 = next(iter(ex))
    ex.after_step(p0)
    with pytest.raises(OSError) as drained:
        ex.drain()
    with pytest.raises(OSError) as closed:
        ex.close()
    assert drained.value is exc and closed.value is exc
    assert not any(t.is_alive() for t in ex._threads)


def test_abandon_returns_while_a_write_back_hangs_and_drops_the_rest(store, executors):
    ex = executors(hand_plans())
    store.gate.clear()  # the store never answers a write: a dead peer
    run_steps(ex, steps=2)  # row 0's write-back hangs; step 1's (rows 1, 2) waits behind it
    assert store.held.wait(SOON)
    t0 = time.monotonic()
    ex.close(abandon=True)
    assert time.monotonic() - t0 < 2.5  # three threads joined for 0.5 s at most each
    store.gate.set()  # the peer answers after all: the hanging write completes
    wb = ex._threads[2]
    wb.join(SOON)
    assert not wb.is_alive()
    assert [op.rows for op in store.ops("write")] == [(0,)], (
        "write-backs queued behind an abandoned one must be dropped"
    )
    assert store.ops("mark") == [Op("mark", (), -1, "bagpipe-writeback")]


def test_close_drains_every_queued_write_back(store, executors, init):
    ex = executors(hand_plans())
    ref = Reference(init)
    store.gate.clear()
    run_steps(ex, ref, steps=2)
    assert store.held.wait(SOON)
    closing = Background(ex.close, "close")
    assert not closing.finished(HELD), "close() returned with write-backs still queued"
    store.gate.set()
    closing.result()
    assert [op.rows for op in store.ops("write")] == [(0,), (1, 2)]
    assert_store_holds(store, ref, 3)
    assert not any(t.is_alive() for t in ex._threads)


def test_close_while_the_planner_is_working_ends_every_thread(store, executors):
    release = threading.Event()

    def slow_planner():
        yield hand_plans()[0]
        release.wait(SOON)  # reading the next batches
        yield hand_plans()[1]

    ex = executors(slow_planner())
    plan = next(iter(ex))
    ex.after_step(plan)
    closing = Background(ex.close, "close")
    assert wait_until(ex._stop.is_set)  # close() has stopped the pipeline; now the planner hands over its plan
    release.set()
    closing.result(within=3.0)
    assert wait_until(lambda: not any(t.is_alive() for t in ex._threads), 1.0), [
        t.name for t in ex._threads if t.is_alive()
    ]


def slow_planner(plans: list[Plan], before: int, seconds: float) -> Iterator[Plan]:
    """``plans``, taking ``seconds`` to plan step ``before``."""
    for p in plans:
        if p.step == before:
            time.sleep(seconds)
        yield p


@pytest.mark.parametrize("pipelined", [True, False])
def test_the_trainer_waiting_for_a_plan_is_told_apart_from_waiting_for_rows(store, executors, pipelined):
    ex = executors(slow_planner(hand_plans(), 2, 0.4), pipelined=pipelined)
    run_steps(ex)
    t = ex.times
    # step 2's plan came 0.4 s after step 1's (steps 0 and 1 take no time): the trainer waited for it
    assert t.plan_waits >= 1 and 0.3 <= t.wait_plan <= t.wait_embeddings, t
    if pipelined:  # a step whose plan was ready but whose rows were not: write-backs held for 0.4 s
        store.gate.clear()
        opens = threading.Timer(0.4, store.gate.set)
        ex = executors(hand_plans())
        opens.start()
        run_steps(ex)  # step 2 refetches row 0, written back after step 0: held until the gate opens
        opens.join()
        t = ex.times
        assert t.wait_embeddings >= 0.3 and t.wait_plan <= t.wait_embeddings - 0.25, t


def test_synchronous_mode_works_in_the_callers_thread_in_plan_order(store, executors, init):
    threads_before = threading.active_count()
    ex = executors(hand_plans(), pipelined=False)
    assert ex._threads == [] and threading.active_count() == threads_before
    ref = Reference(init)
    it = iter(ex)
    assert store.ops() == []  # nothing is read before the trainer asks for a plan
    first = next(it)
    assert store.ops() == [Op("read", (0, 1), -1, "MainThread")]
    run_steps(ex, ref, plans=chain([first], it))
    ex.close()
    # each step's write-backs, then its label marked (another trainer's read of a remote store waits for
    # it), then the next plan's read, which carries its fetch_after
    assert [(op.kind, op.rows, op.label) for op in store.ops()] == [
        ("read", (0, 1), -1),
        ("write", (0,), None),
        ("mark", (), 0),
        ("read", (2,), -1),
        ("write", (1, 2), None),
        ("mark", (), 1),
        ("read", (0,), 0),
        ("write", (0,), None),
        ("mark", (), 2),
        ("read", (1,), 1),
        ("write", (1,), None),
    ]
    assert {op.thread for op in store.ops()} == {"MainThread"}
    assert_store_holds(store, ref, 3)


def skewed_batches(num_rows: int, steps: int, lookups: int, seed: int = 0) -> list[tuple[int, Batch]]:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, num_rows + 1)
    return [(k, batch_of(rng.choice(num_rows, size=lookups, p=p / p.sum()))) for k in range(steps)]


class SlowWrites(RecordingStore):
    """Write-backs that take a little while, so that a fetch issued too early reads stale rows."""

    def _write(self, rows, weights, state) -> None:
        time.sleep(0.002)
        super()._write(rows, weights, state)


@pytest.mark.parametrize(
    "planner,pipelined,where",
    [
        ("lookahead", True, "memory"),
        ("lookahead", True, "servers"),
        ("lookahead", False, "memory"),
        ("nocache", False, "memory"),
    ],
)
def test_the_store_ends_as_if_every_update_went_straight_to_it(planner, pipelined, where, executors, clusters):
    init = RowInitializer([40, 30], D, seed=3)
    batches = skewed_batches(init.num_rows, steps=30, lookups=12)
    cache_rows, L = 12, 3
    oracle = LookaheadOracle(init.num_rows, cache_rows, L) if planner == "lookahead" else NoCachePlanner(cache_rows)
    plans = list(oracle.plans(batches))
    if planner == "lookahead":  # forced evictions: fetches that wait for later labels than step - L - 1
        assert oracle.stats.forced_evictions > 0 and any(p.fetch_after > p.step - L - 1 for p in plans)
    if where == "memory":
        store = SlowWrites(init, S_DIM)
    else:
        store = clusters(init, trainers=1, servers=2).clients[0]
    ex = executors(plans, pipelined=pipelined, depth=L + 1, cache_rows=cache_rows, on=store)
    ref = Reference(init)
    run_steps(ex, ref)
    ex.drain()
    ex.write_cached()
    ex.close()
    if where == "memory":
        assert_fetches_gated(store.ops())
    else:
        store.finish_writes()
    assert_store_holds(store, ref, init.num_rows)
