"""Writing one shard's rows into a checkpoint folder: a full part or a delta part.

The writer is whoever holds the rows: the one-process trainer (its store, or its full
tables) or an embedding server (its shard of the store). Values stream in chunks
(``EXPORT_CHUNK_ROWS``), so a shard larger than memory streams out too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from bagpipe.checkpoint.format import Kind, Part, delta_names, full_name

CHUNK = 1 << 20


class RowSource(Protocol):
    """What a part is written from: a store (or the full tables) in local row order."""

    num_rows: int
    dim: int
    state_dim: int

    def chunks(self) -> Iterator[tuple[int, np.ndarray, np.ndarray]]: ...

    def peek(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def take_dirty(self) -> np.ndarray: ...


def _fsync(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def write_part(folder: Path, source: RowSource, shard: int, shards: int, kind: Kind) -> Part:
    """Write shard ``shard`` of ``shards`` from ``source`` (whose local row l is global
    row l * shards + shard) into ``folder``; a full part holds every row, a delta the
    rows written since the previous part (``source.take_dirty()``, which it resets)."""
    folder = Path(folder)
    cols = source.dim + source.state_dim
    d = source.dim
    if kind == "full":
        source.take_dirty()  # what changed before is in this part
        path = folder / full_name(shard, shards)
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(source.num_rows, cols))
        for a, w, s in source.chunks():
            out[a : a + len(w), :d] = w
            out[a : a + len(w), d:] = s
        out.flush()
        del out
        _fsync(path)
        return Part(shard, shards, "full", source.num_rows, path.stat().st_size)
    local = source.take_dirty()
    ids_name, values_name = delta_names(shard, shards)
    np.save(folder / ids_name, local * shards + shard)
    out = np.lib.format.open_memmap(folder / values_name, mode="w+", dtype=np.float32, shape=(len(local), cols))
    for a in range(0, len(local), CHUNK):
        w, s = source.peek(local[a : a + CHUNK])
        out[a : a + len(w), :d] = w
        out[a : a + len(w), d:] = s
    out.flush()
    del out
    for name in (ids_name, values_name):
        _fsync(folder / name)
    size = sum((folder / n).stat().st_size for n in (ids_name, values_name))
    return Part(shard, shards, "delta", len(local), size)
