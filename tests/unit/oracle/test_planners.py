"""The planners (lookahead oracle, LRU, nocache) plan correctly.

Proves, on hand-built batch sequences, the exact hit / miss / fetch / write-back /
forced-eviction counts computed by hand (TorchRec's test_cache_prefetch style); and,
on random sequences (hypothesis), that every plan is consistent with the cache it
describes, never exceeds the capacity, writes every row back by the end, and never
reads a stale row even when each fetch is issued as early as ``fetch_after`` allows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bagpipe.data.batch import Batch
from bagpipe.errors import CapacityError
from bagpipe.oracle import LookaheadOracle, LRUPlanner, NoCachePlanner
from bagpipe.oracle.lookahead import DenseMap

pytestmark = pytest.mark.unit


def make_batch(rows: list[int]) -> Batch:
    n = len(rows)
    return Batch(
        labels=torch.zeros(n),
        dense=torch.zeros(n, 1),
        rows=torch.tensor(rows, dtype=torch.int64),
        offsets=torch.arange(n + 1, dtype=torch.int64),
        num_features=1,
    )


def run(planner, seq: list[list[int]]):
    return list(planner.plans((i, make_batch(r)) for i, r in enumerate(seq)))


HAND = [[1, 2], [2, 3], [1, 4], [5], [1]]


def counts(plans):
    return (
        sum(p.hits for p in plans),
        sum(p.misses for p in plans),
        sum(len(p.evict_after_rows) + len(p.evict_before_rows) for p in plans),
    )


def test_hand_sequence_window_2():
    o = LookaheadOracle(num_rows=10, cache_rows=4, lookahead=2)
    plans = run(o, HAND)
    assert [p.hits for p in plans] == [0, 1, 1, 0, 1]
    assert [sorted(p.fetch_rows.tolist()) for p in plans] == [[1, 2], [3], [4], [5], []]
    assert [sorted(p.evict_after_rows.tolist()) for p in plans] == [[], [2, 3], [4], [5], [1]]
    assert counts(plans) == (3, 5, 5)
    assert o.stats.forced_evictions == 0
    assert o.stats.as_dict()["hits"] == 3 and o.stats.rows_fetched == 5 and o.stats.rows_written_back == 5


def test_hand_sequence_window_1_forgets_reuse_beyond_window():
    o = LookaheadOracle(num_rows=10, cache_rows=4, lookahead=1)
    plans = run(o, HAND)
    # row 1 is reused 2 steps later: outside a window of 1, so it leaves after each use
    assert [p.hits for p in plans] == [0, 1, 0, 0, 0]
    assert counts(plans) == (1, 7, 7)


def test_hand_sequence_forced_eviction_by_furthest_next_use():
    o = LookaheadOracle(num_rows=10, cache_rows=2, lookahead=2)
    plans = run(o, HAND)
    # step 1 needs a slot for row 3 while rows 1 (next use: step 2) and 2 (used now) fill the cache
    assert plans[1].evict_before_rows.tolist() == [1]
    assert o.stats.forced_evictions == 1
    assert [p.hits for p in plans] == [0, 1, 0, 0, 1]
    assert counts(plans) == (2, 6, 6)
    # row 1 is read again at step 2: only after its forced write-back (labelled step 0)
    assert plans[2].fetch_after == 0


def test_capacity_below_one_batch_is_an_error():
    o = LookaheadOracle(num_rows=10, cache_rows=1, lookahead=2)
    with pytest.raises(CapacityError, match="at least 2"):
        run(o, HAND)


@pytest.mark.parametrize("make", [lambda e: LookaheadOracle(10, 1, 2, e), lambda e: LRUPlanner(10, 1, e)])
def test_a_cache_below_a_batch_names_its_step_from_1_and_what_it_needs(make):
    """The batch's unique rows are what the step needs; the run's bound (B x F) is a size that
    is enough for any batch, not a minimum. Steps count from 1, as the progress lines do."""
    seq = [[1], [2], [3, 4]]  # the third batch (planner step 2) has 2 unique rows; the cache 1 slot
    with pytest.raises(CapacityError) as e:
        run(make(8), seq)
    assert str(e.value) == (
        "a cache of 1 row cannot hold step 3's 2 unique rows; it needs at least 2 "
        "(8 cache rows are enough for any batch of this run)"
    )
    with pytest.raises(CapacityError) as e:
        run(make(None), seq)  # no bound known: the floor alone
    assert str(e.value) == "a cache of 1 row cannot hold step 3's 2 unique rows; it needs at least 2"


def test_lru_hand_sequence():
    p = LRUPlanner(num_rows=10, cache_rows=3)
    plans = run(p, HAND)
    # step 2 hits row 1 and must evict one of rows 2 and 3 (both last used at step 1):
    # the tie goes to the lower slot, row 2; step 3 then evicts row 3 (last used at 1)
    assert [pl.hits for pl in plans] == [0, 1, 1, 0, 1]
    assert plans[2].evict_before_rows.tolist() == [2]
    assert plans[3].evict_before_rows.tolist() == [3]
    assert plans[4].evict_before_rows.tolist() == []
    assert counts(plans) == (3, 5, 2)


def test_nocache_fetches_and_writes_everything():
    plans = run(NoCachePlanner(cache_rows=4), HAND)
    assert counts(plans) == (0, 8, 8)


def simulate(plans, C: int, L: int | None, num_rows: int) -> None:
    """Replay plans with versioned rows, issuing each fetch as early as allowed."""
    true_version = np.zeros(num_rows, np.int64)  # bumped on every use of a row
    store = np.zeros(num_rows, np.int64)
    slot_row = np.full(C, -1)
    slot_ver = np.zeros(C, np.int64)
    staged: dict[int, np.ndarray] = {}
    by_label: dict[int, list] = {}
    first = plans[0].step
    for p in plans:
        assert p.fetch_after <= p.step - 1
        if L is not None:
            assert p.step - L - 1 <= p.fetch_after <= p.step - 2
        by_label.setdefault(max(p.fetch_after, first - 1), []).append(p)

    def issue(label):
        for q in by_label.pop(label, []):
            staged[q.step] = store[q.fetch_rows].copy()

    issue(first - 1)
    prev = None
    for p in plans:
        # write-back group labelled p.step - 1: previous expiries, then forced evictions
        for slots, rows in (
            (prev.evict_after_slots, prev.evict_after_rows) if prev else ((), ()),
            (p.evict_before_slots, p.evict_before_rows),
        ):
            for s, r in zip(slots, rows):
                assert slot_row[s] == r
                store[r] = slot_ver[s]
                slot_row[s] = -1
        issue(p.step - 1)
        vals = staged.pop(p.step)
        for s, r, v in zip(p.fetch_slots, p.fetch_rows, vals):
            assert slot_row[s] == -1, "fetch into an occupied slot"
            assert v == true_version[r], f"stale read of row {r} at step {p.step}"
            slot_row[s], slot_ver[s] = r, v
        assert (slot_row >= 0).sum() <= C
        assert np.array_equal(slot_row[p.slots], p.rows), "plan slots disagree with the cache"
        assert np.array_equal(np.unique(p.batch.rows.numpy()), p.rows)
        assert np.array_equal(p.rows[p.inverse], p.batch.rows.numpy())
        true_version[p.rows] += 1
        slot_ver[p.slots] += 1
        prev = p
    assert prev is not None
    for s, r in zip(prev.evict_after_slots, prev.evict_after_rows):
        store[r] = slot_ver[s]
        slot_row[s] = -1
    for s in np.flatnonzero(slot_row >= 0):  # rows a cache still holds are flushed at the end
        store[slot_row[s]] = slot_ver[s]
    assert np.array_equal(store, true_version), "an update never reached the store"


batches_strategy = st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=12), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(seq=batches_strategy, L=st.integers(1, 10), extra=st.integers(0, 30))
def test_lookahead_random_sequences_are_exact(seq, L, extra):
    C = max(len(set(b)) for b in seq) + extra
    o = LookaheadOracle(num_rows=41, cache_rows=C, lookahead=L)
    plans = run(o, seq)
    assert len(plans) == len(seq)
    simulate(plans, C, L, 41)
    # the oracle never misses a row reused within its window unless it was forced out
    if o.stats.forced_evictions == 0:
        for x, p in enumerate(plans):
            for r in p.fetch_rows:
                assert not any(r in seq[y] for y in range(max(0, x - L), x))


@settings(max_examples=60, deadline=None)
@given(seq=batches_strategy, extra=st.integers(0, 30))
def test_lru_random_sequences_are_exact(seq, extra):
    C = max(len(set(b)) for b in seq) + extra
    plans = run(LRUPlanner(num_rows=41, cache_rows=C), seq)
    simulate(plans, C, None, 41)


def test_lookahead_with_ample_cache_misses_only_first_uses_in_window():
    rng = np.random.default_rng(0)
    seq = [rng.integers(0, 50, size=8).tolist() for _ in range(60)]
    L = 5
    o = LookaheadOracle(num_rows=50, cache_rows=50, lookahead=L)
    plans = run(o, seq)
    expected_misses = sum(
        len({r for r in set(seq[x]) if not any(r in seq[y] for y in range(max(0, x - L), x))}) for x in range(len(seq))
    )
    assert sum(p.misses for p in plans) == expected_misses
    assert o.stats.forced_evictions == 0


def test_oracle_state_is_one_int32_per_row():
    o = LookaheadOracle(num_rows=1_000_000, cache_rows=100, lookahead=4)
    assert isinstance(o.latest, DenseMap)  # 4 MB: under DENSE_MAP_BYTES
    assert o.latest.latest.dtype == np.int32 and o.latest.latest.shape == (1_000_000,)


def test_oracle_state_of_a_huge_table_grows_with_the_window():
    o = LookaheadOracle(num_rows=204_184_588, cache_rows=100, lookahead=4)  # criteo-1tb: 779 MiB per row map
    assert o.latest.nbytes == 0 and o.state_bytes < 8 << 20


def test_retaining_oracle_keeps_rows_past_the_window_until_their_slot_is_needed():
    # L = 1, C = 4. Expiry writes row 1 back after step 0 and after step 2 (its next use is two
    # steps later); retained, it is a hit at steps 2 and 4. At step 3 row 5 needs a slot with the
    # cache full: the least recently used retained row that no batch read so far uses again is
    # row 2 (last used at step 1, slot 1; row 3 also, in slot 2: the lower slot goes first; row 1
    # is pinned by step 4, which plan 3 has read).
    o = LookaheadOracle(num_rows=10, cache_rows=4, lookahead=1, retain=True)
    plans = run(o, HAND)
    assert [p.hits for p in plans] == [0, 1, 1, 0, 1]
    assert [p.evict_after_rows.tolist() for p in plans] == [[], [], [], [], []]
    assert plans[3].evict_before_rows.tolist() == [2] and plans[3].fetch_slots.tolist() == [1]
    assert counts(plans) == (3, 5, 1)
    assert (o.stats.retained_evictions, o.stats.forced_evictions, o.stats.max_occupied) == (1, 0, 4)
    simulate(plans, 4, 1, 10)  # rows 1, 3, 4 and 5 stay cached: the end's flush writes them
    expiry = run(LookaheadOracle(num_rows=10, cache_rows=4, lookahead=1), HAND)
    assert [p.hits for p in expiry] == [0, 1, 0, 0, 0]


def test_retained_row_pinned_by_a_read_use_can_be_forced_out_and_is_fetched_after_its_write_back():
    # C = 2, L = 2: after step 0 row 1 is retained (its next use, step 3, is beyond the window);
    # plan 1 reads step 3, which pins it. Step 2 needs two slots for rows 3 and 4: the retained
    # row 2 (no further use) goes first, then Belady forces out the pinned row 1 -- whose use at
    # step 3 becomes a miss that waits for that write-back (labelled 1, later than the window's
    # default 3 - 2 - 1 = 0). Step 3 then makes room for it by writing back row 3, retained after
    # step 2 with row 4 (the lower slot first).
    seq = [[1], [2], [3, 4], [1]]
    o = LookaheadOracle(num_rows=10, cache_rows=2, lookahead=2, retain=True)
    plans = run(o, seq)
    assert plans[2].evict_before_rows.tolist() == [2, 1]
    assert plans[3].evict_before_rows.tolist() == [3]
    assert (o.stats.retained_evictions, o.stats.forced_evictions) == (2, 1)
    assert plans[3].fetch_rows.tolist() == [1] and plans[3].fetch_after == 1
    simulate(plans, 2, 2, 10)


@settings(max_examples=150, deadline=None)
@given(seq=batches_strategy, L=st.integers(1, 10), extra=st.integers(0, 30))
def test_retaining_oracle_random_sequences_are_exact_and_hit_at_least_as_often_as_expiry(seq, L, extra):
    C = max(len(set(b)) for b in seq) + extra
    o = LookaheadOracle(num_rows=41, cache_rows=C, lookahead=L, retain=True)
    plans = run(o, seq)
    assert len(plans) == len(seq)
    simulate(plans, C, L, 41)
    assert o.occupied <= C and o._queued <= 2 * C + max(len(b) for b in seq)
    expiry = LookaheadOracle(num_rows=41, cache_rows=C, lookahead=L)
    expiry_plans = run(expiry, seq)
    if o.stats.forced_evictions == 0 and expiry.stats.forced_evictions == 0:
        assert sum(p.hits for p in plans) >= sum(p.hits for p in expiry_plans)
        assert o.stats.rows_written_back <= expiry.stats.rows_written_back
