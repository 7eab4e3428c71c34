"""A checkpoint's rows: the cut's copy of them (:class:`Snapshot`), and writing one
shard's part of a checkpoint from it (:func:`write_part`).

The writer is whoever holds the rows: the one-process trainer (its store and cache, or
its full tables) or an embedding server (its shard of the store). The cut at a step
boundary copies only the rows a part needs -- those written since the previous cut, or
for a first checkpoint every row written since initialisation -- so it costs what was
trained since; the files are written afterwards, while training goes on. A full part
that has a previous checkpoint to rest on merges that checkpoint's rows with the cut's
(compaction), reading checkpoint files, not the store.

Under a memory budget the cut may instead take its rows as a bitmap (:class:`RowCut`) and
stream the part from the store at the cut, a chunk of rows at a time, each chunk written
before the next is read: its memory is the chunk's, not the rows written
(:mod:`bagpipe.train.cut` decides).

Files are written with ordinary writes after reserving their size (``posix_fallocate``),
never through a memory map: a full disk is an ``OSError`` (ENOSPC) at the start of the
part, not a SIGBUS in the middle of it. Each file's bytes are summed (size, CRC-32) as
they are written, for the manifest (:mod:`bagpipe.checkpoint.verify`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from bagpipe.checkpoint.format import Kind, Part, part_names
from bagpipe.checkpoint.verify import FileSum, SummingFile, remember
from bagpipe.store.base import bitmap_rows
from bagpipe.store.diskio import WriteBehind

if TYPE_CHECKING:
    from bagpipe.checkpoint.reader import CheckpointReader

CHUNK = 1 << 18  # rows copied or written at a time (bounds the temporary copies)


class RowSource(Protocol):
    """What a cut copies rows from: a store (or the full tables), in its local row numbering."""

    num_rows: int
    dim: int
    state_dim: int

    def written_rows(self) -> np.ndarray:
        """(m,) int64 ascending: every row that may differ from its initial value."""
        ...

    def take_dirty(self) -> np.ndarray:
        """(m,) int64 ascending: the rows written since the last call, forgotten."""
        ...

    def peek(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Weights (n, D) and state (n, S) of ``rows``, not counted as training traffic."""
        ...

    def take_dirty_bits(self) -> np.ndarray:
        """:meth:`take_dirty` as a little-endian bitmap of num_rows bits (the caller's)."""
        ...

    def written_bits(self) -> np.ndarray:
        """:meth:`written_rows` as a fresh little-endian bitmap of num_rows bits."""
        ...


@dataclass
class Snapshot:
    """The cut's copy of some rows: ``rows`` (m,) int64 ascending local rows, their
    ``weights`` (m, D) and optimizer ``state`` (m, S), float32."""

    rows: np.ndarray
    weights: np.ndarray
    state: np.ndarray

    @classmethod
    def empty(cls, dim: int, state_dim: int) -> Snapshot:
        return cls(np.zeros(0, np.int64), np.zeros((0, dim), np.float32), np.zeros((0, state_dim), np.float32))

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes + self.weights.nbytes + self.state.nbytes)

    def overlay(self, rows: np.ndarray, weights: np.ndarray, state: np.ndarray) -> Snapshot:
        """This snapshot with ``rows`` (any order, unique) set to the values given (they win)."""
        rows = np.asarray(rows, np.int64)
        if len(rows) == 0:
            return self
        union = np.union1d(self.rows, rows)
        w = np.empty((len(union), self.weights.shape[1]), np.float32)
        s = np.empty((len(union), self.state.shape[1]), np.float32)
        w[np.searchsorted(union, self.rows)] = self.weights
        s[np.searchsorted(union, self.rows)] = self.state
        at = np.searchsorted(union, rows)
        w[at], s[at] = weights, np.asarray(state).reshape(len(rows), -1)
        return Snapshot(union, w, s)


def take_snapshot(source: RowSource, everything: bool) -> Snapshot:
    """Copy the rows written since the previous snapshot of ``source`` (``everything``:
    every row written since initialisation, for a checkpoint with nothing to rest on);
    either way the rows written so far count as taken."""
    dirty = source.take_dirty()
    rows = source.written_rows() if everything else dirty
    w = np.empty((len(rows), source.dim), np.float32)
    s = np.empty((len(rows), source.state_dim), np.float32)
    for a in range(0, len(rows), CHUNK):
        w[a : a + CHUNK], s[a : a + CHUNK] = source.peek(rows[a : a + CHUNK])
    return Snapshot(np.asarray(rows, np.int64), w, s)


_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def bits_count(bits: np.ndarray, chunk: int = 1 << 20) -> int:
    """Rows set in a little-endian bitmap (counted ``chunk`` bytes at a time)."""
    return sum(int(_POPCOUNT[bits[a : a + chunk]].sum(dtype=np.int64)) for a in range(0, len(bits), chunk))


def set_bits(bits: np.ndarray, rows: np.ndarray) -> None:
    """Set ``rows`` in the little-endian bitmap ``bits``."""
    rows = np.asarray(rows, np.int64)
    np.bitwise_or.at(bits, rows >> 3, np.left_shift(np.uint8(1), (rows & 7).astype(np.uint8)))


def bits_chunks(bits: np.ndarray, num_rows: int, chunk_rows: int) -> Iterator[np.ndarray]:
    """The rows set in ``bits``, ascending, as int64 arrays of ``chunk_rows`` rows (the last
    fewer): the bitmap is read ``chunk_rows / 8`` bytes at a time, so no array of every
    row is ever made."""
    window = max(1, chunk_rows // 8)
    held: list[np.ndarray] = []
    n = 0
    for a in range(0, len(bits), window):
        part = bits[a : a + window]
        at = np.flatnonzero(part)
        if not len(at):
            continue
        rows = bitmap_rows(part[at], num_rows - 8 * a, at=at) + 8 * a
        held.append(rows)
        n += len(rows)
        while n >= chunk_rows:
            allrows = np.concatenate(held) if len(held) > 1 else held[0]
            yield allrows[:chunk_rows]
            rest = allrows[chunk_rows:]
            held, n = ([rest] if len(rest) else []), len(rest)
    if n:
        yield np.concatenate(held) if len(held) > 1 else held[0]


class Overlay(Protocol):
    """Rows newer than the source's (the cache's, at a cut mid-run): ``rows`` ascending."""

    rows: np.ndarray

    def values(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Weights and state of ``rows[at]``."""
        ...


@dataclass(frozen=True)
class CutBudget:
    """What a memory budget gives a checkpoint's cut (:func:`bagpipe.budget.estimate.cut_bytes`):
    ``bytes`` it may hold at once -- a whole copy if it fits, so that the part is written
    while training goes on -- else the cut streams in chunks of ``chunk_rows`` rows, with at
    most ``dirty_bytes`` of the part files' pages not yet written back."""

    bytes: int
    chunk_rows: int
    dirty_bytes: int | None = None


@dataclass
class RowCut:
    """The rows a cut takes, as a bitmap (R/8 bytes) over ``source`` (the store, quiescent
    until training goes on), with ``overlay`` (the cache's rows) winning; ``rows``: how many.

    :meth:`snapshot` copies them (the write then runs in the background);
    :meth:`write` streams them into a part at once, ``chunk_rows`` at a time, reading the
    store as of the cut -- memory bounded by the chunk, whatever the rows written."""

    source: RowSource
    bits: np.ndarray
    rows: int
    overlay: Overlay | None = None

    @classmethod
    def take(cls, source: RowSource, everything: bool, overlay: Overlay | None = None) -> RowCut:
        """The rows written since the previous cut (``everything``: since initialisation)
        and the overlay's; either way the rows written so far count as taken."""
        bits = source.take_dirty_bits()
        if everything:
            bits = source.written_bits()
        if overlay is not None and len(overlay.rows):
            set_bits(bits, overlay.rows)
        return cls(source, bits, bits_count(bits), overlay)

    def nbytes(self) -> int:
        """What :meth:`snapshot` holds."""
        return self.rows * (8 + 4 * (self.source.dim + self.source.state_dim))

    def chunks(self, chunk_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(rows, weights, state) of at most ``chunk_rows`` rows, ascending, as of now."""
        ov = self.overlay
        for rows in bits_chunks(self.bits, self.source.num_rows, chunk_rows):
            w, s = self.source.peek(rows)
            if ov is not None and len(ov.rows):
                lo, hi = np.searchsorted(ov.rows, [rows[0], rows[-1] + 1])
                if hi > lo:
                    at = np.arange(lo, hi)
                    ow, os_ = ov.values(at)
                    where = np.searchsorted(rows, ov.rows[lo:hi])
                    w[where], s[where] = ow, np.asarray(os_).reshape(len(at), -1)
            yield rows, w, s

    def snapshot(self, chunk_rows: int = CHUNK) -> Snapshot:
        """A copy of every row (what the background write needs)."""
        d, sd = self.source.dim, self.source.state_dim
        rows = np.empty(self.rows, np.int64)
        w = np.empty((self.rows, d), np.float32)
        s = np.empty((self.rows, sd), np.float32)
        a = 0
        for r, cw, cs in self.chunks(chunk_rows):
            rows[a : a + len(r)], w[a : a + len(r)], s[a : a + len(r)] = r, cw, cs
            a += len(r)
        assert a == self.rows, (a, self.rows)
        return Snapshot(rows, w, s)

    def write(
        self, folder: Path, shard: int, shards: int, kind: Kind, chunk_rows: int, dirty_bytes: int | None = None
    ) -> Part:
        """Shard ``shard`` of ``shards``' part (a delta, or a full part holding every written
        row) streamed into ``folder`` now, ``chunk_rows`` rows at a time: the ids from the
        bitmap, then the values read from the source chunk by chunk."""
        folder = Path(folder)
        d = self.source.dim
        cols = d + self.source.state_dim
        ids_name, values_name = part_names(kind, shard, shards)

        def ids() -> Iterator[np.ndarray]:
            for rows in bits_chunks(self.bits, self.source.num_rows, chunk_rows):
                yield rows * shards + shard

        def values() -> Iterator[np.ndarray]:
            for rows, w, s in self.chunks(chunk_rows):
                out = np.empty((len(rows), cols), np.float32)
                out[:, :d], out[:, d:] = w, s
                yield out

        ids_sum = write_npy(folder / ids_name, (self.rows,), np.int64, ids(), dirty_bytes)
        values_sum = write_npy(folder / values_name, (self.rows, cols), np.float32, values(), dirty_bytes)
        sums = {ids_name: ids_sum, values_name: values_sum}
        return Part(shard, shards, kind, self.rows, ids_sum.bytes + values_sum.bytes, sums=sums)


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_npy(
    path: Path, shape: tuple[int, ...], dtype, chunks: Iterator[np.ndarray], dirty_bytes: int | None = None
) -> FileSum:
    """Write an .npy file of ``shape`` from ``chunks`` (C order, in sequence) and fsync it;
    the file's size is reserved first, so a full disk fails here before any data is
    written. ``dirty_bytes``: the file's pages not yet written back stay under it (a
    memory cgroup counts them and cannot reclaim them). Returns the file's size and the
    CRC-32 of its bytes, summed as they were written."""
    dt = np.dtype(dtype)
    header = {"descr": np.lib.format.dtype_to_descr(dt), "fortran_order": False, "shape": tuple(shape)}
    with open(path, "wb") as raw:
        f = SummingFile(raw)
        np.lib.format.write_array_header_1_0(f, header)
        total = f.tell() + int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        try:
            os.posix_fallocate(raw.fileno(), 0, total)
        except OSError as e:
            if e.errno not in (95,):  # EOPNOTSUPP: the filesystem allocates as it writes
                raise
        behind = WriteBehind(raw.fileno(), dirty_bytes) if dirty_bytes else None
        for c in chunks:
            data = np.ascontiguousarray(c, dtype=dt).reshape(-1).view(np.uint8)
            f.write(data)
            if behind is not None:
                raw.flush()
                behind.wrote(len(data))
        raw.flush()
        if raw.tell() != total or f.size != total:
            raise OSError(f"{path}: wrote {raw.tell()} bytes, expected {total}")
        os.fsync(raw.fileno())
    s = f.sum()
    remember(path, s)
    return s


def write_part(
    folder: Path,
    snap: Snapshot,
    shard: int,
    shards: int,
    kind: Kind,
    base: CheckpointReader | None = None,
    chunk_rows: int = CHUNK,
    dirty_bytes: int | None = None,
) -> Part:
    """Write shard ``shard`` of ``shards`` (local row l is global row l * shards + shard)
    into ``folder`` from the cut's ``snap``: a delta part holds the snapshot's rows; a
    full part holds them merged with the rows of this shard that ``base`` (the previous
    checkpoint, whole chain) holds, the snapshot's values winning -- or the snapshot
    alone when it has nothing to rest on (then it must hold every written row)."""
    folder = Path(folder)
    d = snap.weights.shape[1]
    cols = d + snap.state.shape[1]
    mine = snap.rows * shards + shard  # global rows, ascending
    ids_name, values_name = part_names(kind, shard, shards)
    if base is None or kind == "delta":
        ids = mine

        def values() -> Iterator[np.ndarray]:
            for a in range(0, len(ids), chunk_rows):
                out = np.empty((len(ids[a : a + chunk_rows]), cols), np.float32)
                out[:, :d], out[:, d:] = snap.weights[a : a + chunk_rows], snap.state[a : a + chunk_rows]
                yield out

    else:  # compaction: the base chain's rows of this shard, the snapshot's winning
        merged = base.merged(shard, shards, over=(mine, np.concatenate([snap.weights, snap.state], axis=1)))
        ids = merged.ids

        def values() -> Iterator[np.ndarray]:
            for _, out in merged.chunks(chunk_rows):
                yield out

    ids_sum = write_npy(folder / ids_name, (len(ids),), np.int64, iter([ids]), dirty_bytes)
    values_sum = write_npy(folder / values_name, (len(ids), cols), np.float32, values(), dirty_bytes)
    sums = {ids_name: ids_sum, values_name: values_sum}
    return Part(shard, shards, kind, len(ids), ids_sum.bytes + values_sum.bytes, sums=sums)
