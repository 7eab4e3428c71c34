"""The EmbeddingStore protocol: the slow tier of every table's rows and optimizer state.

Rows are addressed by global row index g in [0, num_rows). Each row has D weights and
S optimizer-state values (S = 0 for SGD, 1 for row-wise Adagrad). A row that was never
written reads as its deterministic initial value (:class:`~bagpipe.store.init.RowInitializer`) and zero state.

A store knows which rows were written since initialisation (:meth:`EmbeddingStore.written_rows`)
and which since the last checkpoint's cut (:meth:`EmbeddingStore.take_dirty`): checkpoints
and the digest cost the rows trained, never the tables.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bagpipe.store.init import RowValues

EXPORT_CHUNK_ROWS = 1 << 16  # rows per chunk of a full read (export, digests): bounds its memory


def bitmap_rows(bits: np.ndarray, num_rows: int, at: np.ndarray | None = None) -> np.ndarray:
    """The rows (ascending int64) whose bit is set in a little-endian bitmap of ``num_rows``
    bits; ``at``: ``bits`` holds only those bytes of the bitmap (ascending byte indices)."""
    if at is None:
        at = np.flatnonzero(bits)  # only the bytes with a row set: cheap for a sparse set
        bits = bits[at]
    set_ = np.unpackbits(bits, bitorder="little").reshape(-1, 8).astype(bool)
    rows = (np.asarray(at, np.int64)[:, None] * 8 + np.arange(8))[set_]
    return rows[rows < num_rows]


def bits_test(bits: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Whether bit ``idx`` (int64 array) is set in the little-endian bitmap ``bits`` (uint8): bool array."""
    return ((bits[idx >> 3] >> (idx & 7).astype(np.uint8)) & 1).astype(bool)


def bits_set(bits: np.ndarray, idx: np.ndarray) -> None:
    """Set bits ``idx`` (repeats allowed) of the little-endian bitmap ``bits`` in place."""
    np.bitwise_or.at(bits, idx >> 3, np.left_shift(np.uint8(1), (idx & 7).astype(np.uint8)))


def bits_clear(bits: np.ndarray, idx: np.ndarray) -> None:
    """Clear bits ``idx`` (repeats allowed) of the little-endian bitmap ``bits`` in place."""
    np.bitwise_and.at(bits, idx >> 3, ~np.left_shift(np.uint8(1), (idx & 7).astype(np.uint8)))


@dataclass
class StoreStats:
    """Counters every store keeps (rows, not bytes; see ``row_bytes``)."""

    reads: int = 0
    rows_read: int = 0
    writes: int = 0
    rows_written: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class EmbeddingStore(ABC):
    """Holds every row of every table plus its optimizer state.

    Args:
        init: gives the initial value of any row (also fixes num_rows and D).
        state_dim: S, optimizer-state values per row.

    Thread safety: one reader thread and one writer thread may work at once on
    *disjoint* rows (the oracle guarantees a row is never read while a newer value
    of it is being written).
    """

    #: Whether writes are remembered for incremental checkpoints (:meth:`take_dirty`).
    tracks_writes = True
    #: Rows per chunk of :meth:`chunks` (a disk store's is sized by its memory budget).
    chunk_rows = EXPORT_CHUNK_ROWS
    #: Why the store has its row layout (the run's ``--store-layout`` choice), for the
    #: summary; None: not said (a store opened outside a run).
    layout_choice: str | None = None

    def __init__(self, init: RowValues, state_dim: int):
        self.init = init
        self.num_rows = init.num_rows
        self.dim = init.dim
        self.state_dim = int(state_dim)
        self.stats = StoreStats()
        self._stats_lock = threading.Lock()
        self._dirty: np.ndarray | None = None  # bitmap of rows written since take_dirty(), made on first use

    @property
    def row_bytes(self) -> int:
        return 4 * (self.dim + self.state_dim)

    def read(self, rows: np.ndarray, after: int = -1) -> tuple[np.ndarray, np.ndarray]:
        """Current values of ``rows`` (n,) int64 -> weights (n, D), state (n, S) float32 (copies).

        ``after``: the read must see every write-back labelled <= ``after`` (see
        :meth:`mark_written`). An in-process store ignores it: its only writer is the
        caller's own pipeline, which waits for those write-backs before reading.
        """
        rows = np.asarray(rows, dtype=np.int64)
        w, s = self._read_after(rows, after)
        with self._stats_lock:
            self.stats.reads += 1
            self.stats.rows_read += len(rows)
        return w, s

    def write(self, rows: np.ndarray, weights: np.ndarray, state: np.ndarray) -> None:
        """Store new values of ``rows`` (n,) int64: weights (n, D), state (n, S)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            return
        self._write(
            rows, np.asarray(weights, np.float32), np.asarray(state, np.float32).reshape(len(rows), self.state_dim)
        )
        with self._stats_lock:
            self.stats.writes += 1
            self.stats.rows_written += len(rows)
            if self.tracks_writes:
                if self._dirty is None:
                    self._dirty = np.zeros((self.num_rows + 7) // 8, dtype=np.uint8)
                bits_set(self._dirty, rows)

    def load(self, rows: np.ndarray, weights: np.ndarray, state: np.ndarray) -> None:
        """Restore rows from a checkpoint: a write that the next incremental checkpoint
        need not repeat (the checkpoint it came from holds it)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows):
            self._load(
                rows, np.asarray(weights, np.float32), np.asarray(state, np.float32).reshape(len(rows), self.state_dim)
            )

    def _load(self, rows: np.ndarray, weights: np.ndarray, state: np.ndarray) -> None:
        """A bulk write (:meth:`load`); a store that places rows by how they are written
        back (the disk store's row log) puts these at their home."""
        self._write(rows, weights, state)

    def take_dirty(self) -> np.ndarray:
        """Rows written since the last call (ascending), and forget them."""
        with self._stats_lock:
            bits, self._dirty = self._dirty, None
        if bits is None:
            return np.zeros(0, dtype=np.int64)
        return bitmap_rows(bits, self.num_rows)

    def take_dirty_bits(self) -> np.ndarray:
        """:meth:`take_dirty` as the little-endian bitmap of num_rows bits (R/8 bytes, the
        caller's to keep): what a checkpoint's cut streams its rows from, chunk by chunk."""
        with self._stats_lock:
            bits, self._dirty = self._dirty, None
        return np.zeros((self.num_rows + 7) // 8, dtype=np.uint8) if bits is None else bits

    def written_bits(self) -> np.ndarray:
        """:meth:`written_rows` as a fresh little-endian bitmap (R/8 bytes)."""
        bits = np.zeros((self.num_rows + 7) // 8, dtype=np.uint8)
        rows = self.written_rows()
        bits_set(bits, rows)
        return bits

    def written_rows(self) -> np.ndarray:
        """(m,) int64 ascending: every row written (or loaded) since the store was created,
        i.e. every row that may differ from its initial value. Costs the rows written
        (and, for a bitmap, num_rows / 8 bytes scanned), never a read of the rows."""
        raise NotImplementedError(f"{type(self).__name__} does not track its written rows")

    def reset(self, rows: np.ndarray) -> None:
        """``rows`` return to their initial value and zero state, as if never written
        (a restore: rows written after the checkpoint it restores)."""
        raise NotImplementedError(f"{type(self).__name__} cannot reset rows")

    def mark_written(self, label: int) -> None:
        """Every write-back labelled <= ``label`` by this client has been issued (remote stores)."""

    def settle(self, label: int) -> None:
        """This client wrote back everything of steps <= ``label``; untracked reads
        (:meth:`peek`, :meth:`read_range`) from now on must see every client's such
        write-backs. An in-process store has one client and sees its writes at once."""

    def finish_writes(self) -> None:
        """This client will write nothing more (remote stores tell their servers)."""

    def peek(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Like :meth:`read` but not counted as training traffic (evaluation, digests)."""
        return self._read(np.asarray(rows, dtype=np.int64))

    def layout_summary(self) -> dict:
        """Where the store keeps its rows, for a run's summary (a disk store's row layout)."""
        return {}

    def read_range(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows [start, stop) for digests and export; does not count as training reads."""
        return self._read(np.arange(start, stop, dtype=np.int64))

    def chunks(self, chunk_rows: int | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Every row in order, as (start, weights, state) chunks of ``chunk_rows`` rows
        (default the store's :attr:`chunk_rows`; export, digests, checkpoints)."""
        chunk_rows = chunk_rows or self.chunk_rows
        for a in range(0, self.num_rows, chunk_rows):
            b = min(a + chunk_rows, self.num_rows)
            w, s = self.read_range(a, b)
            yield a, w, s

    @abstractmethod
    def _read(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def _read_after(self, rows: np.ndarray, after: int) -> tuple[np.ndarray, np.ndarray]:
        """A training read that must see write-backs labelled <= ``after``; see :meth:`read`."""
        return self._read(rows)

    @abstractmethod
    def _write(self, rows: np.ndarray, weights: np.ndarray, state: np.ndarray) -> None: ...

    def flush(self) -> None:
        """Make every completed write durable (no-op for memory)."""

    def close(self) -> None:
        """Release resources; the store is unusable afterwards."""

    def abandon(self) -> None:
        """Release resources after a failure elsewhere (a remote store leaves its servers
        without a goodbye: they may be gone, and waiting for them would hang)."""
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
