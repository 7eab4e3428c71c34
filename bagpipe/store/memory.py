"""A store in process memory (cDLRM's CPU-memory tables)."""

from __future__ import annotations

import numpy as np

from bagpipe.store.base import EmbeddingStore
from bagpipe.store.init import RowValues


class MemoryStore(EmbeddingStore):
    """All rows in two numpy arrays, initialised lazily.

    The arrays are allocated with ``np.zeros`` (calloc), so untouched pages cost no
    resident memory; a per-row flag says whether a row was written (or loaded) since the
    store was made. A row never written reads as its initial value, computed on each read
    (a read does not set the flag: the flags are exactly the written rows).
    """

    def __init__(self, init: RowValues, state_dim: int):
        super().__init__(init, state_dim)
        self.weights = np.zeros((self.num_rows, self.dim), dtype=np.float32)
        self.state = np.zeros((self.num_rows, self.state_dim), dtype=np.float32)
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

    def reset(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int64)
        self.present[rows] = False
        self.state[rows] = 0.0
