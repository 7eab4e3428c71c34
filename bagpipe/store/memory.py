"""A store in process memory (cDLRM's CPU-memory tables)."""

from __future__ import annotations

import mmap

import numpy as np

from bagpipe.store.base import EmbeddingStore
from bagpipe.store.init import RowValues

#: Tables at least this large are committed when the store is made (:func:`committed_zeros`).
COMMIT_BYTES = 64 << 20
#: Commit only what fits in this share of the memory available now (page cache counted as free).
COMMIT_SHARE = 0.8


def available_bytes() -> int | None:
    """The memory available for new allocations now (``MemAvailable`` of /proc/meminfo), or
    None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def committed_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zero array whose pages are all resident from the start.

    ``np.zeros`` maps pages lazily: the first write to each page then faults, and NumPy
    advises large arrays to use 2 MiB huge pages, so a first write zeroes 2 MiB (and may
    compact memory to find them) -- 0.4-5 s spread over the first steps of a run whose
    write-backs scatter over a 2 GiB table, on the pipeline's write-back thread. The
    memory budget counts every row of a memory store anyway (``bagpipe.budget.estimate``),
    so the store takes its pages at once (``MAP_POPULATE``, the kernel's zeroing with the
    interpreter lock released) and its writes never fault afterwards. A table larger than
    80% of the memory available now stays lazy (np.zeros), as it was before."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if nbytes < COMMIT_BYTES or not populate or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.zeros(shape, dtype=dtype)
    available = available_bytes()
    if available is None or nbytes > COMMIT_SHARE * available:
        # a table this machine cannot hold is left lazy (its untouched rows cost nothing),
        # as before: committing it would end in the kernel's OOM killer, with no word
        return np.zeros(shape, dtype=dtype)
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    return np.frombuffer(m, dtype=dtype).reshape(shape)


class MemoryStore(EmbeddingStore):
    """All rows in two numpy arrays, committed when the store is made (:func:`committed_zeros`).

    A per-row flag says whether a row was written (or loaded) since the store was made. A
    row never written reads as its initial value, computed on each read (a read does not
    set the flag: the flags are exactly the written rows).
    """

    def __init__(self, init: RowValues, state_dim: int):
        super().__init__(init, state_dim)
        self.weights = committed_zeros((self.num_rows, self.dim), np.float32)
        self.state = committed_zeros((self.num_rows, self.state_dim), np.float32)
        self.present = np.zeros(self.num_rows, dtype=bool)

    def _read(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w, s = self.weights[rows], self.state[rows]
        missing = np.flatnonzero(~self.present[rows])
        if len(missing):
            w[missing] = self.init.rows(rows[missing])
            s[missing] = 0.0
        return w, s

    def read_range(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        w = self.weights[start:stop].copy()
        missing = np.flatnonzero(~self.present[start:stop])
        if len(missing):
            w[missing] = self.init.rows(missing + start)
        s = self.state[start:stop].copy()
        s[missing] = 0.0
        return w, s

    def _write(self, rows: np.ndarray, weights: np.ndarray, state: np.ndarray) -> None:
        self.weights[rows] = weights
        self.state[rows] = state
        self.present[rows] = True

    def written_rows(self) -> np.ndarray:
        return np.flatnonzero(self.present).astype(np.int64)

    def written_bits(self) -> np.ndarray:
        return np.packbits(self.present, bitorder="little")

    def reset(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        self.present[rows] = False
        self.state[rows] = 0.0
