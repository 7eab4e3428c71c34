"""The lookahead oracle (BagPipe's Oracle Cacher, made exact under a fixed capacity).

It reads the batch stream L batches ahead of the step it plans. For step x it knows,
for every unique row of the batch, whether the row is used again in (x, x+L]; rows
that are keep their slot, the others are written back right after x. A row's slot is
handed to a later fetch only after its write-back is ordered before that fetch
(``Plan.fetch_after``), so no read is ever stale. When the window's working set does
not fit the C slots, rows are forced out before the step by furthest next use
(Belady) and counted in ``stats.forced_evictions``.

With ``retain`` (one trainer's oracle), a row whose window holds no further use keeps its
slot instead of leaving: the row map says which slot (an entry of -(s + 2)), so a later use
is a hit, and the row is written back only when a miss needs its slot -- first the retained
rows that no batch read so far uses again, least recently used first (their next use lies
beyond the window, so Belady cannot tell them apart), then Belady among the rest. Expiry
writes every fetched row back within L steps of its last use: on the default ``bench
modes`` 3,373 rows a step, where LRU with the same C wrote none (docs/pipeline.md).

State: a map from row to the sequence number of its latest occurrence, plus ring
arrays over the *occurrences* (unique rows per batch) of the 2L+1 batches around the
current step. The map is one int32 per table row (modulo 2^31) when that costs at most
:data:`DENSE_MAP_BYTES`, and otherwise (:class:`WindowMap`: a 188M-row table would need
750 MB) a sorted array of the rows seen in the window, pruned as the window moves, so the
oracle's memory grows with the window, not the table. Both give the same plans: a
candidate from the map is only believed when the ring still holds that occurrence of
that row. Every operation is vectorised over a batch; no Python loop runs per id.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

from bagpipe.data.batch import Batch
from bagpipe.errors import CapacityError, ConfigError
from bagpipe.oracle.plan import Plan, PlanStats
from bagpipe.oracle.unique import read_latest, unique_inverse, unique_inverse_in

_WRAP = np.int64(1 << 31)
_WRAP_MASK = _WRAP - 1
_RING_START = 1 << 14  # occurrences the ring holds before the first batch sizes it
#: Largest per-row map (4 bytes a row) the oracle allocates; larger tables get a WindowMap.
DENSE_MAP_BYTES = 256 << 20
#: A row map entry of -(s + 2) (<= -2) says: the row is retained in slot s (``retain``).
_RETAINED_BASE = -2
_RETAINED = -2  # slot_seq of a slot whose row is retained past its window


class DenseMap:
    """Row -> sequence number of its latest occurrence (modulo 2^31; -1: none), one int32 per row."""

    def __init__(self, num_rows: int):
        self.latest = np.full(num_rows, -1, dtype=np.int32)

    def get(self, rows: np.ndarray) -> np.ndarray:
        return self.latest.take(rows).astype(np.int64)

    def set(self, rows: np.ndarray, seqs: np.ndarray, lo: int) -> None:
        self.latest[rows] = (seqs % _WRAP).astype(np.int32)

    def mark(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Store raw entries (-1: none, <= -2: a retained row's slot) for ``rows``."""
        self.latest[rows] = values.astype(np.int32)

    @property
    def nbytes(self) -> int:
        return self.latest.nbytes


class WindowMap:
    """The same map for the rows of the live window only: sorted rows and their latest
    sequence numbers; entries older than the window's first occurrence are dropped once
    they are half of the map. Memory: ~16 bytes per occurrence in the window."""

    def __init__(self):
        self.rows = np.zeros(0, dtype=np.int64)
        self.seqs = np.zeros(0, dtype=np.int64)

    def get(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` ascending and unique -> their latest sequence numbers (-1: none)."""
        if not len(self.rows):
            return np.full(len(rows), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.rows, rows), len(self.rows) - 1)
        return np.where(self.rows[pos] == rows, self.seqs[pos], -1)

    def set(self, rows: np.ndarray, seqs: np.ndarray, lo: int) -> None:
        """Record ``rows`` (ascending, unique) at ``seqs``; ``lo`` is the window's first
        live occurrence (older entries can go)."""
        self.mark(rows, seqs)
        live = (self.seqs >= lo) | (self.seqs <= _RETAINED_BASE)  # a retained row's entry outlives the window
        if 2 * int(np.count_nonzero(live)) < len(live):
            self.rows, self.seqs = self.rows[live], self.seqs[live]

    def mark(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Store raw entries for ``rows`` (ascending, unique): sequence numbers, -1 (none) or
        <= -2 (a retained row's slot)."""
        pos = np.searchsorted(self.rows, rows)
        have = pos < len(self.rows)
        have[have] = self.rows[pos[have]] == rows[have]
        self.seqs[pos[have]] = values[have]
        new = ~have
        if new.any():
            self.rows = np.insert(self.rows, pos[new], rows[new])
            self.seqs = np.insert(self.seqs, pos[new], values[new])

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes + self.seqs.nbytes


def too_small(cache_rows: int, step: int, unique: int, enough: int | None) -> str:
    """The message of a cache too small for a batch: the batch's unique rows are what this
    step needs (a floor, not a size that is enough for the run), with a size that is enough
    for every batch of the run when the caller knows one (a bound, not a minimum).
    ``step`` is the planner's 0-based index; the message numbers steps from 1, as a run's
    progress lines do."""
    hint = f" ({enough:,} cache rows are enough for any batch of this run)" if enough and enough >= unique else ""
    return (
        f"a cache of {cache_rows:,} row{'' if cache_rows == 1 else 's'} cannot hold step {step + 1}'s {unique:,} unique rows; "
        f"it needs at least {unique:,}{hint}"
    )


class LookaheadOracle:
    """Plans every fetch, slot and write-back of a cache of ``cache_rows`` slots.

    Args:
        num_rows: rows in the global row space (all tables).
        cache_rows: C, slots in the trainer's cache.
        lookahead: L >= 1, batches looked ahead.
        enough: a cache size that holds every batch of the run (for the hint of a too-small cache).
        fast: find a batch's unique rows with the dense row map as scratch space (no sort of
            the N lookups, :meth:`unique_inverse`); False sorts them, the reference: the
            plans are the same either way.
        retain: keep a row whose window holds no further use in its slot until a miss needs
            the slot (then write it back, least recently used first), instead of writing it
            back right after its last use in the window (BagPipe's expiry, the default). With
            a free slot for every such row a retained row is a hit where expiry fetches it
            again, and it is written back once per stay instead of once per window: fewer
            fetches and write-backs, the same values. One trainer's oracle retains
            (:class:`~bagpipe.cache.setup.CacheSetup`); a data-parallel job's expires, since a
            row that stays cached on N trainers must be synchronised after every update.
    """

    def __init__(
        self,
        num_rows: int,
        cache_rows: int,
        lookahead: int,
        enough: int | None = None,
        *,
        fast: bool = True,
        retain: bool = False,
    ):
        if lookahead < 1:
            raise ConfigError(f"lookahead must be >= 1, got {lookahead}")
        if cache_rows < 1:
            raise ConfigError(f"cache_rows must be >= 1, got {cache_rows}")
        self.num_rows = int(num_rows)
        self.C = int(cache_rows)
        self.L = int(lookahead)
        self.fast = fast
        self.latest = DenseMap(self.num_rows) if 4 * self.num_rows <= DENSE_MAP_BYTES else WindowMap()
        self._alloc_ring(_RING_START)
        self.lo = 0  # oldest live occurrence sequence number
        self.hi = 0  # next sequence number
        self.steps_live: deque[tuple[int, int]] = deque()  # (step, first seq) of retained steps
        self.free = np.arange(self.C - 1, -1, -1, dtype=np.int64)  # stack; top = free[n_free-1]
        self.n_free = self.C
        self.slot_seq = np.full(self.C, -1, dtype=np.int64)  # occurrence holding each slot (_RETAINED: see below)
        self.retain = retain
        if retain:  # a retained slot's row and the step of its last use
            self.slot_row = np.full(self.C, -1, dtype=np.int64)
            self.slot_used = np.zeros(self.C, dtype=np.int32)
        self._deps: dict[int, int] = {}  # occurrence -> label its fetch waits for (a pinned row forced out)
        self.retained: deque[tuple[int, np.ndarray]] = deque()  # (step, slots) retained then, oldest first
        self._queued = 0  # slots listed in ``retained`` (at most 2C: compacted past that)
        self.stats = PlanStats()
        self.enough = enough  # a cache size that holds every batch of the run (for the error's hint)

    # ring of occurrences -------------------------------------------------------------
    def _alloc_ring(self, cap: int) -> None:
        # np.empty: an entry is only read once [lo, hi) covers it, and _read writes every
        # field of an occurrence before that
        self.cap = cap
        self.mask = cap - 1  # cap is a power of two: seq & mask is the ring index
        self.ent_row = np.empty(cap, np.int64)
        self.ent_prev = np.empty(cap, np.int64)  # seq of the row's previous occurrence
        self.ent_next = np.empty(cap, np.int32)  # step of the row's next use (-1: none read yet)
        self.ent_slot = np.empty(cap, np.int32)  # slot held after this step, -1 none
        self.ent_evict = np.empty(cap, np.int32)  # write-back label when it left its slot

    def _ring(self) -> tuple[np.ndarray, ...]:
        return self.ent_row, self.ent_prev, self.ent_next, self.ent_slot, self.ent_evict

    def _ensure(self, extra: int) -> None:
        need = self.hi + extra - self.lo
        if need <= self.cap:
            return
        new_cap = self.cap
        while new_cap < need + need // 8:  # the window's size settles after 2L+1 steps: little headroom
            new_cap *= 2
        old = self._ring()
        old_span = self._span(self.lo, self.hi - self.lo)
        self._alloc_ring(new_cap)
        new_span = self._span(self.lo, self.hi - self.lo)
        for new, o in zip(self._ring(), old):
            new[new_span] = o[old_span]

    def _span(self, start: int, n: int):
        """Ring positions of the occurrences [start, start+n): a slice unless it wraps.

        Slices make the per-step reads and writes of the ring plain memory copies
        instead of fancy-index gathers and scatters.
        """
        a = start & self.mask
        if a + n <= self.cap:
            return slice(a, a + n)
        return np.arange(start, start + n, dtype=np.int64) & self.mask

    # reading ------------------------------------------------------------------------
    def _read(self, step: int, batch: Batch) -> tuple[int, int, np.ndarray]:
        rows = batch.rows.numpy()
        if self.fast and isinstance(self.latest, DenseMap):  # the map's get and set fused into the unique
            uniq, inverse, v = read_latest(self.latest.latest, rows, self.hi)
            return self._link(step, uniq, v, inverse)
        uniq, inverse = self.unique_inverse(rows)
        v = self.latest.get(uniq)
        self.latest.set(uniq, np.arange(self.hi, self.hi + len(uniq), dtype=np.int64), self.lo)
        return self._link(step, uniq, v, inverse)

    def unique_inverse(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sorted unique rows, inverse) of a batch's lookups ``rows`` (N,): with the row map
        as scratch space when it is dense and ``fast`` (:func:`unique_inverse_in`), else by
        sorting them (:func:`unique_inverse`). A hot tier in front of the oracle uses it too."""
        if self.fast and isinstance(self.latest, DenseMap):
            return unique_inverse_in(self.latest.latest, rows)
        uniq, inverse = unique_inverse(rows)
        return uniq, inverse.astype(np.int64, copy=False)

    def _link(self, step: int, uniq: np.ndarray, v: np.ndarray, inverse: np.ndarray) -> tuple[int, int, np.ndarray]:
        """Append step's occurrences ``uniq`` (U,) to the ring at sequence numbers hi..,
        linked to their previous occurrences: ``v`` (U,) the map's candidates for them."""
        start, n = self.hi, len(uniq)
        if self.hi == 0 and self.cap == _RING_START:
            # the window settles at 2L+1 batches' occurrences: size the ring for that once
            # (as the memory estimate does) instead of doubling and copying it on the way
            want = (2 * self.L + 1) * n * 9 // 8
            if want > self.cap:
                self._alloc_ring(1 << (want - 1).bit_length())
        self._ensure(n)
        idx = self._span(start, n)
        # the candidate sequence number of the previous occurrence: the one in [lo, lo + 2^31)
        # that is v modulo 2^31 (& as % for a power of two)
        full = self.lo + ((v - self.lo) & _WRAP_MASK)
        ok = (v >= 0) & (full < self.hi) & (self.ent_row.take(full & self.mask) == uniq)
        if self.retain:  # a row retained in slot s (map entry -(s + 2)) links to it; the map moves on,
            prev = np.where(ok, full, np.minimum(v, -1))  # which pins the slot (:meth:`_pinned`)
        else:
            prev = np.where(ok, full, -1)
        self.ent_next[full[ok] & self.mask] = step
        self.ent_row[idx] = uniq
        self.ent_prev[idx] = prev
        self.ent_next[idx] = -1
        self.ent_slot[idx] = -1
        self.ent_evict[idx] = -1
        self.hi += n
        self.steps_live.append((step, start))
        return start, n, inverse

    # planning -----------------------------------------------------------------------
    def _push_free(self, slots: np.ndarray) -> None:
        k = len(slots)
        self.free[self.n_free : self.n_free + k] = slots
        self.n_free += k

    def _plan(self, step: int, batch: Batch, start: int, n: int, inverse: np.ndarray) -> Plan:
        mask, L = self.mask, self.L
        seqs = np.arange(start, start + n, dtype=np.int64)
        idx = self._span(start, n)
        rows = self.ent_row[idx].copy()
        prev = self.ent_prev[idx]
        pv = prev >= self.lo
        slots = np.where(pv, self.ent_slot.take(prev & mask), -1).astype(np.int64)
        if self.retain:  # a row in the slot it was retained in
            kept = prev <= _RETAINED_BASE
            slots[kept] = _RETAINED_BASE - prev[kept]
        hit = slots >= 0
        # hits move their slot from the previous occurrence to this one
        self.ent_slot[prev[hit & pv] & mask] = -1
        self.slot_seq[slots[hit]] = seqs[hit]
        miss = ~hit
        m = int(miss.sum())
        ev_b_rows = ev_b_slots = np.zeros(0, np.int64)
        if m > self.n_free:
            ev_b_rows, ev_b_slots = self._make_room(step, m - self.n_free, slots[hit], n, start + n)
        new = self.free[self.n_free - m : self.n_free][::-1].copy()
        self.n_free -= m
        slots[miss] = new
        self.slot_seq[new] = seqs[miss]
        self.ent_slot[idx] = slots
        fetch_after = step - L - 1
        dep = miss & pv
        if dep.any():
            fetch_after = max(fetch_after, int(self.ent_evict[prev[dep] & mask].max()))
        if self._deps:  # a pinned retained row forced out before this step (_force_out)
            for q in [q for q in self._deps if start <= q < start + n]:
                fetch_after = max(fetch_after, self._deps.pop(q))
        # rows not used again within the window leave after this step (or, retained, stay)
        ev = self.ent_next[idx] < 0
        ev_pos = seqs[ev] & mask
        self.ent_slot[ev_pos] = -1
        self.ent_evict[ev_pos] = step
        if self.retain:
            self._keep(step, rows[ev], slots[ev])
            ev = np.zeros(n, dtype=bool)
        ev_a_slots = slots[ev]
        self.slot_seq[ev_a_slots] = -1
        self._push_free(ev_a_slots)
        plan = Plan(
            step=step,
            batch=batch,
            rows=rows,
            slots=slots,
            inverse=inverse,
            fetch_rows=rows[miss],
            fetch_slots=slots[miss],
            evict_before_rows=ev_b_rows,
            evict_before_slots=ev_b_slots,
            evict_after_rows=rows[ev],
            evict_after_slots=ev_a_slots,
            fetch_after=fetch_after,
            next_use=self.ent_next[idx].astype(np.int64),
        )
        self.stats.add(plan, self.C - self.n_free + len(ev_a_slots))
        # occurrences of steps <= step - L + 0 can no longer be a hit's previous use
        while self.steps_live and self.steps_live[0][0] <= step - L:
            self.steps_live.popleft()
        self.lo = self.steps_live[0][1] if self.steps_live else self.hi
        return plan

    # retaining rows past their window (retain) -------------------------------------
    def _keep(self, step: int, rows: np.ndarray, slots: np.ndarray) -> None:
        """Rows (ascending) whose window holds no further use keep their ``slots`` after ``step``."""
        if not len(rows):
            return
        self.slot_seq[slots] = _RETAINED
        self.slot_row[slots] = rows
        self.slot_used[slots] = step
        self.latest.mark(rows, _RETAINED_BASE - slots)
        self.retained.append((step, slots.astype(np.int32)))
        self._queued += len(slots)
        if self._queued > 2 * self.C:  # drop the entries of rows that left since (hit again, evicted)
            live = [(u, sl[(self.slot_seq[sl] == _RETAINED) & (self.slot_used[sl] == u)]) for u, sl in self.retained]
            self.retained = deque((u, sl) for u, sl in live if len(sl))
            self._queued = sum(len(sl) for _, sl in self.retained)

    def _make_room(self, step: int, k: int, hit_slots: np.ndarray, n: int, after: int) -> tuple[np.ndarray, np.ndarray]:
        """Free k slots: retained rows no batch read so far uses again, least recently used
        first (their next use is beyond the window), then by furthest next use (:meth:`_force_out`)."""
        if not self.retain:
            return self._force_out(step, k, hit_slots, n, after)
        parts: list[np.ndarray] = []
        got = 0
        while got < k and self.retained:
            used, sl = self.retained[0]
            # still retained since then, and no use read since (a pinned one leaves this queue:
            # its use, already read, takes it out of the retained rows)
            live = sl[(self.slot_seq[sl] == _RETAINED) & (self.slot_used[sl] == used)]
            live = live[~self._pinned(live)]
            take = live[: k - got]
            self._queued -= len(sl)
            if len(take) == len(live):
                self.retained.popleft()
            else:
                self.retained[0] = (used, live[len(take) :])
                self._queued += len(live) - len(take)
            parts.append(take)
            got += len(take)
        victims = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        rows = self.slot_row[victims]
        if len(victims):
            order = np.argsort(rows)
            rows, victims = rows[order], victims[order]
            self.latest.mark(rows, np.full(len(rows), -1, np.int64))
            self.slot_seq[victims] = -1
            self._push_free(victims)
            self.stats.retained_evictions += len(victims)
        if got < k:
            frows, fslots = self._force_out(step, k - got, hit_slots, n, after)
            rows, victims = np.concatenate([rows, frows]), np.concatenate([victims, fslots])
        return rows, victims

    def _pinned(self, slots: np.ndarray) -> np.ndarray:
        """Which retained ``slots`` a batch read since uses again: the row map no longer holds
        their mark (reading the row moved its entry on to that use)."""
        mark = _RETAINED_BASE - slots.astype(np.int64)
        return self.latest.get(self.slot_row[slots]) != mark

    def _uses_read(self, after: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The occurrences read but not planned (sequence numbers >= ``after``) that use a retained
        row: (their sequence numbers, the slots they link to, their steps). At most one a slot."""
        span = self._span(after, self.hi - after)
        prev = self.ent_prev[span]
        pos = np.flatnonzero(prev <= _RETAINED_BASE)
        seqs = after + pos
        starts = np.array([first for _, first in self.steps_live], dtype=np.int64)
        steps = np.array([st for st, _ in self.steps_live], dtype=np.int64)
        return seqs, _RETAINED_BASE - prev[pos], steps[np.searchsorted(starts, seqs, side="right") - 1]

    def _force_out(self, step: int, k: int, hit_slots: np.ndarray, n: int, after: int) -> tuple[np.ndarray, np.ndarray]:
        """Free k slots by evicting the cached rows used furthest in the future (Belady):
        rows of the window and retained rows whose next use was read already (by the
        occurrences from sequence number ``after`` on, which are not planned yet)."""
        mask = self.slot_seq >= 0
        use_seqs = use_slots = np.zeros(0, np.int64)
        if self.retain:  # (rare: the unpinned retained rows did not free enough)
            use_seqs, use_slots, use_steps = self._uses_read(after)
            mask[use_slots] = True
        mask[hit_slots] = False
        cand = np.flatnonzero(mask)
        if len(cand) < k:
            raise CapacityError(too_small(self.C, step, n, self.enough))
        seq = self.slot_seq[cand]
        nxt = self.ent_next[seq & self.mask]
        if self.retain and len(use_slots):
            at = np.full(self.C, -1, np.int64)
            at[use_slots] = use_steps
            nxt = np.where(seq == _RETAINED, at[cand], nxt)
        if k < len(cand):
            # stable ordering on (next use desc, slot asc) so plans are reproducible
            order = np.lexsort((cand, -nxt))[:k]
            victims = cand[order]
        else:
            victims = cand
        seq = self.slot_seq[victims]
        held = seq >= 0
        vidx = seq[held] & self.mask
        rows = np.empty(len(victims), np.int64)
        rows[held] = self.ent_row[vidx]
        self.ent_slot[vidx] = -1
        self.ent_evict[vidx] = step - 1
        if not held.all():  # retained rows pinned by a use already read: that use becomes a miss
            pinned = victims[~held]
            rows[~held] = self.slot_row[pinned]
            where = np.full(self.C, -1, np.int64)
            where[use_slots] = use_seqs
            for q in where[pinned].tolist():
                self.ent_prev[q & self.mask] = -1
                self._deps[q] = step - 1  # its fetch waits for this write-back
        self.slot_seq[victims] = -1
        self._push_free(victims)
        self.stats.forced_evictions += k
        return rows, victims.astype(np.int64)

    def plans(self, batches: Iterable[tuple[int, Batch]]) -> Iterator[Plan]:
        """Plans for ``(step, batch)`` pairs given in step order."""
        buffer: deque = deque()
        for step, batch in batches:
            t0 = time.perf_counter()
            buffer.append((step, batch) + self._read(step, batch))
            plan = self._plan(*buffer.popleft()) if len(buffer) > self.L else None
            self.stats.seconds += time.perf_counter() - t0
            self.stats.state_mb = max(self.stats.state_mb, self.state_bytes / 2**20)
            if plan is not None:
                yield plan
        while buffer:
            t0 = time.perf_counter()
            plan = self._plan(*buffer.popleft())
            self.stats.seconds += time.perf_counter() - t0
            yield plan

    @property
    def state_bytes(self) -> int:
        """Memory of the oracle's state: the row map, the occurrence ring, the free-slot stack."""
        arrays = (*self._ring(), self.free, self.slot_seq)
        if self.retain:
            arrays += (self.slot_row, self.slot_used)
        queued = sum(sl.nbytes for _, sl in self.retained)
        return self.latest.nbytes + sum(a.nbytes for a in arrays) + queued

    @property
    def occupied(self) -> int:
        return self.C - self.n_free
