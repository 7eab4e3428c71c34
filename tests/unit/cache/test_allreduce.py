"""The data-parallel row strategy (``bagpipe/cache/allreduce.py``), tested with threads.

Two trainers run as two threads; ``torch.distributed.all_reduce`` is replaced by an
in-memory one that sums the k-th call of every trainer (asynchronous calls complete
when the last trainer arrives, as gloo's do). Over plans the lookahead oracle makes
and :func:`partition` splits:

* with one trainer, :class:`SyncedRowUpdate` changes the cache bit for bit as the
  one-process :class:`LocalRowUpdate` does (nothing is averaged or communicated);
* with two trainers, every row ends as one process would leave it after a step on
  the global batch (gradients averaged, within float rounding), and the synchronised
  rows are identical on both trainers -- with row-wise Adagrad, and with row-wise Adam
  (S = 2D) under a warm-up schedule, whose deferred rows must be updated with their
  step's rate and bias correction;
* the deferred half of a step's synchronisation is really deferred: after
  ``apply`` those rows still hold their old values and a reduction is in flight;
  ``before_evict`` finishes it exactly when the next plan evicts or drops one of its
  slots, and ``finish`` always does.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from fakes import FakeAllReduce

import bagpipe.cache.allreduce as allreduce
from bagpipe.cache.allreduce import SyncedRowUpdate
from bagpipe.cache.slots import SlotCache
from bagpipe.data.batch import Batch
from bagpipe.distributed.partition import partition
from bagpipe.optim.adam import RowWiseAdam
from bagpipe.optim.schedule import LRSchedule
from bagpipe.optim.sparse import RowWiseAdagrad
from bagpipe.oracle.lookahead import LookaheadOracle
from bagpipe.oracle.plan import Plan
from bagpipe.train.protocols import StepInput
from bagpipe.train.step import LocalRowUpdate

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

D = 4
ROWS = 40


@pytest.fixture
def fake_dist(monkeypatch):
    def install(n: int) -> FakeAllReduce:
        fake = FakeAllReduce(n)
        monkeypatch.setattr(allreduce.dist, "all_reduce", fake)
        return fake

    return install


def batch_of(rows: list[int], num_features: int = 1) -> Batch:
    """A one-hot batch of B = len(rows) samples and one feature."""
    r = torch.tensor(rows, dtype=torch.int64)
    B = len(rows)
    return Batch(labels=torch.zeros(B), dense=torch.zeros(B, 0), rows=r, offsets=torch.arange(B + 1), num_features=1)


def global_plans(steps: list[list[int]], lookahead: int = 2, cache_rows: int = 64) -> list[Plan]:
    oracle = LookaheadOracle(ROWS, cache_rows, lookahead)
    return list(oracle.plans((k, batch_of(rows)) for k, rows in enumerate(steps)))


def fresh_cache(
    plan_rows: np.ndarray, slots: np.ndarray, seed: int = 0, state_dim: int = 1
) -> tuple[SlotCache, torch.Tensor]:
    """A cache whose slots hold deterministic values of their rows (and state); also returns the (ROWS, D) truth."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(ROWS, D, generator=g)
    cache = SlotCache(64, D, state_dim)
    cache.weights[torch.from_numpy(slots)] = table[torch.from_numpy(plan_rows)]
    cache.state[torch.from_numpy(slots)] = torch.rand(len(slots), state_dim, generator=g)  # moments are >= 0
    return cache, table


def grads_for(rows: np.ndarray, trainer: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + trainer)
    return torch.randn(len(rows), D, generator=g)


def run_trainers(tplans, caches, updates):
    """Each trainer applies its part of the step in its own thread; returns per-trainer grads."""
    grads = [grads_for(p.rows, i) for i, p in enumerate(tplans)]
    errors = []

    def one(i):
        try:
            p = tplans[i]
            idx = torch.from_numpy(p.slots)
            inp = StepInput(p.step, p.batch, caches[i].weights, caches[i].state, idx, torch.from_numpy(p.inverse), p)
            updates[i].apply(inp, caches[i].weights.index_select(0, idx), grads[i])
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(tplans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors, errors
    return grads


STEPS = [[1, 2, 3, 4, 5, 6], [2, 7, 8, 9, 10, 11], [5, 12, 13, 2, 14, 15], [16, 17, 18, 19, 20, 21]]


def test_one_trainer_is_bitwise_the_local_update():
    plan = global_plans(STEPS)[0]
    (tp,) = partition(plan, 1)
    opt = RowWiseAdagrad(0.1)
    a, _ = fresh_cache(plan.rows, plan.slots)
    b, _ = fresh_cache(plan.rows, plan.slots)
    grad = grads_for(tp.rows, 0)
    idx = torch.from_numpy(tp.slots)
    synced = SyncedRowUpdate(opt, a)
    synced.apply(
        StepInput(0, tp.batch, a.weights, a.state, idx, torch.from_numpy(tp.inverse), tp), a.weights[idx].clone(), grad
    )
    synced.finish()
    LocalRowUpdate(opt).apply(
        StepInput(0, tp.batch, b.weights, b.state, idx, torch.from_numpy(tp.inverse), tp), b.weights[idx].clone(), grad
    )
    assert torch.equal(a.weights, b.weights) and torch.equal(a.state, b.state)
    assert synced.bytes_synced == [0]


OPTIMIZERS = {
    "adagrad": (lambda: RowWiseAdagrad(0.1), 1),
    # a warm-up: the rate and the bias correction depend on the step, also for the deferred half
    "adam-warmup": (lambda: RowWiseAdam(0.1, D, schedule=LRSchedule("warmup-poly", warmup_steps=8)), 2 * D),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_two_trainers_end_like_one_process_on_the_global_batch(fake_dist, name):
    fake_dist(2)
    make, S = OPTIMIZERS[name]
    plan = global_plans(STEPS)[0]
    tplans = partition(plan, 2)
    opt = make()
    caches = [fresh_cache(plan.rows, plan.slots, state_dim=S)[0] for _ in range(2)]
    updates = [SyncedRowUpdate(opt, caches[i], group=i) for i in range(2)]
    grads = run_trainers(tplans, caches, updates)
    for u in updates:
        u.finish()
    # one process: each row's gradient is the mean over the global batch = sum_i g_i / N
    total = torch.zeros(ROWS, D)
    for p, g in zip(tplans, grads):
        total[torch.from_numpy(p.rows)] += g / 2
    ref, table = fresh_cache(plan.rows, plan.slots, state_dim=S)
    idx = torch.from_numpy(plan.slots)
    new_w, new_s = opt.update(
        table[torch.from_numpy(plan.rows)], ref.state[idx], total[torch.from_numpy(plan.rows)], plan.step
    )
    for i, p in enumerate(tplans):
        mine = torch.from_numpy(p.slots)
        pos = np.searchsorted(plan.rows, p.rows)
        torch.testing.assert_close(caches[i].weights[mine], new_w[pos], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(caches[i].state[mine], new_s[pos], rtol=1e-6, atol=1e-7)
    synced = torch.from_numpy(tplans[0].sync_slots)
    assert len(synced) > 0 and torch.equal(caches[0].weights[synced], caches[1].weights[synced])
    assert all(u.bytes_synced == [len(synced) * D * 4] for u in updates)


def test_the_deferred_half_waits_for_the_next_plan_or_finish(fake_dist):
    fake_dist(2)
    plans = global_plans(STEPS)
    tplans = partition(plans[0], 2)
    deferred = tplans[0].sync_slots[tplans[0].sync_urgent :]
    assert len(deferred) > 0, "the hand-made steps must leave rows whose synchronisation can wait"
    opt = RowWiseAdagrad(0.1)
    caches = [fresh_cache(plans[0].rows, plans[0].slots)[0] for _ in range(2)]
    updates = [SyncedRowUpdate(opt, caches[i], group=i) for i in range(2)]
    before = caches[0].weights[torch.from_numpy(deferred)].clone()
    run_trainers(tplans, caches, updates)
    assert all(u.pending is not None for u in updates)
    assert torch.equal(caches[0].weights[torch.from_numpy(deferred)], before)  # not applied yet
    # a plan that neither evicts nor drops a pending slot leaves it pending
    quiet = Plan(
        step=1,
        batch=tplans[0].batch,
        rows=np.zeros(0, np.int64),
        slots=np.zeros(0, np.int64),
        inverse=np.zeros(0, np.int64),
    )
    updates[0].before_evict(quiet)
    assert updates[0].pending is not None
    # one that evicts a pending slot finishes it first
    evicting = Plan(
        step=1,
        batch=tplans[0].batch,
        rows=np.zeros(0, np.int64),
        slots=np.zeros(0, np.int64),
        inverse=np.zeros(0, np.int64),
        evict_before_rows=np.array([0]),
        evict_before_slots=deferred[:1],
    )
    updates[0].before_evict(evicting)
    assert updates[0].pending is None
    assert not torch.equal(caches[0].weights[torch.from_numpy(deferred)], before)
    dropping = Plan(
        step=1,
        batch=tplans[1].batch,
        rows=np.zeros(0, np.int64),
        slots=np.zeros(0, np.int64),
        inverse=np.zeros(0, np.int64),
        drop_before_slots=deferred[-1:],
    )
    updates[1].before_evict(dropping)
    assert updates[1].pending is None
    assert torch.equal(caches[0].weights[torch.from_numpy(deferred)], caches[1].weights[torch.from_numpy(deferred)])
    assert updates[0].phase_seconds()["sync_wait"] >= 0
