"""Reading the rows of a checkpoint: its full base and the deltas on top, any layout.

A checkpoint's rows are those of its chain: the last full checkpoint at or before it,
then every delta after that one, in order (later values win), over the initial tables
(a row no part holds reads as its initial value and zero optimizer state; see
:mod:`bagpipe.checkpoint.format`). Parts are memory-mapped and read by global row, so
the rows of S servers' parts can be read back in any other layout: all rows in order
(one process, small tables), only the rows the checkpoint holds (a restore: its cost
is the rows trained, not the tables), or only those one of S' new servers holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from bagpipe.checkpoint.format import Manifest, dense_name, part_names
from bagpipe.errors import CheckpointError
from bagpipe.store.init import RowInitializer

CHUNK = 1 << 20


class CheckpointReader:
    """The rows (weights and optimizer state) of the checkpoint in ``folder``."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.manifest = Manifest.load(self.folder)
        chain = [(self.folder, self.manifest)]
        while chain[-1][1].kind == "delta":
            base = chain[-1][1].base
            where = self.folder.parent / base if base else None
            if where is None or not where.is_dir():
                raise CheckpointError(f"{chain[-1][0]}: its base checkpoint {base} is missing (the chain is broken)")
            chain.append((where, Manifest.load(where)))
        chain.reverse()  # full first
        self.chain = chain
        m = self.manifest
        self.num_rows, self.dim, self.state_dim = m.num_rows, m.dim, m.state_dim
        for f, m2 in chain:
            if (m2.num_rows, m2.dim, m2.state_dim) != (m.num_rows, m.dim, m.state_dim):
                raise CheckpointError(f"{self.folder}: its chain mixes row spaces")
            m2.check_parts(f)
        full_folder, full = chain[0]
        self._shards = full.parts[0].shards
        self._dense: list[np.ndarray] | None = None  # a version-2 full base: every row of each shard
        self._sparse: list[tuple[np.ndarray, np.ndarray]] = []  # (ids (m,), values (m, D + S)) in chain order
        for folder, man in chain:
            for p in sorted(man.parts, key=lambda p: p.shard):
                if p.dense:
                    self._dense = self._dense or []
                    self._dense.append(np.load(folder / dense_name(p.shard, p.shards), mmap_mode="r"))
                else:
                    ids_name, values_name = part_names(p.kind, p.shard, p.shards)
                    ids = np.load(folder / ids_name, mmap_mode="r")
                    if len(ids):
                        self._sparse.append((ids, np.load(folder / values_name, mmap_mode="r")))
        init = next((man.init for _, man in reversed(chain) if man.init is not None), None)
        if init is not None and sum(init.table_sizes) != m.num_rows:
            raise CheckpointError(
                f"{self.folder}: its initial tables ({sum(init.table_sizes):,} rows) are not its row space"
            )
        self.init = RowInitializer(init.table_sizes, m.dim, init.seed) if init is not None else None
        if self._dense is None and self.init is None:
            raise CheckpointError(f"{self.folder}: holds neither every row nor the initial tables' identity")

    @property
    def cols(self) -> int:
        return self.dim + self.state_dim

    def values(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Weights (n, D) and state (n, S) of global ``rows`` (any order)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.cols), dtype=np.float32)
        if self._dense is not None:
            S = self._shards
            if S == 1:
                out[:] = self._dense[0][rows]
            else:
                owner = rows % S
                for k in range(S):
                    pos = np.flatnonzero(owner == k)
                    if len(pos):
                        out[pos] = self._dense[k][rows[pos] // S]
        else:
            assert self.init is not None
            out[:, : self.dim] = self.init.rows(rows)
            out[:, self.dim :] = 0.0
        for ids, vals in self._sparse:
            at = np.searchsorted(ids, rows)
            at[at >= len(ids)] = 0
            hit = np.flatnonzero(np.asarray(ids[at]) == rows)
            if len(hit):
                out[hit] = vals[at[hit]]
        return np.ascontiguousarray(out[:, : self.dim]), np.ascontiguousarray(out[:, self.dim :])

    def stored_ids(self, shard: int = 0, shards: int = 1) -> np.ndarray:
        """The global rows g with g % ``shards`` == ``shard`` that the checkpoint holds
        (those that may differ from their initial value), ascending. Its cost is the rows
        the parts hold (every row of the shard for a version-2 checkpoint)."""
        if self._dense is not None:
            n = max(0, (self.num_rows - shard + shards - 1) // shards)
            return np.arange(n, dtype=np.int64) * shards + shard
        mine = []
        for ids, _ in self._sparse:
            a = np.asarray(ids)
            mine.append(a if shards == 1 else a[a % shards == shard])
        return np.unique(np.concatenate(mine)) if mine else np.zeros(0, np.int64)

    def stored(
        self, shard: int = 0, shards: int = 1, chunk_rows: int = CHUNK
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The rows :meth:`stored_ids` names, as (global rows, weights, state) chunks."""
        ids = self.stored_ids(shard, shards)
        for a in range(0, len(ids), chunk_rows):
            w, s = self.values(ids[a : a + chunk_rows])
            yield ids[a : a + chunk_rows], w, s

    def chunks(self, chunk_rows: int = CHUNK) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Every row in global order as (start, weights, state) (small tables: tests, tools)."""
        for a in range(0, self.num_rows, chunk_rows):
            b = min(self.num_rows, a + chunk_rows)
            w, s = self.values(np.arange(a, b, dtype=np.int64))
            yield a, w, s

    def shard_rows(
        self, shard: int, shards: int, chunk_rows: int = CHUNK
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Every row g with g % ``shards`` == ``shard`` as (local rows g // shards, weights, state) chunks."""
        n = max(0, (self.num_rows - shard + shards - 1) // shards)
        for a in range(0, n, chunk_rows):
            local = np.arange(a, min(n, a + chunk_rows), dtype=np.int64)
            w, s = self.values(local * shards + shard)
            yield local, w, s

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """All weights (R, D) and state (R, S) in memory (small tables: tests, tools)."""
        w = np.empty((self.num_rows, self.dim), np.float32)
        s = np.empty((self.num_rows, self.state_dim), np.float32)
        for a, cw, cs in self.chunks():
            w[a : a + len(cw)], s[a : a + len(cs)] = cw, cs
        return w, s


class RowTarget(Protocol):
    """Where a restore puts a checkpoint's rows: a store, a server's shard of one, the full tables."""

    def written_rows(self) -> np.ndarray:
        """(m,) int64 ascending local rows that may differ from their initial value."""
        ...

    def reset(self, rows: np.ndarray) -> None:
        """Local ``rows`` return to their initial value and zero state (as if never written)."""
        ...

    def load(self, rows: np.ndarray, weights: np.ndarray, state: np.ndarray) -> None:
        """Set local ``rows`` to a checkpoint's values (not counted as written since a checkpoint)."""
        ...


def restore_rows(target: RowTarget, reader: CheckpointReader, shard: int = 0, shards: int = 1) -> int:
    """Make ``target`` (shard ``shard`` of ``shards``) hold the checkpoint's rows: the rows it
    holds are loaded, every other row the target has written goes back to its initial value.
    Costs the rows the checkpoint and the target hold, not the tables. Returns the rows loaded."""
    loaded = 0
    keep = []
    for ids, w, s in reader.stored(shard, shards):
        local = ids // shards
        target.load(local, w, s)
        keep.append(local)
        loaded += len(ids)
    stale = np.setdiff1d(target.written_rows(), np.concatenate(keep) if keep else np.zeros(0, np.int64))
    if len(stale):
        target.reset(stale)
    return loaded
