"""Stores: the slow tier of every table's rows and optimizer state (memory, disk)."""

from __future__ import annotations

import shutil
from pathlib import Path

from bagpipe.store.base import EmbeddingStore
from bagpipe.store.init import RowInitializer


def open_store(kind: str, init: RowInitializer, state_dim: int, directory: str | Path | None, *, fresh: bool) -> EmbeddingStore:
    """A ``memory`` or ``disk`` store of the rows ``init`` describes.

    ``directory`` holds a disk store; ``fresh`` empties it first (a run's own store
    starts from scratch, or from its checkpoint), otherwise an existing store is
    opened as it is and its rows are the starting tables.
    """
    if kind == "memory":
        from bagpipe.store.memory import MemoryStore

        return MemoryStore(init, state_dim)
    from bagpipe.store.disk import DiskStore

    path = Path(directory)
    if fresh and path.exists():
        shutil.rmtree(path)
    return DiskStore(init, state_dim, path)
