"""A store on disk for tables larger than RAM.

Layout of the directory ``path`` (format version 2, and 3 with a row layout)::

    header.json   shape, dtype, seed and format version of the store (written last,
                  atomically)
    rows.f32      slots x (D + S) float32, row-major: slot s holds a row's D weights
                  followed by its S optimizer-state values, at byte offset
                  s * 4 * (D + S); row g is at slot g in version 2 (the identity layout)
    present.u8    one byte per row: 0 = never written (reads give the initial value
                  and zero state), 1 = rows.f32 holds the row; set by ``flush`` only
                  after the rows' values are durable
    layout.i64    (format version 3 only) the K rows packed at the front of rows.f32,
                  hottest first (:mod:`bagpipe.store.layout`): row g is then at slot
                  i if it is the i-th of them, else at slot K + g, and rows.f32 holds
                  num_rows + K slots; version 2 is the identity layout (slot g)
    log.i32       (version 3, with ``layout.log_slots`` = E > 0 in the header) the row
                  log's index: for each packed row i, p + 1 if its latest value is at
                  slot num_rows + K + p of rows.f32 (the E slots of the log behind the
                  table, :mod:`bagpipe.store.rowlog`), 0 if at its home slot i; written
                  by ``flush`` only after the values it names are durable. A version-3
                  store made before the log (no ``log_slots``) writes in place

A row's weights and state sit side by side, so a cold read of a row costs one page
fault, not one per file (version 1 kept them in ``weights.f32`` and ``state.f32``,
two random page faults per row with S > 0; a version-1 store is refused at open).
Rows are not page-aligned: a row of 4c bytes straddles a 4 KiB page boundary with
probability (c - 1) / 1024 (D + S = 17: 16 rows in 1024, ~1.6%), and only those rows
cost two faults.

Every file is created sparse (``ftruncate``), so a billion-row table costs no disk
until rows are written. A write through a map into a hole of a full file system is a
SIGBUS, not an error, so rows written for the first time (not present) get their pages'
blocks first (``fallocate``, :class:`~bagpipe.store.diskio.Reserver`; a bitmap of the
pages reserved spares a call for a page reserved before), as do the pages of present.u8
a flush writes: a full disk is then a :class:`StoreFullError` naming the file, and only
the pages of rows written take blocks (an MLPerf-sized store stays sparse). Measured on
ext4 (4M rows x 17 floats, 100 writes of 4,096 random rows, 2 loaded cores): first
writes ~31-34 ms a batch without, ~35-37 with; rewrites of present rows unchanged (~27 ms).

Reads go through shared memory maps of the files advised ``MADV_RANDOM`` (no
read-around: with the default read-around every page fault reads 128 KiB..8 MiB,
which for a table larger than RAM wastes the disk and evicts useful pages). The rows
of a batch are sorted by offset and read in rounds of at most ``io.hint_bytes`` of
pages (:class:`~bagpipe.store.diskio.DiskIO`): the calling thread first asks the kernel
for every page of the round (``madvise(MADV_WILLNEED)`` over each run of adjacent
pages), which queues all those reads on the device at once; then a persistent pool of
``threads`` threads gathers whole (D + S)-float rows with ``np.take`` (numpy releases
the GIL while copying) into the calling thread's reused buffer, from which they go
straight to the caller's order in the returned weights and state. Writes fill the same
kind of buffer, hint and scatter the same way (a contiguous run of rows is one
``pwrite``), then count the pages they dirtied: the store keeps the file's dirty pages
under ``io.dirty_bytes`` by starting their writeback itself
(:class:`~bagpipe.store.diskio.WriteBehind`), so a memory cgroup's page cache never fills
with pages that cannot be reclaimed. With ``io.page_cache_bytes`` set (a budget without
a cgroup to enforce it) the store also trims its own page cache.

The read path was chosen by measurement under a memory cgroup
(``benchmarks/disk_read_paths.py``; the write path and the page-cache bounds by
``benchmarks/disk_write_paths.py``; figures in docs/beyond-memory.md): the hints
reached the device's random-read rate from one thread as from eight, where faulting
threads alone needed many threads competing with the trainer for the cores.

Which rows are present is kept in memory as a bitmap (num_rows / 8 bytes), loaded
from ``present.u8`` at open (only its allocated extents are read), so deciding
which rows need I/O costs no I/O.

Packed rows written back (the frequency layout's hot rows) are appended to the row log,
whole pages in one ``pwrite`` a round, instead of dirtying a page each in place: under a
memory limit the dirty-page bound otherwise writes the same hot pages to the device again
and again (:mod:`bagpipe.store.rowlog`). A bulk write (:meth:`load`: a checkpoint's
restore, a table made whole) puts rows at their home slots.

The module is long because one class holds the files, the hinted read and write paths,
the row log's appends and segment preparation, the crash-safe flush and the presence
bitmap (its written rows and their reset for a restore), which share the store's locks
and the invariants of its files; the I/O settings, the dirty-page bound and the raw
``pread``/``pwrite`` helpers are in :mod:`bagpipe.store.diskio`.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import numpy as np

from bagpipe.errors import BagpipeError, DataError
from bagpipe.files import FULL_ERRNOS, atomic_write_text
from bagpipe.store.base import EmbeddingStore, bitmap_rows, bits_clear, bits_set, bits_test
from bagpipe.store.diskio import (
    PAGE,
    Advisor,
    DiskIO,
    Reserver,
    Residency,
    WriteBehind,
    drop_file_pages,
    page_runs,
    pages_spanned,
    pread_into,
    pwrite_from,
)
from bagpipe.store.init import RowValues
from bagpipe.store.layout import RowLayout
from bagpipe.store.rowlog import SEGMENTS, RowLog, log_slots

FORMAT = "bagpipe.DiskStore"
VERSION = 2  # 1: weights.f32 + state.f32; 2: rows.f32 (weights and state side by side)
PACKED_VERSION = 3  # 2 with a row layout (layout.i64): what a version-2 reader must not open
HEADER = "header.json"
ROWS = "rows.f32"
PRESENT = "present.u8"
LAYOUT = "layout.i64"
LOG = "log.i32"

_MIN_ROWS_PER_TASK = 16  # below this a thread hand-off costs more than it hides
_PAGE = PAGE  # the one page size of the store's I/O (diskio's)


class StoreFullError(BagpipeError):
    """A store file could not grow: its file system is full (or over quota). The rows of
    the failed write are not stored; the store's earlier rows and present.u8 are intact."""


class DiskStore(EmbeddingStore):
    """Rows and their optimizer state, side by side in one sparse file under ``path``.

    Args:
        init: gives the initial value of any row (also fixes num_rows and D).
        state_dim: S, optimizer-state values per row.
        path: directory of the store; created if missing.
        threads: gather/scatter threads per pool (one pool for reads, one for writes);
            overrides ``io.threads``.
        create: create the store if ``path`` holds none; when False a missing store
            is a :class:`DataError`. An existing store is always reopened (its header
            must match ``init`` and ``state_dim``), never overwritten.
        io: its memory settings (:class:`~bagpipe.store.diskio.DiskIO`: pages in
            flight, the dirty-page bound, the page-cache bound, chunk rows).
        lock: the lock on ``path`` its opener holds (:func:`bagpipe.store.open_store`),
            released when the store closes.
        layout: where rows.f32 keeps each row (:class:`~bagpipe.store.layout.RowLayout`),
            for a store created here (identity when None), or a callable that makes it,
            called only then; a store reopened keeps the layout it was made with (:attr:`layout`).

    Rows passed to :meth:`read` and :meth:`write` must be in [0, num_rows); rows of a
    write must be unique (a :class:`ValueError` otherwise). Thread safety is as in
    :class:`EmbeddingStore`: one reader and one writer thread on disjoint rows.
    """

    def __init__(
        self,
        init: RowValues,
        state_dim: int,
        path: str | Path,
        *,
        threads: int | None = None,
        create: bool = True,
        io: DiskIO | None = None,
        lock=None,
        layout: RowLayout | Callable[[], RowLayout] | None = None,
    ):
        super().__init__(init, state_dim)
        self.path = Path(path)
        self._lock = lock
        io = io or DiskIO()
        if threads is not None:
            io = dataclasses.replace(io, threads=int(threads))
        self.io = io
        self.threads = max(1, io.threads)
        self.chunk_rows = io.chunk_rows
        self._round = io.round_rows()
        self._scratch = threading.local()  # each reading / writing thread's reused buffer
        self._touched = 0  # bytes of pages touched since the last page-cache trim
        self._trim_lock = threading.Lock()
        self._closed = True
        self._fds: dict[str, int] = {}
        self._maps: dict[str, mmap.mmap] = {}
        self._present_lock = threading.Lock()
        self._log_lock = threading.Lock()  # a read's slots and gather against a segment's rows moving home
        self._flush_lock = threading.Lock()  # a flush against a segment's preparation (rowlog module)
        self._log: RowLog | None = None
        header = self._expected_header()
        if (self.path / HEADER).exists():
            self.layout, self._log_slots = self._check_header(header)
            self._open_files(new=False)
        elif create:
            if callable(layout):  # made only now, under the opener's lock (a frequency layout: a pass over a split)
                layout = layout()
            self.layout = layout if layout is not None else RowLayout.identity()
            self.layout.check(self.num_rows, f"{self.path}: the layout asked for")
            self._log_slots = log_slots(self.layout.num_packed)
            self.path.mkdir(parents=True, exist_ok=True)
            self._open_files(new=True)
        else:
            raise DataError(f"{self.path}: no DiskStore here (missing {HEADER})")
        try:
            if self._new:
                if not self.layout.is_identity:  # before the header, which is written last
                    self.layout.save(self.path / LAYOUT)
                    header |= {"version": PACKED_VERSION, "layout": self._layout_header()}
                else:  # one left by a making that was stopped is not this store's
                    (self.path / LAYOUT).unlink(missing_ok=True)
                self._write_header(header)
            self._bits = np.zeros((self.num_rows + 7) // 8, dtype=np.uint8)
            if not self._new:
                self._load_present()
            self._durable = self._bits.copy()  # what present.u8 on disk says
            if self._log_slots:
                self._log = self._open_log()
        except BaseException:
            self._release()
            raise
        self._behind = WriteBehind(self._fds[ROWS], io.dirty_bytes) if io.dirty_bytes and ROWS in self._fds else None
        self._closed = False
        self._read_pool = ThreadPoolExecutor(self.threads, thread_name_prefix="diskstore-read")
        self._write_pool = ThreadPoolExecutor(self.threads, thread_name_prefix="diskstore-write")

    # ------------------------------------------------------------------ files

    def _open_log(self) -> RowLog:
        """The row log's index as log.i32 says (position + 1 a packed row, 0: at home)."""
        self._lg = self._array(LOG, 0, np.int32)
        try:
            return RowLog(self.layout.num_packed, self._log_slots, self._lg.astype(np.int32) - 1)
        except ValueError as e:  # an index naming slots it cannot
            raise DataError(f"{self.path / LOG}: {str(e).removeprefix('RowLog: ')}: the file is damaged") from None

    def _expected_header(self) -> dict:
        shard = getattr(self.init, "shard_label", None)  # a server's shard of the row space
        return expected_header(self.num_rows, self.dim, self.state_dim, self.init.seed, self.init.table_sizes, shard)

    def _layout_header(self) -> dict:
        return {
            "file": LAYOUT,
            "packed_rows": self.layout.num_packed,
            "crc32": self.layout.crc32(),
            "log_file": LOG,
            "log_slots": self._log_slots,
        }

    def _write_header(self, header: dict) -> None:
        atomic_write_text(self.path / HEADER, json.dumps(header, indent=1, allow_nan=False) + "\n")

    def _check_header(self, want: dict) -> tuple[RowLayout, int]:
        """Refuse a header that is not of a store like ``want``; the store's row layout and
        its row log's slots."""
        have = read_header(self.path)
        refuse_another_store(self.path, have, want)
        layout = layout_of(self.path, have)
        return layout, log_slots_of(self.path, have)

    def _file_sizes(self) -> dict[str, int]:
        return file_sizes(self.num_rows, self._cols, self.layout, self._log_slots)

    @property
    def _slot_count(self) -> int:
        """Rows of rows.f32: num_rows + K (the layout's packed rows) + E (the row log's)."""
        return self.layout.slot_count(self.num_rows) + self._log_slots

    @property
    def _log_base(self) -> int:
        """The slot of rows.f32 where the row log begins."""
        return self.layout.slot_count(self.num_rows)

    @property
    def _cols(self) -> int:
        """Floats per row of rows.f32: D weights then S state values."""
        return self.dim + self.state_dim

    def _open_files(self, new: bool) -> None:
        self._new = new
        try:
            for name, size in self._file_sizes().items():
                p = self.path / name
                if new:
                    # No header yet: any file here is from an unfinished creation.
                    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                    self._fds[name] = fd
                    os.ftruncate(fd, size)  # sparse: no blocks until written
                else:
                    try:
                        fd = os.open(p, os.O_RDWR)
                    except FileNotFoundError as e:
                        raise DataError(f"{p}: DiskStore file missing") from e
                    self._fds[name] = fd
                    check_file_size(p, os.fstat(fd).st_size, size)
                if size:
                    m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                    m.madvise(mmap.MADV_RANDOM)
                    self._maps[name] = m
                    if name == ROWS:
                        self._residency = Residency(m)
                        self._advisor = Advisor(m, self._residency.base)
            if new:
                for fd in self._fds.values():
                    os.fsync(fd)
        except BaseException:
            self._release()
            raise
        self._r = self._array(ROWS, self._cols, np.float32)
        self._p = self._array(PRESENT, 0, np.uint8)
        self._reservers = {name: Reserver(fd) for name, fd in self._fds.items()}
        # pages of rows.f32 given their blocks by this process (a bit each: 1/32768 of the file)
        self._reserved = np.zeros((-(-self._slot_count * self._cols * 4 // _PAGE) + 7) // 8, dtype=np.uint8)

    def _array(self, name: str, cols: int, dtype) -> np.ndarray:
        m = self._maps.get(name)
        shape = (self._slot_count, cols) if cols else (self._file_sizes()[name] // np.dtype(dtype).itemsize,)
        if m is None:
            return np.zeros(shape, dtype=dtype)
        return np.frombuffer(m, dtype=dtype).reshape(shape)

    def _load_present(self) -> None:
        """Build the in-memory bitmap from the allocated extents of present.u8."""
        fd = self._fds[PRESENT]
        size = self.num_rows
        chunk = 8 << 20  # bytes of present.u8 per read (bounds the buffer at open)
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: no data after pos
                break
            start -= start % 8  # a byte of the bitmap holds 8 rows' flags (extents are block-aligned anyway)
            stop = min(size, os.lseek(fd, start, os.SEEK_HOLE))
            for a in range(start, stop, chunk):
                b = min(stop, a + chunk)
                buf = np.empty(b - a, dtype=np.uint8)
                pread_into(fd, buf, a)
                packed = np.packbits(buf != 0, bitorder="little")
                self._bits[a // 8 : a // 8 + len(packed)] |= packed
            pos = stop

    def _release(self) -> None:
        # drop the maps' last references (the store is closed: nothing reads them again)
        self._r = self._p = self._lg = None  # type: ignore[assignment]
        advisor = getattr(self, "_advisor", None)
        if advisor is not None:
            advisor.close()
        for m in self._maps.values():
            try:
                m.close()
            except BufferError:  # a view is still alive somewhere; unmapped when it dies
                pass
        self._maps.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self._lock is not None:
            self._lock.release()

    # ------------------------------------------------------------------ rows

    def _present(self, rows: np.ndarray) -> np.ndarray:
        return bits_test(self._bits, rows)

    def _sorted(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Rows sorted by offset and the permutation that sorted them (None if already sorted)."""
        if self._closed:
            raise ValueError(f"DiskStore {self.path} is closed")
        if len(rows) > 1 and not bool(np.all(rows[1:] > rows[:-1])):
            order = np.argsort(rows)  # equal rows are read once (_read), so stability is moot (stable: 8x slower)
            srows = np.take(rows, order)
        else:
            order, srows = None, rows
        if len(srows) and (srows[0] < 0 or srows[-1] >= self.num_rows):
            bad = srows[0] if srows[0] < 0 else srows[-1]
            raise IndexError(f"row {int(bad)} out of range [0, {self.num_rows})")
        return srows, order

    def _split(self, n: int) -> list[tuple[int, int]]:
        k = min(self.threads, max(1, n // _MIN_ROWS_PER_TASK))
        bounds = np.linspace(0, n, k + 1).astype(np.int64).tolist()
        return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]

    def _hint(self, srows: np.ndarray) -> None:
        """Ask the kernel to start reading the pages of ``srows`` (sorted) now: one
        ``madvise(MADV_WILLNEED)`` per run of adjacent pages -- unless a sample of those
        pages shows them cached (:class:`~bagpipe.store.diskio.Residency`): then the
        system calls would cost more than the few faults they spare."""
        rb = self._cols * 4
        first = srows * rb // _PAGE
        if not self._residency.cold(first):
            return
        self._advisor.advise(*page_runs(srows * rb, srows * rb + rb), mmap.MADV_WILLNEED)

    def _buffer(self, rows: int) -> np.ndarray:
        """This thread's reused (rows, D + S) buffer (grown once to a round's rows; a
        pipeline's fetch and write-back threads each keep their own)."""
        buf = getattr(self._scratch, "buf", None)
        if buf is None or len(buf) < rows:
            buf = self._scratch.buf = np.empty((max(rows, self._round), self._cols), dtype=np.float32)
        return buf

    def _rounds(self, n: int):
        """[lo, hi) rounds of at most one round's rows over n sorted rows."""
        return ((lo, min(n, lo + self._round)) for lo in range(0, n, self._round))

    def _gather_round(self, r: np.ndarray, buf: np.ndarray) -> None:
        """Rows ``r`` (sorted, on disk) into ``buf[:len(r)]``: their pages hinted first,
        then gathered by the read pool (a contiguous run is one ``pread``)."""
        R = self._r
        fd = self._fds[ROWS]
        row_bytes = self._cols * 4

        def gather(a: int, b: int) -> None:
            part = r[a:b]
            if part[-1] - part[0] == b - a - 1:  # a contiguous run: one pread (readahead applies)
                pread_into(fd, buf[a:b], int(part[0]) * row_bytes)
            else:
                np.take(R, part, axis=0, out=buf[a:b], mode="clip")

        if ROWS in self._maps:
            self._hint(r)
        self._run(self._read_pool, gather, self._split(len(r)))

    def _run(self, pool: ThreadPoolExecutor, fn, parts: list[tuple[int, int]]) -> None:
        if len(parts) == 1:
            fn(*parts[0])
            return
        for f in [pool.submit(fn, a, b) for a, b in parts]:
            f.result()

    def _read(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = len(rows)
        d = self.dim
        srows, order = self._sorted(rows)
        if n > 1 and bool(np.any(srows[1:] == srows[:-1])):  # a row asked twice: read each once
            u, inverse = np.unique(rows, return_inverse=True)  # (the gather takes sorted rows as unique)
            w, s = self._read(u)
            return w[inverse], s[inverse]
        pres = self._present(srows)
        w = np.empty((n, d), dtype=np.float32)
        s = np.empty((n, self.state_dim), dtype=np.float32)
        if not pres.all():  # rows never written: their initial value and zero state
            a = np.flatnonzero(~pres)
            at = a if order is None else order[a]
            w[at] = self.init.rows(srows[a])
            s[at] = 0.0
        p = np.flatnonzero(pres)
        prow = srows[p]
        # each sorted row on disk goes to dest[k] of the caller's order (None: in place)
        dest = None if (order is None and len(p) == n) else (p if order is None else order[p])
        with self._log_lock:  # no row of this read moves home meanwhile (rowlog module)
            if not self.layout.is_identity:  # the rows' slots, sorted: the order of the pages
                prow, by_slot = self._slot_order(prow)
                dest = by_slot if dest is None else dest[by_slot]
            self._gather_sorted(prow, dest, w, s)
        self._touch(pages_spanned(prow, self._cols * 4))
        return w, s

    def _slot_order(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slots, by_slot): where the latest values of ``rows`` lie -- the layout's slot, or
        the row log's -- ascending, and the permutation of ``rows`` that gives them."""
        slots = self.layout.slots(rows)
        if self._log is not None:
            slots = self._log.redirect(slots, self._log_base)
        by_slot = np.argsort(slots)
        return slots[by_slot], by_slot

    def _gather_sorted(self, slots: np.ndarray, dest: np.ndarray | None, w: np.ndarray, s: np.ndarray) -> None:
        """Slots ``slots`` (sorted, unique) into ``w[dest]`` / ``s[dest]`` (in order: None), round by round."""
        d = self.dim
        buf = self._buffer(min(len(slots), self._round))
        for lo, hi in self._rounds(len(slots)):
            k = hi - lo
            self._gather_round(slots[lo:hi], buf)
            if dest is None:
                w[lo:hi] = buf[:k, :d]
                s[lo:hi] = buf[:k, d:]
            else:
                w[dest[lo:hi]] = buf[:k, :d]
                s[dest[lo:hi]] = buf[:k, d:]

    def _load(self, rows: np.ndarray, weights: np.ndarray, state: np.ndarray) -> None:
        self._write(rows, weights, state, home=True)

    def _write(self, rows: np.ndarray, weights: np.ndarray, state: np.ndarray, home: bool = False) -> None:
        """``home``: every row at its home slot, none to the row log (a bulk write: a table
        made or restored whole); a packed row's copy in the log is dropped."""
        n = len(rows)
        weights = weights.reshape(n, self.dim)
        srows, order = self._sorted(rows)
        if n > 1 and bool(np.any(srows[1:] == srows[:-1])):
            raise ValueError("DiskStore.write: rows must be unique")
        if self.layout.is_identity:
            self._scatter(srows, weights, state, order, ~self._present(srows))
        else:
            slots = self.layout.slots(srows)
            src = np.arange(n) if order is None else order  # caller's index of each sorted row
            logged = slots < self.layout.num_packed if self._log is not None and not home else np.zeros(n, dtype=bool)
            placed = np.flatnonzero(~logged)
            if len(placed):  # in place, in slot order
                by_slot = np.argsort(slots[placed])
                at = placed[by_slot]
                self._scatter(slots[at], weights, state, src[at], ~self._present(srows[at]))
                if home and self._log is not None:  # their copies in the log are stale now
                    with self._log_lock:
                        self._log.send_home(slots[slots < self.layout.num_packed])
            if logged.any():  # appended to the row log
                at = np.flatnonzero(logged)
                self._append(slots[at], weights, state, src[at])
        # present.u8 learns of these rows only in flush(), after their values are durable
        with self._present_lock:
            bits_set(self._bits, srows)

    def _scatter(
        self, slots: np.ndarray, weights: np.ndarray, state: np.ndarray, src: np.ndarray | None, fresh: np.ndarray
    ) -> None:
        """Rows ``weights[src]`` / ``state[src]`` (in order: None) to ``slots`` (sorted,
        unique) of rows.f32, round by round; ``fresh``: the slots whose pages may be holes
        (they get their blocks first)."""
        d = self.dim
        R = self._r
        fd = self._fds[ROWS]
        row_bytes = self._cols * 4
        buf = self._buffer(min(len(slots), self._round))
        for lo, hi in self._rounds(len(slots)):
            k = hi - lo
            r = slots[lo:hi]
            # whole rows in sorted order: weights then state, as laid out in rows.f32
            if src is None:
                buf[:k, :d] = weights[lo:hi]
                buf[:k, d:] = state[lo:hi]
            else:
                buf[:k, :d] = weights[src[lo:hi]]
                buf[:k, d:] = state[src[lo:hi]]

            def scatter(a: int, b: int, r=r) -> None:
                part = r[a:b]
                if part[-1] - part[0] == b - a - 1:  # a contiguous run: plain writes, no page faults
                    pwrite_from(fd, buf[a:b], int(part[0]) * row_bytes)
                else:
                    R[part] = buf[a:b]

            if ROWS in self._maps:
                self._reserve_slots(r[fresh[lo:hi]])
                self._hint(r)
            try:
                self._run(self._write_pool, scatter, self._split(k))
            except OSError as e:  # pwrite of a contiguous run
                self._full(e, ROWS)
                raise
            self._wrote_pages(pages_spanned(r, row_bytes))

    def _wrote_pages(self, pages: int) -> None:
        if self._behind is not None:
            self._behind.wrote(pages * _PAGE)  # round by round: the dirty pages stay under io.dirty_bytes
        self._touch(pages)

    def _append(self, homes: np.ndarray, weights: np.ndarray, state: np.ndarray, src: np.ndarray) -> None:
        """Packed rows (home slots ``homes``) appended to the row log: whole pages, one
        ``pwrite`` a round, after the segments they take are prepared (rowlog module)."""
        log = self._log
        assert log is not None
        pos, todo = log.take(len(homes))
        for a, b in todo:
            self._prepare(a, b)
            log.prepared()  # only now: a preparation that failed is done again by the next write
        d = self.dim
        fd = self._fds[ROWS]
        row_bytes = self._cols * 4
        buf = self._buffer(min(len(pos), self._round))
        cuts = [0, *(np.flatnonzero(pos[1:] < pos[:-1]) + 1).tolist(), len(pos)]  # where the ring wraps
        for c0, c1 in zip(cuts[:-1], cuts[1:]):
            for lo in range(c0, c1, len(buf)):
                hi = min(c1, lo + len(buf))
                k = hi - lo
                buf[:k, :d] = weights[src[lo:hi]]
                buf[:k, d:] = state[src[lo:hi]]
                first = self._log_base + int(pos[lo])
                try:
                    pwrite_from(fd, buf[:k], first * row_bytes)
                except OSError as e:
                    self._full(e, ROWS)
                    raise
                self._wrote_pages(((first + k) * row_bytes - 1) // _PAGE - first * row_bytes // _PAGE + 1)
        log.commit(homes, pos)  # read from the log from now on

    def _prepare(self, a: int, b: int) -> None:
        """Free log slots [a, b) for a write: their live rows copied home, and a flush
        first if the durable index names one of them (rowlog module)."""
        log = self._log
        assert log is not None
        with self._flush_lock:
            rows, pos = log.live_in(a, b)
            if len(rows):
                w = np.empty((len(rows), self.dim), dtype=np.float32)
                s = np.empty((len(rows), self.state_dim), dtype=np.float32)
                self._gather_sorted(self._log_base + pos, None, w, s)  # pos ascending; only this thread writes them
                by_home = np.argsort(rows)
                # a row's home page may never have been written (a hole): its blocks first
                self._scatter(rows[by_home], w, s, by_home, np.ones(len(rows), dtype=bool))
                with self._log_lock:  # a read in flight finishes on the log's copy first
                    log.send_home(rows)
            if log.durably_named(a, b):
                self._flush_locked()

    def _reserve_slots(self, new: np.ndarray) -> None:
        """Allocate the blocks of slots ``new`` (sorted) whose pages may be holes -- rows
        never written before -- so that storing them through the map cannot meet a full
        disk (SIGBUS): a full disk is a :class:`StoreFullError` here, before any of them
        is written."""
        if len(new) == 0:
            return
        rb = self._cols * 4
        if rb > _PAGE:  # a row over several pages: its whole range each time
            self._reserve(ROWS, *page_runs(new * rb, new * rb + rb))
            return
        # a row lies in its first and last page: only pages not reserved before are asked
        # for (one call per page spared for every new row sharing a page with an older one)
        pages = np.unique(np.concatenate([new * rb // _PAGE, (new * rb + rb - 1) // _PAGE]))
        pages = pages[~bits_test(self._reserved, pages)]
        if len(pages):
            self._reserve(ROWS, *page_runs(pages * _PAGE, pages * _PAGE + _PAGE))
            bits_set(self._reserved, pages)

    def _reserve(self, name: str, starts: np.ndarray, ends: np.ndarray) -> None:
        try:
            self._reservers[name].reserve(starts, ends)
        except OSError as e:
            self._full(e, name)
            raise

    def _full(self, e: OSError, name: str) -> None:
        """Raise a full file system under ``name`` as one line naming the file."""
        if e.errno in FULL_ERRNOS:
            raise StoreFullError(
                f"cannot write the disk store's {self.path / name} ({e.strerror or e}): free space on its disk "
                "or give another --store-dir; the rows already stored and the run's checkpoints are intact"
            ) from None

    def _touch(self, pages: int) -> None:
        """Count pages touched; past ``io.page_cache_bytes`` since the last trim, trim."""
        if self.io.page_cache_bytes is None:
            return
        with self._trim_lock:
            self._touched += pages * _PAGE
            if self._touched < self.io.page_cache_bytes:
                return
            self._touched = 0
            self.trim_page_cache()

    def trim_page_cache(self) -> None:
        """Write the dirty pages, unmap every page and drop the files' clean pages from the
        page cache (rows read later come from the device again). Safe while other
        threads read or write: they fault the pages back in."""
        for m in self._maps.values():
            m.madvise(mmap.MADV_DONTNEED)
        for fd in self._fds.values():
            drop_file_pages(fd)

    def read_range(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows [start, stop) with sequential reads of rows.f32 (kernel readahead applies),
        through this thread's reused buffer."""
        if self._closed:
            raise ValueError(f"DiskStore {self.path} is closed")
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self.num_rows:
            raise IndexError(f"range [{start}, {stop}) outside [0, {self.num_rows})")
        n = stop - start
        d = self.dim
        w = np.empty((n, d), dtype=np.float32)
        s = np.empty((n, self.state_dim), dtype=np.float32)
        buf = self._buffer(min(n, self._round))
        step = len(buf)
        k_packed = self.layout.num_packed
        for lo in range(0, n, step):  # the range's own slots (K + g: a packed row's is a hole, replaced below)
            k = min(n, lo + step) - lo
            pread_into(self._fds[ROWS], buf[:k], (start + k_packed + lo) * self._cols * 4)
            w[lo : lo + k] = buf[:k, :d]
            s[lo : lo + k] = buf[:k, d:]
        rows, slots = self.layout.packed_in(start, stop)
        if len(rows):  # the range's packed rows, from the front of the file (or the row log)
            with self._log_lock:
                if self._log is not None:
                    slots = self._log.redirect(slots, self._log_base)
                got = self._r[slots]
            w[rows - start] = got[:, :d]
            s[rows - start] = got[:, d:]
        missing = np.flatnonzero(~self._present(np.arange(start, stop, dtype=np.int64)))
        if len(missing):
            w[missing] = self.init.rows(missing + start)
            s[missing] = 0.0
        self._touch(n * self._cols * 4 // _PAGE)
        return w, s

    # ------------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        """Make every completed write durable.

        Order matters for a crash: first the rows' values (msync + fsync of rows.f32),
        only then the flags of the rows written since the last flush (present.u8, msync
        + fsync). A flag therefore never says a row is present before its value is on
        disk; a crash between flushes loses those rows' updates (they read as before),
        never mixes a flag with a value that did not land. The row log's index (log.i32)
        goes between the two: after the values it names are durable, before a flag can
        say a row is present whose only value is in the log (its home slot a hole).
        """
        if self._closed:
            return
        with self._flush_lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        with self._present_lock:  # the rows written so far: only their flags are made durable below
            new = np.flatnonzero(self._bits & ~self._durable)
            fresh = self._bits[new] & ~self._durable[new]
        snap = self._log.snapshot() if self._log is not None else None  # values already in the page cache
        try:
            if ROWS in self._maps:
                self._maps[ROWS].flush()
            os.fsync(self._fds[ROWS])
        except OSError as e:
            self._full(e, ROWS)
            raise
        if snap is not None:
            self._flush_log(snap)
        with self._present_lock:
            fresh &= self._bits[new]  # not those a reset() cleared meanwhile
            if len(new):  # their flags' pages get blocks first: a full disk is an error, not SIGBUS
                self._reserve(PRESENT, *page_runs(new * 8, np.minimum(new * 8 + 8, self.num_rows)))
                self._p[bitmap_rows(fresh, self.num_rows, at=new)] = 1
                self._maps[PRESENT].flush()
            os.fsync(self._fds[PRESENT])
            self._durable[new] |= fresh  # last: a flush that failed is done again by the next

    def _flush_log(self, snap: np.ndarray) -> None:
        """The row log's index ``snap`` (whose values are durable now) into log.i32, durably."""
        assert self._log is not None
        changed = self._log.changed(snap)
        if len(changed):  # their pages get blocks first: a full disk is an error, not SIGBUS
            self._reserve(LOG, *page_runs(changed * 4, changed * 4 + 4))
            self._log.in_doubt(changed)  # from here the file may hold either entry, until the fsync
            self._lg[changed] = snap[changed] + 1
        try:
            self._maps[LOG].flush()
            os.fsync(self._fds[LOG])
        except OSError as e:
            self._full(e, LOG)
            raise
        self._log.made_durable(snap, changed)

    def written_rows(self) -> np.ndarray:
        with self._present_lock:  # the presence bitmap: no I/O
            return bitmap_rows(self._bits.copy(), self.num_rows)

    def written_bits(self) -> np.ndarray:
        with self._present_lock:
            return self._bits.copy()

    def reset(self, rows: np.ndarray) -> None:
        """Clear ``rows``' presence flags, durably (their old values stay in rows.f32, unread)."""
        rows = np.unique(np.asarray(rows, dtype=np.int64))
        with self._present_lock:
            bits_clear(self._bits, rows)
            bits_clear(self._durable, rows)
            if len(rows):
                self._reserve(PRESENT, *page_runs(rows, rows + 1))
            self._p[rows] = 0
            self._maps[PRESENT].flush()
        os.fsync(self._fds[PRESENT])

    def drop_page_cache(self) -> None:
        """Flush, then evict this store's files from the page cache (cold-start benchmarks).

        Pages mapped into this process are not evictable, so the maps' page-table
        entries are dropped first (``MADV_DONTNEED``; harmless for a shared file map
        whose pages are clean). Call it with no read or write in flight.
        """
        self.flush()
        for m in self._maps.values():
            m.madvise(mmap.MADV_DONTNEED)
        for fd in self._fds.values():
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def layout_summary(self) -> dict:
        packed = self.layout.num_packed
        out = {"layout": "frequency" if packed else "identity", "packed_rows": packed}
        if self.layout_choice is not None:
            out["layout_choice"] = self.layout_choice
        if self._log is not None:
            out |= {"log_slots": self._log_slots, "logged_rows": self._log.logged()}
        return out

    def disk_usage(self) -> dict[str, int]:
        """Allocated bytes of each file (st_blocks * 512), for sparseness checks."""
        return {name: os.fstat(fd).st_blocks * 512 for name, fd in self._fds.items()}

    def close(self) -> None:
        """Flush, stop the I/O threads, close the files. Idempotent."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._read_pool.shutdown(wait=True)
        self._write_pool.shutdown(wait=True)
        self._release()

    def __repr__(self) -> str:
        return (
            f"DiskStore({str(self.path)!r}, num_rows={self.num_rows}, dim={self.dim}, "
            f"state_dim={self.state_dim}{', closed' if self._closed else ''})"
        )


def layout_of(path: Path, have: dict) -> RowLayout:
    """The row layout of the store in ``path`` whose header.json says ``have`` (its format
    and version checked): identity for version 2, else layout.i64 checked against the
    header (its count, its CRC-32, its rows in range); a damaged one is a one-line
    :class:`DataError` naming the file. Reads only (``bagpipe plan`` checks a store with it)."""
    hp = path / HEADER
    num_rows = have.get("num_rows")
    lay = have.get("layout")
    if have.get("version") == VERSION:
        if lay is not None:  # a version-2 reader would read the packed rows at the wrong slots
            raise DataError(f"{hp}: a version-{VERSION} DiskStore header with a layout: the header is damaged")
        return RowLayout.identity()
    if not isinstance(lay, dict):
        raise DataError(f"{hp}: a version-{PACKED_VERSION} DiskStore header without its layout: the header is damaged")
    k, crc = lay.get("packed_rows"), lay.get("crc32")
    if not isinstance(num_rows, int) or not isinstance(k, int) or isinstance(k, bool) or not 0 < k <= num_rows:
        raise DataError(
            f"{hp}: layout.packed_rows is {k!r}, not a count of rows in [1, num_rows]: the header is damaged"
        )
    if not (isinstance(crc, str) and len(crc) == 8):
        raise DataError(f"{hp}: layout.crc32 is {crc!r}, not 8 hex digits: the header is damaged")
    layout = RowLayout.load(path / LAYOUT, k, crc)
    layout.check(num_rows, path / LAYOUT)
    return layout


def log_slots_of(path: Path, have: dict) -> int:
    """E, the row log's slots of the store whose header.json says ``have`` (0: none -- a
    version-2 store, or a version-3 store made before the log); a value that is not a
    whole number of the log's segments is a one-line :class:`DataError` naming the file."""
    lay = have.get("layout")
    e = lay.get("log_slots", 0) if isinstance(lay, dict) else 0
    if not isinstance(e, int) or isinstance(e, bool) or e < 0 or e % SEGMENTS or e >= 2**31:
        raise DataError(
            f"{path / HEADER}: layout.log_slots is {e!r}, not a count of slots in whole segments of {SEGMENTS}: "
            "the header is damaged"
        )
    k = lay.get("packed_rows") if isinstance(lay, dict) else None
    if e and isinstance(k, int) and e < k:  # a write may append every packed row at once
        raise DataError(
            f"{path / HEADER}: layout.log_slots is {e:,}, fewer than its {k:,} packed rows: the header is damaged"
        )
    return e


def file_sizes(num_rows: int, cols: int, layout: RowLayout, log_slots: int) -> dict[str, int]:
    """Bytes of each file of a store: rows.f32 (num_rows + K + E slots of ``cols``
    floats), present.u8, and log.i32 (4 bytes a packed row) with a row log."""
    sizes = {ROWS: (layout.slot_count(num_rows) + log_slots) * cols * 4, PRESENT: num_rows}
    if log_slots:
        sizes[LOG] = 4 * layout.num_packed
    return sizes


def expected_header(
    num_rows: int, dim: int, state_dim: int, seed: int, table_sizes: list[int], shard: str | None = None
) -> dict:
    """The header.json of a store of these rows (version 2; a layout adds its own)."""
    return ({"shard": shard} if shard else {}) | {
        "format": FORMAT,
        "version": VERSION,
        "dtype": "float32",
        "num_rows": num_rows,
        "dim": dim,
        "state_dim": state_dim,
        "seed": seed,
        "table_sizes": list(table_sizes),
    }


def refuse_another_store(path: Path, have: dict, want: dict) -> None:
    """Refuse (one-line :class:`DataError`) a store whose header ``have`` is not of the rows
    ``want`` (:func:`expected_header`) describes, naming every setting that differs."""
    skip = ("table_sizes", "version")
    diffs = [f"{k}={have.get(k)!r} (asked for {v!r})" for k, v in want.items() if k not in skip and have.get(k) != v]
    if not diffs and have.get("table_sizes") != want["table_sizes"]:
        diffs.append(f"table_sizes={have.get('table_sizes')!r} (asked for {want['table_sizes']!r})")
    if diffs:
        raise DataError(f"{path}: existing DiskStore does not match: " + ", ".join(diffs))


def check_file_size(path: Path, have: int, want: int) -> None:
    if have != want:
        raise DataError(f"{path}: DiskStore file is {have} bytes, expected {want}")


def read_header(path: str | Path) -> dict:
    """The header.json of the store in ``path``, its format and version checked (a one-line
    :class:`DataError` naming the file otherwise)."""
    hp = Path(path) / HEADER
    try:
        have = json.loads(hp.read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{hp}: unreadable DiskStore header: {e}") from e
    if not isinstance(have, dict) or have.get("format") != FORMAT:
        raise DataError(f"{hp}: not a DiskStore header")
    if have.get("version") not in (VERSION, PACKED_VERSION):
        raise DataError(
            f"{hp}: DiskStore format version {have.get('version')!r}, this bagpipe reads only "
            f"versions {VERSION} and {PACKED_VERSION} (weights and state of a row side by side in {ROWS}; "
            "version 1 kept them in weights.f32 and state.f32); recreate the store"
        )
    return have


def layout_name(path: str | Path) -> Literal["identity", "frequency"]:
    """The ``--store-layout`` the store in ``path`` was made with: "frequency" (a version-3
    header, with layout.i64) or "identity"."""
    return "frequency" if read_header(path).get("version") == PACKED_VERSION else "identity"


def check_store_files(path: str | Path, want: dict | None = None) -> None:
    """Read-only, what opening the store in ``path`` checks: its header (against ``want``,
    :func:`expected_header`, where given), its layout (:func:`layout_of`) and, with
    ``want``, its files' sizes. ``bagpipe plan`` refuses with it what ``train`` refuses."""
    path = Path(path)
    have = read_header(path)
    if want is not None:
        refuse_another_store(path, have, want)
    layout = layout_of(path, have)
    slots = log_slots_of(path, have)
    if want is None:
        return
    sizes = file_sizes(want["num_rows"], want["dim"] + want["state_dim"], layout, slots)
    for name, size in sizes.items():
        try:
            got = os.stat(path / name).st_size
        except FileNotFoundError as e:
            raise DataError(f"{path / name}: DiskStore file missing") from e
        check_file_size(path / name, got, size)
