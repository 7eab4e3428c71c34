"""Stores: the slow tier of every table's rows and optimizer state (memory, disk)."""

from __future__ import annotations

import shutil
from pathlib import Path

from bagpipe.errors import ConfigError
from bagpipe.store.base import EmbeddingStore
from bagpipe.store.diskio import DiskIO
from bagpipe.store.init import RowValues


def holds_store(directory: str | Path) -> bool:
    """Whether ``directory`` holds a disk store (its header is written last, at creation)."""
    return (Path(directory) / "header.json").exists()


def open_store(
    kind: str,
    init: RowValues,
    state_dim: int,
    directory: str | Path | None,
    *,
    owned: bool,
    reuse: bool = False,
    io: DiskIO | None = None,
) -> EmbeddingStore:
    """A ``memory`` or ``disk`` store of the rows ``init`` describes.

    ``owned``: ``directory`` is the run's own (RUN/store): it is emptied first, since a
    run starts from the initial tables or from its checkpoint. Otherwise (a user's
    ``--store-dir``) a directory that already holds a store is opened only when
    ``reuse`` says so: its rows then become the starting tables, which a run must ask
    for (``--init-from-store``), never get by accident. ``io``: the disk store's memory
    settings (:class:`~bagpipe.store.diskio.DiskIO`; its defaults when None).
    """
    if kind == "memory":
        from bagpipe.store.memory import MemoryStore

        return MemoryStore(init, state_dim)
    from bagpipe.store.disk import DiskStore

    if directory is None:
        raise ValueError("a disk store needs a directory")
    path = Path(directory)
    if owned and path.exists():
        shutil.rmtree(path)
    if not owned:
        if holds_store(path) and not reuse:
            raise ConfigError(
                f"--store-dir {path} already holds a store: its rows would become this run's starting tables; "
                "pass --init-from-store to start from them, or give an empty directory"
            )
        if reuse and not holds_store(path):
            raise ConfigError(f"--init-from-store: {path} holds no store to start from")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--store-dir {path}: cannot create the store's directory ({e.strerror})") from None
    return DiskStore(init, state_dim, path, io=io)
