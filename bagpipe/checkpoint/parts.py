"""A checkpoint's rows: the cut's copy of them (:class:`Snapshot`), and writing one
shard's part of a checkpoint from it (:func:`write_part`).

The writer is whoever holds the rows: the one-process trainer (its store and cache, or
its full tables) or an embedding server (its shard of the store). The cut at a step
boundary copies only the rows a part needs -- those written since the previous cut, or
for a first checkpoint every row written since initialisation -- so it costs what was
trained since; the files are written afterwards, while training goes on. A full part
that has a previous checkpoint to rest on merges that checkpoint's rows with the cut's
(compaction), reading checkpoint files, not the store.

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


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_npy(path: Path, shape: tuple[int, ...], dtype, chunks: Iterator[np.ndarray]) -> FileSum:
    """Write an .npy file of ``shape`` from ``chunks`` (C order, in sequence) and fsync it;
    the file's size is reserved first, so a full disk fails here before any data is
    written. Returns the file's size and the CRC-32 of its bytes, summed as they were written."""
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
        for c in chunks:
            f.write(np.ascontiguousarray(c, dtype=dt).reshape(-1).view(np.uint8))
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
            for a in range(0, len(ids), CHUNK):
                out = np.empty((len(ids[a : a + CHUNK]), cols), np.float32)
                out[:, :d], out[:, d:] = snap.weights[a : a + CHUNK], snap.state[a : a + CHUNK]
                yield out

    else:  # compaction: the base chain's rows of this shard, the snapshot's winning
        merged = base.merged(shard, shards, over=(mine, np.concatenate([snap.weights, snap.state], axis=1)))
        ids = merged.ids

        def values() -> Iterator[np.ndarray]:
            for _, out in merged.chunks(CHUNK):
                yield out

    ids_sum = write_npy(folder / ids_name, (len(ids),), np.int64, iter([ids]))
    values_sum = write_npy(folder / values_name, (len(ids), cols), np.float32, values())
    sums = {ids_name: ids_sum, values_name: values_sum}
    return Part(shard, shards, kind, len(ids), ids_sum.bytes + values_sum.bytes, sums=sums)
