"""The partitioned cache: a global plan split into trainers' plans (no processes).

Proves on a hand-built sequence the exact per-trainer fetches, synchronised rows and
write-backs; and on random sequences (hypothesis) that replaying every trainer's plans
on its own copy of the slot table (fetch, use, update, write back, drop) never uses a
row that is not in the slot, never leaves a row behind at the end, writes every
expiring row back exactly once, and synchronises exactly the rows that more than one
trainer uses or that stay cached. Also checks batch slicing on multi-hot bags.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bagpipe.data.batch import Batch
from bagpipe.distributed.partition import partition, slice_batch
from bagpipe.errors import ConfigError
from bagpipe.oracle import LookaheadOracle

pytestmark = pytest.mark.unit


def one_feature_batch(rows: list[int]) -> Batch:
    n = len(rows)
    return Batch(
        labels=torch.arange(n, dtype=torch.float32),
        dense=torch.zeros(n, 1),
        rows=torch.tensor(rows, dtype=torch.int64),
        offsets=torch.arange(n + 1, dtype=torch.int64),
        num_features=1,
    )


def global_plans(seq, cache_rows, lookahead, num_rows=64):
    o = LookaheadOracle(num_rows=num_rows, cache_rows=cache_rows, lookahead=lookahead)
    return list(o.plans((i, one_feature_batch(r)) for i, r in enumerate(seq)))


def test_hand_sequence_two_trainers():
    # samples 0-1 go to trainer 0, samples 2-3 to trainer 1
    seq = [[1, 2, 2, 3], [4, 4, 1, 5], [1, 6, 7, 7]]
    gp = global_plans(seq, cache_rows=8, lookahead=2)
    p = [partition(g, 2) for g in gp]
    # step 0: row 1 stays cached (used at steps 1, 2): synchronised though only trainer 0 uses it;
    # row 2 is used by both trainers: synchronised; row 3 is trainer 1's alone and expires: local
    s0 = p[0]
    assert s0[0].rows.tolist() == [1, 2] and s0[1].rows.tolist() == [2, 3]
    assert sorted(gp[0].slots[np.searchsorted(gp[0].rows, [1, 2])].tolist()) == sorted(s0[0].sync_slots.tolist())
    assert s0[0].sync_pos.tolist() == [0, 1] and s0[1].sync_pos.tolist() == [1, -1]
    assert s0[0].fetch_rows.tolist() == [1, 2] and s0[1].fetch_rows.tolist() == [1, 2, 3]
    # expiring: rows 2 (both use it: lowest rank writes) and 3 (trainer 1's own)
    assert s0[0].evict_after_rows.tolist() == [2] and s0[1].evict_after_rows.tolist() == [3]
    assert len(s0[1].drop_after_slots) == 1 and len(s0[0].drop_after_slots) == 1
    # step 1: row 4 only on trainer 0 and expiring: local, no sync; row 1 a hit on trainer 1, stays cached
    s1 = p[1]
    assert s1[0].rows.tolist() == [4] and s1[0].sync_pos.tolist() == [-1]
    assert s1[1].rows.tolist() == [1, 5] and s1[1].fetch_rows.tolist() == [5]
    assert len(s1[0].sync_slots) == 1  # row 1
    # step 2 (the last): everything expires; row 1 is trainer 0's alone now: local, it writes it back
    s2 = p[2]
    assert s2[0].rows.tolist() == [1, 6] and s2[0].sync_pos.tolist() == [-1, -1]
    assert s2[0].evict_after_rows.tolist() == [1, 6] and s2[1].evict_after_rows.tolist() == [7]
    assert len(s2[0].sync_slots) == 0
    # trainer 1 held row 1 (synchronised at steps 0 and 1): it must free the slot without writing
    slot1 = int(gp[2].slots[0])
    assert slot1 in s2[1].drop_after_slots.tolist()


def test_replicated_synchronises_and_fetches_everything():
    seq = [[1, 2, 2, 3], [4, 4, 1, 5]]
    for g in global_plans(seq, cache_rows=8, lookahead=2):
        parts = partition(g, 2, replicated=True)
        for t in parts:
            assert len(t.sync_slots) == len(g.rows)
            assert t.fetch_rows.tolist() == g.fetch_rows.tolist()
            assert (t.sync_pos >= 0).all()


def test_uneven_split_is_an_error():
    g = global_plans([[1, 2, 3]], cache_rows=4, lookahead=1)[0]
    with pytest.raises(ConfigError, match="does not split evenly"):
        partition(g, 2)


def test_slice_batch_multihot():
    # F=2, B=3; bags: f0: [1], [2, 3], []   f1: [4], [5], [6, 7, 8]
    b = Batch(
        labels=torch.tensor([0.0, 1.0, 0.0]),
        dense=torch.arange(6, dtype=torch.float32).view(3, 2),
        rows=torch.tensor([1, 2, 3, 4, 5, 6, 7, 8]),
        offsets=torch.tensor([0, 1, 3, 3, 4, 5, 8]),
        num_features=2,
    )
    sub, pos = slice_batch(b, 1, 3)
    assert sub.rows.tolist() == [2, 3, 5, 6, 7, 8]
    assert pos.tolist() == [1, 2, 4, 5, 6, 7]
    assert sub.offsets.tolist() == [0, 2, 2, 3, 6]
    assert sub.labels.tolist() == [1.0, 0.0] and sub.dense.tolist() == [[2.0, 3.0], [4.0, 5.0]]


def replay(seq, N, cache_rows, lookahead, replicated=False):
    """Run every trainer's plans on its own slot table; returns per-row write-back counts."""
    gp = global_plans(seq, cache_rows, lookahead)
    slots = [np.full(cache_rows, -1, np.int64) for _ in range(N)]
    written: dict[int, int] = {}
    for g in gp:
        parts = partition(g, N, replicated=replicated)
        # the sync list is the same on every trainer
        assert all(np.array_equal(parts[0].sync_slots, t.sync_slots) for t in parts)
        for i, t in enumerate(parts):
            for r in t.evict_before_rows.tolist():
                written[r] = written.get(r, 0) + 1
            for s, r in zip(t.evict_before_slots, t.evict_before_rows):
                assert slots[i][s] == r
            slots[i][t.evict_before_slots] = -1
            slots[i][t.drop_before_slots] = -1
            assert (slots[i][t.fetch_slots] == -1).all(), "a fetch lands on an occupied slot"
            slots[i][t.fetch_slots] = t.fetch_rows
        # every row a trainer uses is in its slot; every synchronised row is on every trainer
        for i, t in enumerate(parts):
            assert np.array_equal(slots[i][t.slots], t.rows)
            held = slots[i][parts[0].sync_slots]
            assert (held >= 0).all()
        # synchronised = used by >1 trainer or staying cached (partitioned); all (replicated)
        users = np.zeros(len(g.rows), int)
        for t in parts:
            users[np.searchsorted(g.rows, t.rows)] += 1
        stays = ~np.isin(g.rows, g.evict_after_rows)
        want = np.ones(len(g.rows), bool) if replicated else (users > 1) | stays
        assert sorted(parts[0].sync_slots.tolist()) == sorted(g.slots[want].tolist())
        # deferred rows (after the urgent ones) stay cached and are not used by the next step
        K1 = parts[0].sync_urgent
        deferred = parts[0].sync_slots[K1:]
        pos = {int(sl): j for j, sl in enumerate(g.slots)}
        for sl in deferred.tolist():
            j = pos[sl]
            assert stays[j] and g.next_use[j] > g.step + 1
        for sl in parts[0].sync_slots[:K1].tolist():
            j = pos[sl]
            assert not stays[j] or g.next_use[j] == g.step + 1
        for i, t in enumerate(parts):
            for r in t.evict_after_rows.tolist():
                written[r] = written.get(r, 0) + 1
            slots[i][t.evict_after_slots] = -1
            slots[i][t.drop_after_slots] = -1
    for i in range(N):
        assert (slots[i] == -1).all(), "rows left in a trainer's cache at the end"
    fetched = sum(len(g.fetch_rows) for g in gp)
    assert sum(written.values()) == fetched  # every fetch is written back exactly once
    return written


@settings(max_examples=80, deadline=None)
@given(
    seq=st.lists(st.lists(st.integers(0, 40), min_size=4, max_size=4), min_size=1, max_size=12),
    N=st.sampled_from([1, 2, 4]),
    extra=st.integers(0, 12),
    L=st.integers(1, 5),
    replicated=st.booleans(),
)
def test_replay_random_sequences(seq, N, extra, L, replicated):
    cache_rows = max(len(set(b)) for b in seq) + extra
    replay(seq, N, cache_rows, L, replicated)
