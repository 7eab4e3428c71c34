"""Reading the rows of a checkpoint: its full base and the deltas on top, any layout.

A checkpoint's rows are those of its chain: the last full checkpoint at or before it,
then every delta after that one, in order (later values win). Parts are memory-mapped
and read by global row, so the rows of S servers' parts can be read back in any other
layout: all rows in order (one process), or only the rows one of S' new servers
holds (each server restores its own rows, no process funnels every row).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bagpipe.checkpoint.format import Manifest, delta_names, full_name
from bagpipe.errors import CheckpointError

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
        full_folder, full = chain[0]
        full.check_parts(full_folder)
        self._shards = full.parts[0].shards
        self._full = [
            np.load(full_folder / full_name(p.shard, p.shards), mmap_mode="r")
            for p in sorted(full.parts, key=lambda p: p.shard)
        ]
        self._deltas = []  # (ids (m,), values (m, D + S)) in chain order
        for folder, man in chain[1:]:
            man.check_parts(folder)
            for p in man.parts:
                ids_name, values_name = delta_names(p.shard, p.shards)
                self._deltas.append(
                    (np.load(folder / ids_name, mmap_mode="r"), np.load(folder / values_name, mmap_mode="r"))
                )
        for m2 in (man for _, man in chain):
            if (m2.num_rows, m2.dim, m2.state_dim) != (m.num_rows, m.dim, m.state_dim):
                raise CheckpointError(f"{self.folder}: its chain mixes row spaces")

    @property
    def cols(self) -> int:
        return self.dim + self.state_dim

    def values(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Weights (n, D) and state (n, S) of global ``rows`` (any order)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.cols), dtype=np.float32)
        S = self._shards
        if S == 1:
            out[:] = self._full[0][rows]
        else:
            owner = rows % S
            for k in range(S):
                pos = np.flatnonzero(owner == k)
                if len(pos):
                    out[pos] = self._full[k][rows[pos] // S]
        for ids, vals in self._deltas:
            if len(ids) == 0:
                continue
            at = np.searchsorted(ids, rows)
            at[at >= len(ids)] = 0
            hit = np.flatnonzero(np.asarray(ids[at]) == rows)
            if len(hit):
                out[hit] = vals[at[hit]]
        return np.ascontiguousarray(out[:, : self.dim]), np.ascontiguousarray(out[:, self.dim :])

    def chunks(self, chunk_rows: int = CHUNK) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Every row in global order as (start, weights, state)."""
        for a in range(0, self.num_rows, chunk_rows):
            b = min(self.num_rows, a + chunk_rows)
            w, s = self.values(np.arange(a, b, dtype=np.int64))
            yield a, w, s

    def shard_rows(
        self, shard: int, shards: int, chunk_rows: int = CHUNK
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The rows g with g % ``shards`` == ``shard`` as (local rows g // shards, weights, state) chunks."""
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
