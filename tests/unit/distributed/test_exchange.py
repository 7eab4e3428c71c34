"""The owner-based row exchange's plans (``--cache-sync owner``), replayed without processes.

Every trainer's plans are run on its own copy of the slot table, each copy carrying the
version of the row it holds; the all-to-alls are replayed from the plans' counts and
positions exactly as ``all_to_all_single`` moves them. On random sequences (hypothesis,
1-4 trainers, small caches, both with and without retained rows) this proves that every
row a trainer uses is in its slot at the latest version (fetched, kept, or delivered in
time: a deferred half lands only after the next step ran), that an owner receives the
gradient of every other user of its rows from exactly those users, that every row leaves
the cache written back once by a trainer holding its latest version, that a flush at
any step (each trainer writing the rows its ``slot_rows`` marks) writes every cached row
exactly once and fresh, and that the deferred half never touches a slot the next step
frees. A hand-built sequence pins the owner choice and the bytes saved against the ring.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_partition import global_plans, one_feature_batch

from bagpipe.distributed.exchange import OwnerPartitioner, pick_owner
from bagpipe.distributed.partition import TrainerPlan
from bagpipe.oracle import LookaheadOracle

pytestmark = pytest.mark.unit


def owner_plans(gplans, N: int) -> list[list[TrainerPlan]]:
    part = OwnerPartitioner(N)
    out = []
    for g in gplans:
        out.extend(part.push(g))
    out.extend(part.finish())
    assert [p[0].step for p in out] == [g.step for g in gplans]
    return out


def blocks(values: np.ndarray, counts: np.ndarray, part: int, N: int) -> list[np.ndarray]:
    """The N per-peer blocks of half ``part`` (0 urgent, 1 deferred) of a concatenated list."""
    c = counts.astype(np.int64)
    start = int(c[:N].sum()) if part else 0
    out = []
    for j in range(N):
        n = int(c[part * N + j])
        out.append(values[start : start + n])
        start += n
    return out


@dataclass
class Trainer:
    slots: np.ndarray  # slot -> row held (-1: none), the bookkeeping (slot_rows)
    version: dict = field(default_factory=dict)  # slot -> (row, version) of the copy in it


class Replay:
    """Every trainer's plans on its own slot table, rows carrying versions."""

    def __init__(self, N: int, cache_rows: int):
        self.N = N
        self.t = [Trainer(np.full(cache_rows, -1, np.int64)) for _ in range(N)]
        self.truth: dict[int, int] = {}  # row -> its latest version (one per update)
        self.server: dict[int, int] = {}  # row -> version written back
        self.pending: list[TrainerPlan] | None = None
        self.written = 0

    def fresh(self, i: int, slot: int, row: int) -> bool:
        return self.t[i].version.get(slot) == (row, self.truth.get(row, 0))

    def write(self, i: int, slot: int, row: int) -> None:
        assert self.fresh(i, slot, row), f"trainer {i} writes back a stale row {row}"
        self.server[row] = self.truth.get(row, 0)
        self.written += 1

    def reduce(self, parts: list[TrainerPlan], half: int) -> None:
        """Replay the gradients' all-to-all; each owner must get every other user's gradient."""
        N = self.N
        sent = [blocks(p.red_send_pos, p.red_send_counts, half, N) for p in parts]
        for o, p in enumerate(parts):
            got = blocks(p.red_recv_pos, p.red_recv_counts, half, N)
            for j in range(N):
                # what j sends o, as rows, equals what o expects from j, in the same order
                assert np.array_equal(parts[j].rows[sent[j][o]], p.rows[got[j]])
            own = p.own_pos[: p.own_urgent] if half == 0 else p.own_pos[p.own_urgent :]
            contributors = {int(r): {o} for r in p.rows[own]}
            for j in range(N):
                for r in p.rows[got[j]].tolist():
                    contributors[r].add(j)
            for r, who in contributors.items():
                users = {j for j, q in enumerate(parts) if r in set(q.rows.tolist())}
                assert who == users, f"row {r}: owner {o} summed {who}, its users are {users}"

    def update(self, parts: list[TrainerPlan], half: int) -> None:
        for i, p in enumerate(parts):
            own = p.own_pos[: p.own_urgent] if half == 0 else p.own_pos[p.own_urgent :]
            for r, s in zip(p.rows[own].tolist(), p.slots[own].tolist()):
                self.t[i].version[s] = (r, self.truth[r])
                self.t[i].slots[s] = r  # the owner writes the row back from now on

    def deliver(self, parts: list[TrainerPlan], half: int) -> None:
        N = self.N
        for i, p in enumerate(parts):
            out = blocks(p.dlv_send_slots, p.dlv_send_counts, half, N)
            for j in range(N):
                got = blocks(parts[j].dlv_recv_slots, parts[j].dlv_recv_counts, half, N)[i]
                assert np.array_equal(out[j], got)
                for s in out[j].tolist():
                    row, v = self.t[i].version[s]
                    assert v == self.truth[row], f"trainer {i} delivers a stale row {row}"
                    self.t[j].version[s] = (row, v)

    def finish(self) -> None:
        if self.pending is not None:
            self.reduce(self.pending, 1)
            self.update(self.pending, 1)
            self.deliver(self.pending, 1)
            self.pending = None

    def step(self, parts: list[TrainerPlan]) -> None:
        N = self.N
        assert all(np.array_equal(p.exchange_rows, parts[0].exchange_rows) for p in parts)
        if self.pending is not None:  # the deferred half never touches what this step frees
            touched = set()
            for p in self.pending:
                own = p.own_pos[p.own_urgent :]
                touched |= set(p.slots[own].tolist())
                c = int(p.dlv_send_counts[:N].sum())
                touched |= set(p.dlv_send_slots[c:].tolist())
                c = int(p.dlv_recv_counts[:N].sum())
                touched |= set(p.dlv_recv_slots[c:].tolist())
            for p in parts:
                assert not touched & (set(p.evict_before_slots.tolist()) | set(p.drop_before_slots.tolist()))
        for i, p in enumerate(parts):
            for s, r in zip(p.evict_before_slots.tolist(), p.evict_before_rows.tolist()):
                assert self.t[i].slots[s] == r
                self.write(i, s, r)
            self.t[i].slots[p.evict_before_slots] = -1
            self.t[i].slots[p.drop_before_slots] = -1
            for s, r in zip(p.fetch_slots.tolist(), p.fetch_rows.tolist()):
                assert self.server.get(r, 0) == self.truth.get(r, 0), f"a stale read of row {r}"
                self.t[i].slots[s] = r
                self.t[i].version[s] = (r, self.truth.get(r, 0))
        for i, p in enumerate(parts):  # forward: every row in its slot, at its latest version
            for r, s in zip(p.rows.tolist(), p.slots.tolist()):
                assert self.fresh(i, s, r), f"step {p.step}: trainer {i} uses a stale row {r}"
        # apply: the previous deferred half, then this step's urgent half
        self.finish()
        for r in set().union(*(set(p.rows.tolist()) for p in parts)):
            self.truth[r] = self.truth.get(r, 0) + 1
        self.reduce(parts, 0)
        self.update(parts, 0)
        self.deliver(parts, 0)
        self.pending = parts
        for i, p in enumerate(parts):  # after the step: expired rows go back, stale copies read as free
            for s, r in zip(p.evict_after_slots.tolist(), p.evict_after_rows.tolist()):
                self.write(i, s, r)
            self.t[i].slots[p.evict_after_slots] = -1
            self.t[i].slots[p.drop_after_slots] = -1

    def flush(self, cached: dict[int, int], final: bool = False) -> None:
        """Every trainer writes the rows its slot table marks: each cached row once, fresh
        (``final``: the run's end, where the rows leave the cache; else they stay)."""
        self.finish()
        seen: dict[int, int] = {}
        for i, tr in enumerate(self.t):
            for s in np.flatnonzero(tr.slots >= 0).tolist():
                r = int(tr.slots[s])
                assert cached.get(s) == r, f"trainer {i} marks slot {s} (row {r}) the cache does not hold"
                assert self.fresh(i, s, r), f"trainer {i} would flush a stale row {r}"
                seen[r] = seen.get(r, 0) + 1
                self.server[r] = self.truth.get(r, 0)
                self.written += final
        assert sorted(seen) == sorted(cached.values()) and set(seen.values()) <= {1}


def replay_owner(seq, N, cache_rows, lookahead, flush_at=None, retain=False):
    o = LookaheadOracle(num_rows=64, cache_rows=cache_rows, lookahead=lookahead, retain=retain)
    gplans = list(o.plans((i, one_feature_batch(r)) for i, r in enumerate(seq)))
    rp = Replay(N, cache_rows)
    cached: dict[int, int] = {}  # slot -> row of the global plan
    for g, parts in zip(gplans, owner_plans(gplans, N)):
        for s in g.evict_before_slots.tolist():
            cached.pop(s)
        cached.update(zip(g.fetch_slots.tolist(), g.fetch_rows.tolist()))
        rp.step(parts)
        for s in g.evict_after_slots.tolist():
            cached.pop(s)
        if flush_at is not None and g.step == flush_at:
            rp.flush(cached)
    rp.flush(cached, final=True)
    assert retain or not cached  # expiry leaves nothing cached at the end; retained rows go at the flush
    # every row the global plans bring in goes back exactly once (each of its users fetched it)
    assert rp.written == sum(len(g.fetch_rows) for g in gplans)
    for r, v in rp.truth.items():
        assert rp.server[r] == v
    return rp


@settings(max_examples=120, deadline=None)
@given(
    seq=st.lists(st.lists(st.integers(0, 30), min_size=12, max_size=12), min_size=1, max_size=14),
    N=st.sampled_from([1, 2, 3, 4]),
    cache_rows=st.integers(12, 30),
    lookahead=st.integers(1, 5),
    flush_at=st.integers(0, 13),
    retain=st.booleans(),
)
def test_every_use_sees_the_latest_row_and_every_row_goes_back_once(seq, N, cache_rows, lookahead, flush_at, retain):
    replay_owner(seq, N, cache_rows, lookahead, flush_at, retain)


def test_one_trainer_moves_nothing():
    seq = [[1, 2, 2, 3], [4, 4, 1, 5], [1, 6, 7, 7]]
    for parts in owner_plans(global_plans(seq, cache_rows=8, lookahead=2), 1):
        (p,) = parts
        assert p.exchange_rows.tolist() == [0, 0, 0, 0]
        assert sorted(p.own_pos.tolist()) == list(range(len(p.rows)))  # it updates every row it uses


def test_hand_sequence_owner_and_deliveries():
    # two trainers, samples 0-1 on trainer 0 and 2-3 on trainer 1
    seq = [[1, 2, 2, 3], [4, 4, 1, 5], [1, 6, 7, 7]]
    gp = global_plans(seq, cache_rows=8, lookahead=2)
    s0, s1, s2 = owner_plans(gp, 2)
    # step 0: row 2 is used by both: one gradient goes to its owner; row 1 (trainer 0's) is
    # used next by trainer 1 (step 1): trainer 0 owns it and delivers it at once
    assert s0[0].rows.tolist() == [1, 2] and s0[1].rows.tolist() == [2, 3]
    assert s0[0].exchange_rows.tolist() == [1, 0, 1, 0]  # row 2 expires: its reduce is urgent
    assert s0[1].dlv_recv_slots.tolist() == [gp[0].slots[0]] and s0[0].dlv_send_counts.tolist() == [0, 1, 0, 0]
    # step 1: row 1 used by trainer 1 only, next by trainer 0 (step 2): trainer 1 delivers it
    assert s1[1].rows.tolist() == [1, 5] and s1[1].dlv_send_counts[:2].tolist() == [1, 0]
    # a stale copy reads as free: trainer 0 wrote row 1 until step 1 made trainer 1 its owner
    assert gp[1].slots[gp[1].rows.tolist().index(1)] in s1[0].drop_after_slots.tolist()
    assert s2[0].exchange_rows.tolist() == [0, 0, 0, 0]


def test_pick_owner_spreads_rows_over_their_users():
    rows = np.arange(8, dtype=np.int64)
    both = np.full(8, 0b11, dtype=np.uint64)
    assert pick_owner(both, rows, 2).tolist() == [0, 1] * 4
    assert pick_owner(np.full(8, 0b100, dtype=np.uint64), rows, 3).tolist() == [2] * 8


def test_fewer_transfers_than_the_ring():
    """On a skewed stream over 4 trainers the exchange moves fewer rows than the ring's 2 (N - 1) per synced row."""
    rng = np.random.default_rng(0)
    seq = (rng.zipf(1.3, size=(30, 64)) % 400).tolist()
    gp = global_plans(seq, cache_rows=300, lookahead=5, num_rows=400)
    moved = sum(int(p[0].exchange_rows.sum()) for p in owner_plans(gp, 4))
    from bagpipe.distributed.partition import partition

    ring = sum(2 * 3 * len(partition(g, 4)[0].sync_slots) for g in gp)
    assert 0 < moved < ring / 2
