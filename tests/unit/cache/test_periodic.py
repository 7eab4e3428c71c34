"""cDLRM's periodic averaging (``bagpipe/cache/periodic.py``), tested with threads.

Two trainers run as two threads over the lookahead oracle's plans of a hand-made row
sequence (rows reused, rows leaving the cache, a cache small enough to force rows out
early), split by :func:`partition`; each thread runs what the plan executor does around
the row strategy (forced write-backs, fetches from a shared store, write-backs of
expiring rows; a barrier per step stands in for the servers' ordering), and
``torch.distributed.all_reduce`` is an in-memory sum (as in tests/unit/cache/test_allreduce.py).

* **K = 1 equals the exact replicated cache** with row-wise SGD (within float rounding):
  the average of the trainers' copies, each updated with its own gradient, is the
  update of the averaged gradient.
* With gradients that do not depend on the values (fixed here), SGD's updates add up, so
  **every K** must end equal to the exact cache too: no trainer's update is lost, and a
  row is averaged before it is written back or forced out -- the bookkeeping of which
  copies differ, checked for K = 2, 3 and 100 (only the final averaging).
* With row-wise Adagrad and K = 3 the result differs from the exact cache (the
  approximation is real), the copies still agree after ``finish``, and fewer bytes are
  all-reduced per step than the partitioned cache's K * D * 4.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from fakes import FakeAllReduce

import bagpipe.cache.allreduce as allreduce
from bagpipe.cache.allreduce import SyncedRowUpdate
from bagpipe.cache.periodic import PeriodicRowUpdate
from bagpipe.cache.slots import SlotCache
from bagpipe.data.batch import Batch
from bagpipe.distributed.partition import partition
from bagpipe.optim.sparse import RowWiseAdagrad, RowWiseSGD
from bagpipe.oracle.lookahead import LookaheadOracle
from bagpipe.train.protocols import StepInput

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

D, ROWS, N = 4, 30, 2
CACHE = 12
rng = np.random.default_rng(7)
# 12 steps of 8 lookups over 30 rows: hot rows 0-4 recur, the rest come and go
STEPS = [rng.choice(5, 3).tolist() + rng.choice(np.arange(5, ROWS), 5).tolist() for _ in range(12)]


def batch_of(rows: list[int]) -> Batch:
    B = len(rows)
    return Batch(
        labels=torch.zeros(B),
        dense=torch.zeros(B, 0),
        rows=torch.tensor(rows, dtype=torch.int64),
        offsets=torch.arange(B + 1),
        num_features=1,
    )


def run(make_update, opt, *, replicated: bool) -> tuple[torch.Tensor, torch.Tensor, list]:
    """The store's (ROWS, D) weights and state after the steps, and the row strategies."""
    oracle = LookaheadOracle(ROWS, CACHE, 3)
    plans = [
        partition(p, N, replicated=replicated) for p in oracle.plans((k, batch_of(r)) for k, r in enumerate(STEPS))
    ]
    g = torch.Generator().manual_seed(0)
    store_w, store_s = torch.randn(ROWS, D, generator=g), torch.zeros(ROWS, opt.state_dim)
    caches = [SlotCache(CACHE, D, opt.state_dim) for _ in range(N)]
    updates = [make_update(opt, caches[i], i) for i in range(N)]
    barrier, errors = threading.Barrier(N), []

    def write(cache, slots, rows):
        if len(slots):
            store_w[torch.from_numpy(rows)] = cache.weights[torch.from_numpy(slots)]
            store_s[torch.from_numpy(rows)] = cache.state[torch.from_numpy(slots)]

    def trainer(i):
        try:
            cache, upd = caches[i], updates[i]
            for parts in plans:
                p = parts[i]
                upd.before_evict(p)
                write(cache, p.evict_before_slots, p.evict_before_rows)
                barrier.wait(10)
                f = torch.from_numpy(p.fetch_slots)
                cache.weights[f] = store_w[torch.from_numpy(p.fetch_rows)]
                cache.state[f] = store_s[torch.from_numpy(p.fetch_rows)]
                idx = torch.from_numpy(p.slots)
                grad = torch.randn(len(p.rows), D, generator=torch.Generator().manual_seed(1000 * p.step + i))
                upd.apply(
                    StepInput(p.step, p.batch, cache.weights, cache.state, idx, torch.from_numpy(p.inverse), p),
                    cache.weights.index_select(0, idx),
                    grad,
                )
                upd.finish() if isinstance(upd, SyncedRowUpdate) else None  # the exact cache: no deferred half here
                write(cache, p.evict_after_slots, p.evict_after_rows)
                barrier.wait(10)
            upd.finish()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=trainer, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return store_w, store_s, updates


@pytest.fixture
def fake_dist(monkeypatch):
    monkeypatch.setattr(allreduce.dist, "all_reduce", FakeAllReduce(N))


def exact(opt):
    return run(lambda o, c, i: SyncedRowUpdate(o, c, group=i), opt, replicated=True)


def periodic(opt, K):
    return run(lambda o, c, i: PeriodicRowUpdate(o, c, K, N, group=i), opt, replicated=False)


def test_the_plans_force_rows_out_and_reuse_them():
    oracle = LookaheadOracle(ROWS, CACHE, 3)
    plans = list(oracle.plans((k, batch_of(r)) for k, r in enumerate(STEPS)))
    assert sum(len(p.evict_before_rows) for p in plans) > 0 and sum(len(p.fetch_rows) for p in plans) > len(STEPS[0])


@pytest.mark.parametrize("K", [1, 2, 3, 100])
def test_sgd_every_period_equals_the_exact_replicated_cache(fake_dist, K):
    ref_w, _, _ = exact(RowWiseSGD(0.1))
    w, _, _ = periodic(RowWiseSGD(0.1), K)
    torch.testing.assert_close(w, ref_w, rtol=1e-6, atol=1e-6)


def test_adagrad_is_an_approximation_with_fewer_bytes(fake_dist):
    ref_w, ref_s, ref_up = run(lambda o, c, i: SyncedRowUpdate(o, c, group=i), RowWiseAdagrad(0.1), replicated=False)
    w, s, ups = periodic(RowWiseAdagrad(0.1), 3)
    assert not torch.allclose(w, ref_w, atol=1e-4)
    assert all(not u.dirty.any() for u in ups)
    partitioned = np.mean(ref_up[0].bytes_synced)
    assert ups[0].stats()["sync_bytes_per_step"] < partitioned
    assert ups[0].stats()["periodic"]["averagings"] > 0
