"""The lookahead oracle's fast read path gives exactly the reference's plans.

* ``unique_inverse_in`` (distinct values found through an int32 scratch array indexed by
  value) returns what ``unique_inverse`` (one sort of the packed values) and
  ``np.unique(return_inverse=True)`` return, with the same dtypes, and leaves the
  scratch array exactly as it found it -- on random arrays with repeats, sorted and
  unsorted, empty or of one value; ``read_latest`` (the same fused with the row map's get
  and set) returns those and each row's old entry, and moves the map on as get + set do.
* ``LookaheadOracle(fast=True)`` (the dense row map as scratch space) and
  ``LookaheadOracle(fast=False)`` (the reference: the sort of every lookup) give equal
  plans -- every array of every plan with its dtype, and ``fetch_after`` -- over random
  batch sequences (hypothesis) with several cache sizes (down to one batch, so the oracle
  forces rows out) and windows L, with the dense row map and with the window map
  (``WindowMap``, which always sorts), and equal statistics.
* The same behind a hot tier (``HotSplit``, which finds each batch's unique rows the
  planner's way): equal merged plans from the fast and the reference oracle.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import bagpipe.oracle.lookahead as la
from bagpipe.accel.hot import HotSplit
from bagpipe.accel.profile import HotSet
from bagpipe.data.batch import Batch
from bagpipe.oracle.plan import same_plan
from bagpipe.oracle.unique import read_latest, unique_inverse, unique_inverse_in

pytestmark = pytest.mark.unit

ROWS = 60


def make_batch(rows: list[int]) -> Batch:
    n = len(rows)
    return Batch(
        labels=torch.zeros(n),
        dense=torch.zeros(n, 1),
        rows=torch.tensor(rows, dtype=torch.int64),
        offsets=torch.arange(n + 1, dtype=torch.int64),
        num_features=1,
    )


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(0, ROWS - 1), max_size=80), ordered=st.booleans(), seed=st.integers(0, 2**16))
def test_scratch_unique_equals_the_sort_and_restores_the_scratch(values, ordered, seed):
    v = np.array(sorted(set(values)) if ordered else values, dtype=np.int64)
    scratch = np.random.default_rng(seed).integers(-1, 2**31 - 1, size=ROWS, dtype=np.int64).astype(np.int32)
    before = scratch.copy()
    uniq, inverse = unique_inverse_in(scratch, v)
    ref_uniq, ref_inverse = unique_inverse(v)
    np_uniq, np_inverse = np.unique(v, return_inverse=True)
    assert np.array_equal(scratch, before)
    assert uniq.dtype == inverse.dtype == ref_uniq.dtype == ref_inverse.dtype == np.int64
    assert np.array_equal(uniq, ref_uniq) and np.array_equal(inverse, ref_inverse)
    assert np.array_equal(uniq, np_uniq) and np.array_equal(inverse, np_inverse)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(0, ROWS - 1), max_size=80), hi=st.integers(0, 2**40), seed=st.integers(0, 2**16))
def test_fused_read_equals_the_unique_then_the_maps_get_and_set(values, hi, seed):
    v = np.array(values, dtype=np.int64)
    latest = np.random.default_rng(seed).integers(-1, 2**31 - 1, size=ROWS, dtype=np.int64).astype(np.int32)
    want_map = latest.copy()
    ref_uniq, ref_inverse = unique_inverse(v)
    ref_prev = want_map.take(ref_uniq).astype(np.int64)
    want_map[ref_uniq] = (np.arange(hi, hi + len(ref_uniq)) % 2**31).astype(np.int32)
    uniq, inverse, prev = read_latest(latest, v, hi)
    assert uniq.dtype == inverse.dtype == prev.dtype == np.int64
    assert np.array_equal(uniq, ref_uniq) and np.array_equal(inverse, ref_inverse)
    assert np.array_equal(prev, ref_prev)
    assert np.array_equal(latest, want_map)


def plans(batches, C: int, L: int, fast: bool, dense: bool, retain: bool = False):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(la, "DENSE_MAP_BYTES", 1 << 40 if dense else 0)
        o = la.LookaheadOracle(ROWS, C, L, fast=fast, retain=retain)
    assert isinstance(o.latest, la.DenseMap if dense else la.WindowMap)
    return o, list(o.plans(batches))


# batches of 1..30 lookups over 60 rows; some given already sorted and distinct (as a hot tier's cold rows)
batch_lists = st.lists(
    st.tuples(st.lists(st.integers(0, ROWS - 1), min_size=1, max_size=30), st.booleans()), min_size=1, max_size=40
)


@settings(max_examples=120, deadline=None)
@given(seq=batch_lists, L=st.integers(1, 12), extra=st.sampled_from([0, 1, 5, 60]), retain=st.booleans())
def test_fast_and_reference_oracles_give_equal_plans(seq, L, extra, retain):
    rows = [sorted(set(b)) if distinct else b for b, distinct in seq]
    batches = [(k, make_batch(r)) for k, r in enumerate(rows)]
    C = max(len(set(r)) for r in rows) + extra  # extra = 0: one batch's rows, rows are forced out
    ref_o, ref = plans(batches, C, L, False, True, retain)
    for fast, dense in ((True, True), (True, False), (False, False)):
        o, got = plans(batches, C, L, fast, dense, retain)
        assert len(got) == len(ref) == len(rows)
        assert all(same_plan(a, b) for a, b in zip(got, ref)), (fast, dense)
        assert (o.stats.hits, o.stats.forced_evictions, o.stats.retained_evictions) == (
            ref_o.stats.hits,
            ref_o.stats.forced_evictions,
            ref_o.stats.retained_evictions,
        )


@settings(max_examples=60, deadline=None)
@given(
    seq=batch_lists, hot_rows=st.sets(st.integers(0, ROWS - 1), max_size=20), L=st.integers(1, 8), retain=st.booleans()
)
def test_fast_and_reference_oracles_behind_a_hot_tier_give_equal_plans(seq, hot_rows, L, retain):
    hot = HotSet(np.array(sorted(hot_rows), dtype=np.int64), ROWS)
    batches = [(k, make_batch(b)) for k, (b, _) in enumerate(seq)]
    C = max(len(set(b)) for b, _ in seq)
    got, ref = (
        [*HotSplit(hot, C).wrap(la.LookaheadOracle(ROWS, C, L, fast=fast, retain=retain), batches)]
        for fast in (True, False)
    )
    assert len(got) == len(ref) == len(seq)
    assert all(same_plan(a, b) for a, b in zip(got, ref))


def test_same_plan_tells_plans_apart():
    batches = [(k, make_batch(b)) for k, b in enumerate([[1, 2, 3], [2, 4], [1, 5]])]
    a = list(la.LookaheadOracle(ROWS, 4, 2).plans(batches))
    b = list(la.LookaheadOracle(ROWS, 4, 2).plans(batches))
    assert all(same_plan(x, y) for x, y in zip(a, b))
    b[1].slots = b[1].slots.astype(np.int32)  # equal values, another dtype
    b[2].fetch_after += 1
    assert same_plan(a[0], b[0]) and not same_plan(a[1], b[1]) and not same_plan(a[2], b[2])
    c = list(la.LookaheadOracle(ROWS, 4, 1).plans(batches))  # a shorter window: row 1 leaves after step 0
    assert not all(same_plan(x, y) for x, y in zip(a, c))
