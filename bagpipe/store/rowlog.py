"""Where a packed row's latest value lies: its home slot, or a slot of the store's row log.

With the frequency layout (:mod:`bagpipe.store.layout`) the K rows a job uses most sit at
the front of ``rows.f32``, and under a memory limit the pages of those rows stay in the
page cache -- but every row written back in place dirties its own page, so the store's
dirty-page bound writes the same hot pages to the device again and again: measured under
``bench scale``'s 1 GiB group, 1,372 pages (5.4 MiB) a step for about 930 rows and 12.4 ms
of the write-back thread's kernel CPU (docs/pipeline.md). A packed row written back is
therefore *appended* to a ring of E slots behind the table (the row log): the rows of a
write fill whole pages in one ``pwrite`` (8 rows of 512 bytes, 60 of 68 bytes a page),
and a row's home slot is written only when the ring comes round to its log slot while
that slot still holds the row's latest value (it was not written back again in a whole
turn of the ring).

The ring is cut in ``SEGMENTS`` segments. Before a write takes slots of a segment, the
segment is *prepared*: its live rows (their latest value is there) are copied home, and
if the index last made durable (``log.i32``, written by the store's flush after the
rows' values are durable) still names a slot of the segment, the store flushes first.
So the durable index never names a slot that was overwritten after it was written, and
a crash between flushes reads every row as of the last flush (or later), never another
row's value.

Invariants (tested against a dict in tests/unit/store/test_rowlog.py):

* ``at[i] = p >= 0`` means packed row i's latest value is at log position p, and then
  ``held[p] == i``; ``at[i] = -1``: at its home slot i.
* a position is handed out only from a prepared segment, so it holds no live row and the
  durable index does not name it.

Memory: 4 bytes a packed row for ``at``, 4 for its durable copy, 4 a log slot for ``held``
(E = K rounded up to whole segments, at least ``SEGMENTS * MIN_SEGMENT_SLOTS``).
"""

from __future__ import annotations

import numpy as np

SEGMENTS = 8  # the ring's segments: a turn of the ring prepares (and may flush) this many times
IN_DOUBT = -2  # a durable entry a failed flush may or may not have written
MIN_SEGMENT_SLOTS = 4096  # a few packed rows still get segments of whole pages (a flush per 4,096 rows at most)


def log_slots(num_packed: int) -> int:
    """E, the log's slots for K packed rows: K rounded up to whole segments of at least
    ``MIN_SEGMENT_SLOTS``; 0 without packed rows."""
    if num_packed <= 0:
        return 0
    return SEGMENTS * max(MIN_SEGMENT_SLOTS, -(-num_packed // SEGMENTS))


class RowLog:
    """The index of a store's row log (bookkeeping only: the store does the I/O).

    Args:
        num_packed: K, the packed rows (home slots 0..K-1).
        capacity: E, slots of the ring (a multiple of ``SEGMENTS``).
        at: (K,) the durable index to start from (``log.i32`` as read: -1 = home), or None.
    """

    def __init__(self, num_packed: int, capacity: int, at: np.ndarray | None = None):
        if capacity <= 0 or capacity % SEGMENTS:
            raise ValueError(f"RowLog: capacity must be a positive multiple of {SEGMENTS}, got {capacity}")
        self.k = int(num_packed)
        self.capacity = int(capacity)
        self.segment = self.capacity // SEGMENTS
        self.at = np.full(self.k, -1, dtype=np.int32) if at is None else np.array(at, dtype=np.int32)
        if self.at.shape != (self.k,):
            raise ValueError(f"RowLog: the index has {self.at.size} entries, expected {self.k}")
        bad = (self.at < -1) | (self.at >= self.capacity)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"RowLog: packed row {i} is at log slot {int(self.at[i])}, outside [0, {self.capacity})")
        self.held = np.full(self.capacity, -1, dtype=np.int32)
        logged = np.flatnonzero(self.at >= 0)
        if len(np.unique(self.at[logged])) != len(logged):
            raise ValueError("RowLog: two packed rows at one log slot")
        self.held[self.at[logged]] = logged
        self.durable = self.at.copy()
        self.doubt = False  # a flush of the index failed: see in_doubt
        self.head = 0  # the next position handed out (counts up; the slot is head % capacity)
        self.ready = 0  # positions [head, ready) are prepared (at open: none, the index may name any)

    # ------------------------------------------------------------------ reads

    def redirect(self, slots: np.ndarray, base: int) -> np.ndarray:
        """``slots`` (n,) int64 of the layout with every packed row whose latest value is in
        the log replaced by its log slot ``base + p`` (a new array)."""
        out = np.array(slots, dtype=np.int64)
        packed = np.flatnonzero(out < self.k)
        if len(packed):
            p = self.at[out[packed]]
            logged = p >= 0
            out[packed[logged]] = base + p[logged].astype(np.int64)
        return out

    # ------------------------------------------------------------------ writes

    def take(self, n: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """``n`` positions for a write (ascending slots of the ring, wrapping at most once
        per turn) and the segments ``[a, b)`` (ring slots) to prepare, in order, before any
        of them is written, each followed by :meth:`prepared`. Nothing changes until then:
        a write that fails before :meth:`commit` leaves the ring as it was (a segment
        prepared stays prepared)."""
        if n > self.capacity:
            raise ValueError(f"RowLog.take: {n} rows, more than the log's {self.capacity} slots")
        todo: list[tuple[int, int]] = []
        ready = self.ready
        while ready < self.head + n:
            a = ready % self.capacity
            todo.append((a, a + self.segment))
            ready += self.segment
        pos = (self.head + np.arange(n, dtype=np.int64)) % self.capacity
        return pos, todo

    def prepared(self) -> None:
        """The next segment :meth:`take` named is prepared: its slots may be handed out."""
        self.ready += self.segment

    def live_in(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, positions): the packed rows whose latest value is at a position in [a, b)."""
        pos = np.arange(a, b, dtype=np.int64)
        rows = self.held[a:b]
        has = rows >= 0
        pos, rows = pos[has], rows[has].astype(np.int64)
        live = self.at[rows] == pos
        return rows[live], pos[live]

    def send_home(self, rows: np.ndarray) -> None:
        """Rows whose values were just copied home: read from home from now on."""
        self.at[rows] = -1

    def durably_named(self, a: int, b: int) -> bool:
        """Whether the durable index names a position in [a, b): the segment may not be
        overwritten before a flush. True while a failed flush left entries in doubt."""
        if self.doubt:
            return True
        rows = self.held[a:b]
        has = rows >= 0
        return bool(np.any(self.durable[rows[has]] == np.arange(a, b, dtype=np.int32)[has]))

    def commit(self, rows: np.ndarray, pos: np.ndarray) -> None:
        """Rows ``rows`` (packed) were written at the positions ``pos`` :meth:`take` gave:
        read from there; the ring's head moves past them."""
        self.at[rows] = pos
        self.held[pos] = rows
        self.head += len(pos)

    # ------------------------------------------------------------------ durability

    def snapshot(self) -> np.ndarray:
        """The index now (taken before a flush makes the rows' values durable)."""
        return self.at.copy()

    def in_doubt(self, changed: np.ndarray) -> None:
        """Entries ``changed`` are being written to the index file: until :meth:`made_durable`,
        the file may hold the old or the new one. They differ from any snapshot (so the next
        flush writes them again), and every segment counts as named by the durable index."""
        self.durable[changed] = IN_DOUBT
        self.doubt = True

    def made_durable(self, snap: np.ndarray, changed: np.ndarray) -> None:
        """``snap`` is on disk now; ``changed``: its entries :meth:`changed` named (the
        others the durable index held already)."""
        self.durable[changed] = snap[changed]
        self.doubt = False

    def changed(self, snap: np.ndarray) -> np.ndarray:
        """Entries of ``snap`` that the durable index does not hold yet."""
        return np.flatnonzero(snap != self.durable)

    def logged(self) -> int:
        """Packed rows whose latest value is in the log now."""
        return int(np.count_nonzero(self.at >= 0))
