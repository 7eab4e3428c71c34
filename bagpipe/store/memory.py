"""A store in process memory (cDLRM's CPU-memory tables)."""

from __future__ import annotations

import numpy as np

from bagpipe.store.base import EmbeddingStore
from bagpipe.store.init import RowValues


class MemoryStore(EmbeddingStore):
    """All rows in two numpy arrays, initialised lazily.

    The arrays are allocated with ``np.zeros`` (calloc), so untouched pages cost no
    resident memory; a per-row flag says whether a row holds a value yet.
    """

    def __init__(self, init: RowValues, state_dim: int):
        super().__init__(init, state_dim)
        self.weights = np.zeros((self.num_rows, self.dim), dtype=np.float32)
        self.state = np.zeros((self.num_rows, self.state_dim), dtype=np.float32)
        self.present = np.zeros(self.num_rows, dtype=bool)

    def _materialise(self, rows: np.ndarray) -> None:
        missing = rows[~self.present[rows]]
        if len(missing):
            self.weights[missing] = self.init.rows(missing)
            self.present[missing] = True

    def _read(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._materialise(rows)
        return self.weights[rows], self.state[rows]

    def read_range(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        w = self.weights[start:stop].copy()
        missing = np.flatnonzero(~self.present[start:stop])
        if len(missing):
            w[missing] = self.init.rows(missing + start)
        return w, self.state[start:stop].copy()

    def _write(self, rows: np.ndarray, weights: np.ndarray, state: np.ndarray) -> None:
        self.weights[rows] = weights
        self.state[rows] = state
        self.present[rows] = True
