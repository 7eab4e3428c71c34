"""Deterministic, lazy initial values of embedding rows.

Row g of the global row space starts as a pure function of (seed, g): every store
(memory, disk, a server shard) and the reference trainer's full tables produce the
same bits without coordinating, and a table of a billion rows costs nothing until a
row is touched. Values follow DLRM's scheme, uniform in [-1/sqrt(n), 1/sqrt(n)) for a
table of n rows, drawn from a counter-based hash (SplitMix64) of (seed, g, column).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from bagpipe.hashing import splitmix64_


class RowValues(Protocol):
    """What a store needs to know of the rows it holds: R rows of D values, each row's
    initial value (a :class:`RowInitializer`, or an embedding server's shard of one)."""

    dim: int
    seed: int
    table_sizes: list[int]

    @property
    def num_rows(self) -> int: ...

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """(n, D) initial values of rows ``rows`` (in this space's row numbering)."""
        ...

    def range(self, start: int, stop: int) -> np.ndarray:
        """(stop - start, D) initial values of rows start..stop-1."""
        ...


class RowInitializer:
    """Initial values for any set of global rows.

    Args:
        table_sizes: rows per table, in table order (global rows are table offset + id).
        dim: D, the embedding dimension.
        seed: the run's seed.
    """

    def __init__(self, table_sizes: list[int], dim: int, seed: int):
        self.table_sizes = [int(n) for n in table_sizes]
        self.dim = int(dim)
        self.seed = int(seed)
        self.offsets = np.concatenate([[0], np.cumsum(self.table_sizes)]).astype(np.int64)
        self.bounds = (1.0 / np.sqrt(np.array(self.table_sizes, dtype=np.float64))).astype(np.float32)
        with np.errstate(over="ignore"):
            self._key = splitmix64_(np.array([self.seed], dtype=np.uint64))[0]

    @property
    def num_rows(self) -> int:
        return int(self.offsets[-1])

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """Initial values of ``rows`` (n,) int64 -> (n, D) float32."""
        rows = np.asarray(rows, dtype=np.int64)
        table = np.searchsorted(self.offsets, rows, side="right") - 1
        cols = np.arange(self.dim, dtype=np.uint64)
        with np.errstate(over="ignore"):
            counter = rows.astype(np.uint64)[:, None] * np.uint64(self.dim) + cols[None, :]
            counter ^= self._key
            bits = splitmix64_(counter)
        bits >>= np.uint64(40)
        u = bits.astype(np.float32)
        u *= np.float32(2.0**-23)  # = 2 * ([0, 1) uniform, exact in float32)
        u -= np.float32(1.0)
        u *= self.bounds[table][:, None]
        return u

    def range(self, start: int, stop: int) -> np.ndarray:
        """Initial values of the contiguous rows [start, stop) -> (stop - start, D)."""
        return self.rows(np.arange(start, stop, dtype=np.int64))
