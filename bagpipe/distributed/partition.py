"""A global plan split into N trainers' plans: the logically replicated, physically
partitioned cache.

The oracle plans one cache of C slots for the *global* batch. Every trainer keeps a
(C, D) tensor with the same slot layout (logically replicated), but holds only the
rows it needs (physically partitioned). Trainer i trains on samples
``[i*B/N, (i+1)*B/N)`` of each global batch. For a step's unique rows:

* **synchronised rows** -- used by more than one trainer this step, or staying cached
  after it (any trainer may use them next): every trainer holds them, their gradients
  are summed over the trainers (each already divided by N, so averaged like DDP), and
  every trainer applies the same optimizer update, so the copies stay equal;
* **local rows** -- used by one trainer only and expiring after this step: only that
  trainer fetches them, updates them with its own gradient and writes them back;
  nobody synchronises them.

Write-backs: an expiring synchronised row is written back by its lowest-ranked user,
a row forced out before a step (always a synchronised row) by trainer ``row % N``;
the other trainers only free the slot (``drop_*_slots``).

Synchronised rows the next step uses, or that leave the cache now, are *urgent*: they
are consistent before the iteration ends. The others (staying cached, next used two
or more steps later) may be synchronised while the next step computes, as long as it
completes before they are used, written back or their slot reused.

``replicated=True`` makes every row synchronised (every trainer holds every planned
row): the baseline the partitioned cache is measured against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bagpipe.data.batch import Batch, select_samples
from bagpipe.errors import ConfigError
from bagpipe.oracle.plan import Plan
from bagpipe.oracle.unique import unique_inverse

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class TrainerPlan(Plan):
    """A trainer's part of a global plan (see the module docstring).

    Extra attributes:
        sync_slots: (K,) slots of the step's synchronised rows; the same list, in the same
            order, on every trainer: first the ``sync_urgent`` rows the next step uses or
            that leave the cache after this one, then the rest (ascending row in each part),
            whose synchronisation may overlap the next step's compute.
        sync_pos: (U_i,) for each of this trainer's unique rows, its index in
            ``sync_slots``, or -1 for a local row.
        num_trainers: N.
        replicated_sync_rows: K had every planned row been synchronised.

    The owner-based exchange (``--cache-sync owner``, :mod:`bagpipe.distributed.exchange`)
    fills the rest instead of ``sync_*``; counts are (2N,): the urgent half's N per-peer
    counts, then the deferred half's; position and slot lists follow the same order
    (urgent then deferred, by peer rank within each, ascending rows within a peer):
        own_pos: positions in ``rows`` of the rows this trainer owns (sums and updates),
            the first ``own_urgent`` of them urgent.
        red_send_pos / red_send_counts: positions in ``rows`` whose gradients go to each owner.
        red_recv_pos / red_recv_counts: positions in ``rows`` (owned rows) of the gradients
            received from each user.
        dlv_send_slots / dlv_send_counts: slots whose weights and state go to each trainer
            that uses the row next; dlv_recv_slots / dlv_recv_counts: slots to install the
            rows received from each trainer into.
        exchange_rows: (4,) rows moved by every trainer together: gradients urgent,
            deferred, rows delivered urgent, deferred (the same on every trainer: a zero
            means nobody takes part in that collective).
    """

    sync_slots: np.ndarray = field(default_factory=lambda: _EMPTY)
    sync_urgent: int = 0
    sync_pos: np.ndarray = field(default_factory=lambda: _EMPTY)
    num_trainers: int = 1
    replicated_sync_rows: int = 0
    own_pos: np.ndarray = field(default_factory=lambda: _EMPTY)
    own_urgent: int = 0
    red_send_pos: np.ndarray = field(default_factory=lambda: _EMPTY)
    red_send_counts: np.ndarray = field(default_factory=lambda: _EMPTY)
    red_recv_pos: np.ndarray = field(default_factory=lambda: _EMPTY)
    red_recv_counts: np.ndarray = field(default_factory=lambda: _EMPTY)
    dlv_send_slots: np.ndarray = field(default_factory=lambda: _EMPTY)
    dlv_send_counts: np.ndarray = field(default_factory=lambda: _EMPTY)
    dlv_recv_slots: np.ndarray = field(default_factory=lambda: _EMPTY)
    dlv_recv_counts: np.ndarray = field(default_factory=lambda: _EMPTY)
    exchange_rows: np.ndarray = field(default_factory=lambda: _EMPTY)


def slice_batch(batch: Batch, a: int, b: int) -> tuple[Batch, np.ndarray]:
    """Samples [a, b) of ``batch`` -> (sub-batch, positions of its lookups in ``batch.rows``)."""
    return select_samples(batch, np.arange(a, b, dtype=np.int64))


def _positions(sorted_rows: np.ndarray, subset: np.ndarray) -> np.ndarray:
    return np.searchsorted(sorted_rows, subset)


@dataclass
class TrainerSlice:
    """Trainer i's part of a global batch: its samples ``[i*B/N, (i+1)*B/N)``."""

    batch: Batch
    upos: np.ndarray  # (U_i,) ascending positions in the global plan's rows of the rows it uses
    inverse: np.ndarray  # (L_i,) int64: each of its lookups' index into its rows


def trainer_slices(plan: Plan, num_trainers: int) -> list[TrainerSlice]:
    """Every trainer's samples of ``plan``'s batch and the rows each uses (a ConfigError
    when the batch does not split evenly)."""
    N, B = int(num_trainers), plan.batch.batch_size
    if B % N:
        raise ConfigError(f"the global batch of {B} samples does not split evenly over {N} trainers")
    b = B // N
    out = []
    for i in range(N):
        sub, pos = slice_batch(plan.batch, i * b, (i + 1) * b)
        upos, inverse = unique_inverse(plan.inverse[pos])  # ascending positions = ascending rows
        out.append(TrainerSlice(sub, upos, inverse.astype(np.int64, copy=False)))
    return out


def common_fields(
    plan: Plan, part: TrainerSlice, fetch: np.ndarray, forced: np.ndarray, leaves: np.ndarray, drops: np.ndarray
) -> dict:
    """The fields of a :class:`TrainerPlan` every split fills alike, from masks over the
    plan's rows (``fetch``: this trainer fetches them; ``leaves``: it writes them back after
    the step; ``drops``: it only frees their slots after it) and over its forced evictions
    (``forced``: this trainer writes them back before the step, the others drop them)."""
    return dict(
        step=plan.step,
        batch=part.batch,
        rows=plan.rows[part.upos],
        slots=plan.slots[part.upos],
        inverse=part.inverse,
        fetch_rows=plan.rows[fetch],
        fetch_slots=plan.slots[fetch],
        evict_before_rows=plan.evict_before_rows[forced],
        evict_before_slots=plan.evict_before_slots[forced],
        evict_after_rows=plan.rows[leaves],
        evict_after_slots=plan.slots[leaves],
        fetch_after=plan.fetch_after,
        drop_before_slots=plan.evict_before_slots[~forced],
        drop_after_slots=plan.slots[drops],
        replicated_sync_rows=len(plan.rows),
    )


def partition(plan: Plan, num_trainers: int, *, replicated: bool = False) -> list[TrainerPlan]:
    """Split a global ``plan`` into ``num_trainers`` trainers' plans."""
    N = int(num_trainers)
    slices = trainer_slices(plan, N)
    U = len(plan.rows)
    users = np.zeros(U, dtype=np.int64)
    first_user = np.full(U, N, dtype=np.int64)
    for i, part in enumerate(slices):
        users[part.upos] += 1
        first_user[part.upos] = np.minimum(first_user[part.upos], i)
    expiring = np.zeros(U, dtype=bool)
    expiring[_positions(plan.rows, plan.evict_after_rows)] = True
    missing = np.zeros(U, dtype=bool)
    missing[_positions(plan.rows, plan.fetch_rows)] = True
    sync = np.ones(U, dtype=bool) if replicated else (users > 1) | ~expiring
    # urgent: needed by the next step or leaving now; the rest may finish during the next step
    if len(plan.next_use) == U:
        urgent = sync & ((plan.next_use == plan.step + 1) | expiring)
    else:
        urgent = sync
    deferred = sync & ~urgent
    order = np.concatenate([np.flatnonzero(urgent), np.flatnonzero(deferred)])
    sync_index = np.full(U, -1, dtype=np.int64)
    sync_index[order] = np.arange(len(order), dtype=np.int64)
    sync_slots = plan.slots[order]
    forced_writer = plan.evict_before_rows % N
    out = []
    for i, part in enumerate(slices):
        mine = sync | (first_user == i)  # rows this trainer holds during the step
        # every expiring row leaves every trainer's cache; a hit that only another trainer
        # used still sits in this one's copy of the slot and must not be written back from here
        fields = common_fields(
            plan,
            part,
            fetch=missing & mine,
            forced=forced_writer == i,
            leaves=expiring & (first_user == i),
            drops=expiring & (first_user != i),
        )
        out.append(
            TrainerPlan(
                **fields,
                sync_slots=sync_slots,
                sync_pos=sync_index[part.upos],
                sync_urgent=int(urgent.sum()),
                num_trainers=N,
            )
        )
    return out
