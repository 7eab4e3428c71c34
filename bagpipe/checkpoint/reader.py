"""Reading the rows of a checkpoint: its full base and the deltas on top, any layout.

A checkpoint's rows are those of its chain: the last full checkpoint at or before it,
then every delta after that one, in order (later values win), over the initial tables
(a row no part holds reads as its initial value and zero optimizer state; see
:mod:`bagpipe.checkpoint.format`). Every file of the chain is checked against its
manifest (size and CRC-32, :mod:`bagpipe.checkpoint.verify`) before any is read: a
damaged file -- of the checkpoint or of a base it rests on -- is a one-line error
naming it. Parts are memory-mapped and read by global row, so
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
        for _, m2 in chain:
            if (m2.num_rows, m2.dim, m2.state_dim) != (m.num_rows, m.dim, m.state_dim):
                raise CheckpointError(f"{self.folder}: its chain mixes row spaces")
        for f, m2 in reversed(chain):  # every file of the chain whole before any is read
            try:
                m2.verify(f, dense=False)
            except CheckpointError as e:
                if f == self.folder:
                    raise
                raise CheckpointError(
                    f"checkpoint {self.folder.name} rests on {f.name}, which is damaged: {e}"
                ) from None
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

    def merged(self, shard: int = 0, shards: int = 1, over: tuple[np.ndarray, np.ndarray] | None = None) -> Merged:
        """The rows of shard ``shard`` of ``shards`` (g % shards == shard) that the checkpoint
        holds -- those that may differ from their initial value -- each from the latest part
        that has it; ``over``: (ascending global rows (m,), their values (m, D + S)) that win
        over the checkpoint's (a compaction's new rows). One sort of the parts' ids, then
        reads in part order: its cost is the rows the parts hold (every row of the shard for
        a version-2 checkpoint), not the tables."""
        if self._dense is not None:  # version 2: every row of the shard, read by row
            n = max(0, (self.num_rows - shard + shards - 1) // shards)
            return Merged.by_row(self, np.arange(n, dtype=np.int64) * shards + shard, over)
        sources: list[np.ndarray] = [vals for _, vals in self._sparse]
        ids, part, pos = [], [], []
        for k, (a, _) in enumerate(self._sparse):
            a = np.asarray(a)
            keep = np.flatnonzero(a % shards == shard) if shards > 1 else np.arange(len(a))
            ids.append(a[keep] if shards > 1 else a)
            part.append(np.full(len(keep), k, np.int32))
            pos.append(keep)
        if over is not None:
            ids.append(np.asarray(over[0], np.int64))
            part.append(np.full(len(over[0]), len(sources), np.int32))
            pos.append(np.arange(len(over[0])))
            sources.append(over[1])
        if not ids:
            return Merged(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64), sources, self.cols)
        all_ids, all_part, all_pos = np.concatenate(ids), np.concatenate(part), np.concatenate(pos)
        # by row, and (stable: the parts are concatenated in chain order) by part within a row,
        # so a row's latest part is its last entry
        order = np.argsort(all_ids, kind="stable")
        sorted_ids = all_ids[order]
        last = np.ones(len(order), dtype=bool)
        last[:-1] = sorted_ids[1:] != sorted_ids[:-1]
        pick = order[last]
        return Merged(all_ids[pick], all_part[pick], all_pos[pick], sources, self.cols)

    def stored_ids(self, shard: int = 0, shards: int = 1) -> np.ndarray:
        """The global rows of shard ``shard`` of ``shards`` the checkpoint holds, ascending."""
        return self.merged(shard, shards).ids

    def stored(
        self, shard: int = 0, shards: int = 1, chunk_rows: int = CHUNK
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The rows :meth:`stored_ids` names, as (global rows, weights, state) chunks."""
        for ids, vals in self.merged(shard, shards).chunks(chunk_rows):
            yield ids, np.ascontiguousarray(vals[:, : self.dim]), np.ascontiguousarray(vals[:, self.dim :])

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


class Merged:
    """Rows merged from a checkpoint's parts: ``ids`` (n,) ascending global rows, and for
    each the part (``part``) and the position in it (``pos``) its value comes from."""

    def __init__(
        self, ids: np.ndarray, part: np.ndarray, pos: np.ndarray, sources: list[np.ndarray], cols: int
    ) -> None:
        self.ids, self.part, self.pos, self.sources, self.cols = ids, part, pos, sources, cols
        self._reader: CheckpointReader | None = None
        self._over: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def by_row(cls, reader: CheckpointReader, ids: np.ndarray, over: tuple[np.ndarray, np.ndarray] | None) -> Merged:
        """Rows read one by one through ``reader.values`` (a version-2 checkpoint), ``over`` winning."""
        if over is not None:
            ids = np.union1d(ids, over[0])
        m = cls(ids, np.zeros(0, np.int32), np.zeros(0, np.int64), [], reader.cols)
        m._reader, m._over = reader, over
        return m

    def chunks(self, chunk_rows: int = CHUNK) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(global rows (m,), values (m, D + S)) in ascending row order."""
        for a in range(0, len(self.ids), chunk_rows):
            ids = self.ids[a : a + chunk_rows]
            out = np.empty((len(ids), self.cols), np.float32)
            if self._reader is not None:
                w, s = self._reader.values(ids)
                out[:, : w.shape[1]], out[:, w.shape[1] :] = w, s
                if self._over is not None and len(self._over[0]):
                    at = np.minimum(np.searchsorted(self._over[0], ids), len(self._over[0]) - 1)
                    hit = np.flatnonzero(self._over[0][at] == ids)
                    out[hit] = self._over[1][at[hit]]
            else:
                part, pos = self.part[a : a + chunk_rows], self.pos[a : a + chunk_rows]
                for k in np.unique(part):
                    sel = np.flatnonzero(part == k)
                    out[sel] = self.sources[k][pos[sel]]  # positions ascend: a part is read in order
            yield ids, out


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
