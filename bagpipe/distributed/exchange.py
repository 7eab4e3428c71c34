"""The owner-based row exchange (``--cache-sync owner``): a global plan split into N
trainers' plans where each of a step's rows has ONE owning trainer.

The partitioned cache (:mod:`bagpipe.distributed.partition`) keeps every row that stays
cached, or that several trainers used, equal on every trainer: one ring all-reduce of
the union of the step's rows, each row crossing the links 2 (N - 1) times, although a
row has a few users and one next user. Here copies may be stale, and the oracle, which
knows the next two steps' splits, plans who must hold which row fresh:

* **reduce**: every user of a row that several trainers used this step sends its
  gradient (already divided by N) to the row's owner, one of its users; the owner sums
  the contributions in trainer order and applies the row-wise optimizer (a one-user row
  is updated by its user alone, as before);
* **deliver**: the trainers that use a cached row at its next step and do not hold it
  fresh receive its weights and optimizer state from the trainer that does (the owner
  of its last update, its *writer*).

So after every round a cached row is fresh on its writer and on the trainers of its
next use; everybody else's copy of that slot is stale and never read: a trainer uses a
row only at a step where it is a user, and every user either fetched it from its
server or holds it fresh. The writer writes the row back when it leaves the cache (its
expiry after its last use, or a forced eviction) and at a checkpoint's or an
evaluation's flush; a trainer's ``slot_rows`` marks exactly the rows it writes.

Urgency: the rows the next step uses, that expire now, or that are forced out before the
next step are reduced, updated and delivered before the step ends; the others are
reduced while the next step computes and updated (and their rows delivered to the
trainers of the step after) once it has run backward. Deliveries for a step ``t`` come
in round ``t - 1`` (the row was updated at ``t - 1``) or in round ``t - 2``'s deferred
half; so the planner holds two plans back, the price of knowing who uses a row next.

The sums are those of one process on the global batch up to float rounding (trainer
order, as the ring all-reduce's are in its own order), so the exact modes stay exact
within tolerance; with N = 1 nothing moves and the run is bitwise ``--mode full``'s.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from bagpipe.distributed.partition import TrainerPlan, TrainerSlice, common_fields, trainer_slices
from bagpipe.errors import BagpipeError, ConfigError
from bagpipe.oracle.plan import Plan

_ONE = np.uint64(1)


@dataclass
class _Split:
    """A global plan and who uses which of its rows."""

    plan: Plan
    users: np.ndarray  # (U,) uint64: bit i set when trainer i uses the row
    parts: list[TrainerSlice]  # per trainer: its samples and the rows it uses


def split_users(plan: Plan, num_trainers: int) -> _Split:
    """Trainer i's samples ``[i*B/N, (i+1)*B/N)`` of ``plan``'s batch, the rows each uses,
    and each row's users as a bit mask."""
    parts = trainer_slices(plan, num_trainers)
    users = np.zeros(len(plan.rows), dtype=np.uint64)
    for i, part in enumerate(parts):
        users[part.upos] |= _ONE << np.uint64(i)
    return _Split(plan, users, parts)


def _has(mask: np.ndarray, i: int) -> np.ndarray:
    return ((mask >> np.uint64(i)) & _ONE).astype(bool)


def _count(mask: np.ndarray, N: int) -> np.ndarray:
    return sum((_has(mask, i).astype(np.int64) for i in range(N)), np.zeros(len(mask), dtype=np.int64))


def _users_at(rows: np.ndarray, later: _Split | None) -> np.ndarray:
    """(len(rows),) uint64: who uses each of ``rows`` at ``later``'s step (0: nobody)."""
    out = np.zeros(len(rows), dtype=np.uint64)
    if later is None or len(rows) == 0 or len(later.plan.rows) == 0:
        return out
    at = np.searchsorted(later.plan.rows, rows)
    ok = at < len(later.plan.rows)
    ok[ok] = later.plan.rows[at[ok]] == rows[ok]
    out[ok] = later.users[at[ok]]
    return out


def pick_owner(candidates: np.ndarray, rows: np.ndarray, N: int) -> np.ndarray:
    """(U,) the owner of each row: one of its ``candidates`` (a nonzero bitmask), the
    ``row % count``-th, which spreads the owners (and their traffic) over the trainers."""
    bits = np.stack([_has(candidates, i) for i in range(N)], axis=1)  # (U, N)
    count = bits.sum(axis=1)
    if len(rows) and int(count.min()) == 0:
        raise BagpipeError("bug: a row of the step has no user")
    k = rows % np.maximum(count, 1)
    return np.argmax(np.cumsum(bits, axis=1) > k[:, None], axis=1).astype(np.int64)


@dataclass
class _Deliveries:
    """Rows of a later step that some of their users do not hold fresh after this round."""

    slots: np.ndarray  # (H,) their slots
    source: np.ndarray  # (H,) the trainer that sends each (holds it fresh)
    receivers: np.ndarray  # (H,) uint64 bitmask of the trainers that receive it
    now: np.ndarray  # (H,) position in this step's rows, -1 for a row not used this step


class OwnerPartitioner:
    """Splits global plans into trainers' plans for the owner-based exchange (see the module).

    Feed it the global plans in step order (:meth:`push`); it returns each step's N plans
    once it has seen the two steps after it, and the rest at :meth:`finish`. It tracks,
    per cache slot, which trainers hold the row fresh and which one writes it back.
    """

    def __init__(self, num_trainers: int):
        if not 1 <= num_trainers <= 64:
            raise ConfigError(f"--cache-sync owner supports 1 to 64 trainers, got {num_trainers}")
        self.N = int(num_trainers)
        self.holders = np.zeros(0, dtype=np.uint64)  # per slot: who holds its row fresh
        self.writer = np.zeros(0, dtype=np.int64)  # per slot: who writes its row back (-1: empty)
        self._window: deque[_Split] = deque()
        self.partitioned_sync_rows = 0  # what the partitioned cache would all-reduce (for the summary)

    def push(self, plan: Plan) -> list[list[TrainerPlan]]:
        self._window.append(split_users(plan, self.N))
        out = []
        while len(self._window) >= 3:
            out.append(self._emit(self._window[0], self._window[1], self._window[2]))
            self._window.popleft()
        return out

    def finish(self) -> list[list[TrainerPlan]]:
        out = []
        while self._window:
            later: list[_Split | None] = [*list(self._window)[1:], None, None]
            out.append(self._emit(self._window[0], later[0], later[1]))
            self._window.popleft()
        return out

    # ------------------------------------------------------------------ one round
    def _room(self, slots: np.ndarray) -> None:
        need = int(slots.max()) + 1 if len(slots) else 0
        if need > len(self.writer):
            grow = max(need, 2 * len(self.writer))
            self.holders = np.concatenate([self.holders, np.zeros(grow - len(self.holders), dtype=np.uint64)])
            self.writer = np.concatenate([self.writer, np.full(grow - len(self.writer), -1, dtype=np.int64)])

    def _deliveries(
        self, later: _Split | None, rows: np.ndarray, owner: np.ndarray, skip: _Split | None
    ) -> _Deliveries:
        """The rows hit at ``later``'s step (and not used at ``skip``'s) whose users there do
        not all hold them fresh once this round's rows (``rows``, owned by ``owner``) are updated."""
        empty = np.zeros(0, dtype=np.int64)
        if later is None:
            return _Deliveries(empty, empty, np.zeros(0, dtype=np.uint64), empty)
        lp = later.plan
        hit = ~np.isin(lp.rows, lp.fetch_rows)
        if skip is not None:
            hit &= _users_at(lp.rows, skip) == 0
        hrows, hslots, husers = lp.rows[hit], lp.slots[hit], later.users[hit]
        self._room(hslots)
        now = np.searchsorted(rows, hrows) if len(rows) else np.zeros(len(hrows), dtype=np.int64)
        used = now < len(rows)
        used[used] = rows[now[used]] == hrows[used]
        now = np.where(used, now, -1)
        fresh = np.where(used, _ONE << owner[np.maximum(now, 0)].astype(np.uint64), self.holders[hslots])
        source = np.where(used, owner[np.maximum(now, 0)], self.writer[hslots])
        receivers = husers & ~fresh
        moving = receivers != 0
        if bool((source[moving] < 0).any()):
            raise BagpipeError(f"bug: step {lp.step} hits a cached row nobody holds")
        return _Deliveries(hslots[moving], source[moving], receivers[moving], now[moving])

    def _emit(self, cur: _Split, nxt: _Split | None, nxt2: _Split | None) -> list[TrainerPlan]:
        P, N = cur.plan, self.N
        rows, slots, U = P.rows, P.slots, len(P.rows)
        self._room(slots)
        self._room(P.evict_before_slots)
        # rows forced out before this step: their writer writes them back, the others free the slot
        eb_writer = self.writer[P.evict_before_slots]
        if bool((eb_writer < 0).any()):
            raise BagpipeError(f"bug: step {P.step} forces out a row nobody holds")
        self.holders[P.evict_before_slots] = 0
        self.writer[P.evict_before_slots] = -1

        m = cur.users
        m1, m2 = _users_at(rows, nxt), _users_at(rows, nxt2)
        cand = m & m1  # an owner that uses the row next saves a delivery
        cand = np.where(cand == 0, m & m2, cand)
        cand = np.where(cand == 0, m, cand)
        owner = pick_owner(cand, rows, N)
        expiring = np.zeros(U, dtype=bool)
        expiring[np.searchsorted(rows, P.evict_after_rows)] = True
        forced_next = np.isin(rows, nxt.plan.evict_before_rows) if nxt is not None else np.zeros(U, dtype=bool)
        urgent = (m1 != 0) | expiring | forced_next
        users = _count(m, N)
        multi = users > 1
        self.partitioned_sync_rows += int((multi | ~expiring).sum())
        writer_before = self.writer[slots].copy()

        d_now = self._deliveries(nxt, rows, owner, None)
        d_later = self._deliveries(nxt2, rows, owner, nxt)
        # the new holders: the owner of each row of this step, plus who receives it
        fresh = _ONE << owner.astype(np.uint64)
        for d in (d_now, d_later):
            used = d.now >= 0
            np.bitwise_or.at(fresh, d.now[used], d.receivers[used])
            self.holders[d.slots[~used]] |= d.receivers[~used]
        self.holders[slots] = fresh
        self.writer[slots] = owner
        self.holders[slots[expiring]] = 0
        self.writer[slots[expiring]] = -1
        totals = np.array(
            [
                int((users[multi & urgent] - 1).sum()),
                int((users[multi & ~urgent] - 1).sum()),
                int(_count(d_now.receivers, N).sum()),
                int(_count(d_later.receivers, N).sum()),
            ],
            dtype=np.int64,
        )
        missing = np.zeros(U, dtype=bool)
        missing[np.searchsorted(rows, P.fetch_rows)] = True
        lists = _exchange_lists(cur.users, owner, multi, urgent, (d_now, d_later), N)
        return [
            self._trainer_plan(i, cur, owner, expiring, missing, writer_before, eb_writer, lists, totals)
            for i in range(N)
        ]

    def _trainer_plan(self, i, cur, owner, expiring, missing, writer_before, eb_writer, lists, totals):
        P, N = cur.plan, self.N
        part = cur.parts[i]
        upos = part.upos
        mine = np.zeros(len(P.rows), dtype=bool)
        mine[upos] = True

        def at(pos: np.ndarray) -> np.ndarray:  # positions in the step's rows -> in this trainer's rows
            return np.searchsorted(upos, pos)

        red_send, red_recv, own, dlv_send, dlv_recv = (lst.of(i) for lst in lists)
        owned = owner == i
        # this trainer's copies that go stale (it used them and does not own them), and rows
        # it wrote back until now that another trainer owns from here: their slots read as free
        stale = (mine & ~owned) | ((writer_before == i) & ~owned)
        ev_mine = expiring & owned
        fields = common_fields(
            P, part, fetch=missing & mine, forced=eb_writer == i, leaves=ev_mine, drops=stale & ~ev_mine
        )
        return TrainerPlan(
            **fields,
            num_trainers=N,
            own_pos=at(own[0]),
            own_urgent=int(own[1][:N].sum()),
            red_send_pos=at(red_send[0]),
            red_send_counts=red_send[1],
            red_recv_pos=at(red_recv[0]),
            red_recv_counts=red_recv[1],
            dlv_send_slots=dlv_send[0],
            dlv_send_counts=dlv_send[1],
            dlv_recv_slots=dlv_recv[0],
            dlv_recv_counts=dlv_recv[1],
            exchange_rows=totals,
        )


@dataclass
class _PerTrainer:
    """Items grouped by trainer (sorted by it), each with its (half, peer) key in 0..2N."""

    trainer: np.ndarray  # (K,) sorted
    values: np.ndarray  # (K,)
    key: np.ndarray  # (K,) half * N + peer
    N: int

    def of(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Trainer ``i``'s values (in order) and its (2N,) counts per (half, peer)."""
        a, b = np.searchsorted(self.trainer, [i, i + 1])
        return self.values[a:b], np.bincount(self.key[a:b], minlength=2 * self.N).astype(np.int64)


def _grouped(trainer, half, peer, order_last, values, N) -> _PerTrainer:
    """Sort items by (trainer, half, peer, ``order_last``): the order both ends of a message list their rows in."""
    span = int(order_last.max()) + 1 if len(order_last) else 1
    o = np.argsort(((trainer * 2 + half) * N + peer) * span + order_last)  # one int64 key: a single sort
    return _PerTrainer(trainer[o], values[o], half[o] * N + peer[o], N)


def _exchange_lists(users, owner, multi, urgent, deliveries, N) -> list[_PerTrainer]:
    """Every trainer's lists of one round at once (time O(pairs log pairs), not O(N^2 U)):
    gradients sent (by sender: half, owner, row), received (by owner: half, sender, row),
    rows owned (by owner: half, row; ``peer`` 0), rows delivered sent (by source: part,
    receiver, row) and received (by receiver: part, source, row)."""
    U = len(owner)
    bits = np.stack([_has(users, j) for j in range(N)], axis=1) if U else np.zeros((0, N), dtype=bool)
    row, user = np.nonzero(bits & multi[:, None])
    keep = user != owner[row]
    row, user = row[keep], user[keep]
    half = (~urgent[row]).astype(np.int64)
    dest = owner[row]
    red_send = _grouped(user, half, dest, row, row, N)
    red_recv = _grouped(dest, half, user, row, row, N)
    all_rows = np.arange(U, dtype=np.int64)
    own = _grouped(owner, (~urgent).astype(np.int64), np.zeros(U, dtype=np.int64), all_rows, all_rows, N)
    parts = []
    for part, d in enumerate(deliveries):
        dbits = np.stack([_has(d.receivers, j) for j in range(N)], axis=1) if len(d.slots) else np.zeros((0, N), bool)
        h, to = np.nonzero(dbits)
        parts.append((np.full(len(h), part, dtype=np.int64), h, to, d.source[h], d.slots[h]))
    p, h, to, src, slot = (np.concatenate(x) for x in zip(*parts))
    dlv_send = _grouped(src, p, to, h, slot, N)
    dlv_recv = _grouped(to, p, src, h, slot, N)
    return [red_send, red_recv, own, dlv_send, dlv_recv]
