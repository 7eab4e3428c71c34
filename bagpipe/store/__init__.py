"""Stores: the slow tier of every table's rows and optimizer state (memory, disk)."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from bagpipe.errors import BagpipeError, ConfigError
from bagpipe.files import RunLock
from bagpipe.store.base import EmbeddingStore
from bagpipe.store.diskio import DiskIO
from bagpipe.store.init import RowValues
from bagpipe.store.layout import RowLayout

LOCK = ".lock"  # the store directory's lock file (one run at a time)

log = logging.getLogger(__name__)


def holds_store(directory: str | Path) -> bool:
    """Whether ``directory`` holds a disk store: a DiskStore header (written last, at
    creation) -- not merely a file named header.json."""
    import json

    try:
        header = json.loads((Path(directory) / "header.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(header, dict) and header.get("format") == "bagpipe.DiskStore"


def damaged_header(directory: str | Path) -> str | None:
    """Why ``directory``'s header.json is a damaged store header -- a header.json beside a
    store's rows.f32 and present.u8 that is not readable JSON of a DiskStore -- or None."""
    import json

    d = Path(directory)
    if not ((d / "header.json").is_file() and (d / "rows.f32").exists() and (d / "present.u8").exists()):
        return None
    try:
        header = json.loads((d / "header.json").read_text())
    except (OSError, ValueError) as e:
        return f"{d / 'header.json'}: the store's header is damaged ({str(e).splitlines()[0]}); its rows are kept: restore the header or give another --store-dir"
    if not isinstance(header, dict) or header.get("format") != "bagpipe.DiskStore":
        return f"{d / 'header.json'}: the store's header is damaged (not a DiskStore header); its rows are kept: restore the header or give another --store-dir"
    return None


#: What a disk store writes in its directory (bagpipe/store/disk.py) -- anything else in a
#: user's --store-dir is not a store's, and its rows.f32 would be overwritten without a word.
STORE_FILES = frozenset({"header.json", "rows.f32", "present.u8", "layout.i64", "log.i32", LOCK})


def check_users_store_dir(path: Path, reuse: bool, must_exist: bool = False) -> None:
    """Refuse a user's ``--store-dir`` that holds anything but a bagpipe store, a damaged
    store, or a store the run was not asked to start from (``reuse``: it may open one;
    ``must_exist``: ``--init-from-store``, it must find one), in one line, before anything
    is written there. Reads only: ``bagpipe plan`` refuses with it what ``train`` refuses."""
    why = damaged_header(path)
    if why is not None:
        raise ConfigError(why)
    if must_exist and not holds_store(path):
        raise ConfigError(f"--init-from-store: {path} holds no store to start from")
    if not path.is_dir():
        return
    names = sorted(p.name for p in path.iterdir())
    ours = holds_store(path)
    foreign = [n for n in names if n not in STORE_FILES or (n == "header.json" and not ours)]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ConfigError(
            f"--store-dir {path} holds files that are not a bagpipe store's ({shown}): a store writes its rows.f32 "
            "and present.u8 there and would overwrite such files; give an empty or new directory"
        )
    if not ours and not set(names) <= {LOCK}:  # a store's names without its header
        raise ConfigError(
            f"--store-dir {path} holds files that are not a bagpipe store's ({', '.join(n for n in names if n != LOCK)}"
            ": a store's names but no header.json -- files of your own, or a store whose making was stopped): a "
            "store writes its rows.f32 and present.u8 there and would overwrite them; remove them or give an empty "
            "or new directory"
        )
    if ours and not reuse:
        raise ConfigError(
            f"--store-dir {path} already holds a store: its rows would become this run's starting tables; "
            "pass --init-from-store to start from them, or give an empty directory"
        )


def drop_unused_store(path: Path, used: str | Path | None) -> None:
    """Remove the store a run kept in its own folder ``path`` (RUN/store) when the run now
    keeps its rows elsewhere (``used``: its --store-dir, or None: the memory store or no
    store): a resume to another store left it there, stale -- hundreds of MB to GB -- while
    the run's checkpoints hold its rows (newcomer round 21). Only a store's own files go
    (its lock too, when no process holds it); anything else in the folder stays."""
    if not path.is_dir() or path.is_symlink() or not holds_store(path):
        return
    if used is not None and os.path.realpath(used) == os.path.realpath(path):
        return
    lock = RunLock(path / LOCK, what=f"the run's old store {path}", hint="")
    try:
        lock.acquire()
    except BagpipeError:  # another process holds it: not ours to remove
        return
    try:
        gone = 0
        for name in sorted(STORE_FILES - {LOCK}):
            f = path / name
            if f.is_file() and not f.is_symlink():
                gone += f.stat().st_blocks * 512
                f.unlink()
    finally:
        lock.release()
    (path / LOCK).unlink(missing_ok=True)
    if not any(path.iterdir()):
        path.rmdir()
    log.info(
        f"removed {path} ({gone / 2**20:,.0f} MB on disk): this run keeps its rows "
        f"{f'in {used}' if used else 'in memory'}, and its checkpoints hold them"
    )


def open_store(
    kind: str,
    init: RowValues,
    state_dim: int,
    directory: str | Path | None,
    *,
    owned: bool,
    reuse: bool = False,
    io: DiskIO | None = None,
    layout: RowLayout | Callable[[], RowLayout] | None = None,
    must_exist: bool = False,
) -> EmbeddingStore:
    """A ``memory`` or ``disk`` store of the rows ``init`` describes.

    ``owned``: ``directory`` is the run's own (RUN/store): it is emptied first, since a
    run starts from the initial tables or from its checkpoint. Otherwise (a user's
    ``--store-dir``) a directory that already holds a store is opened only when
    ``reuse`` says so: its rows then become the starting tables, which a run must ask
    for (``--init-from-store``: ``must_exist``, or a resume of the run that made it), never
    get by accident. ``io``: the disk store's memory
    settings (:class:`~bagpipe.store.diskio.DiskIO`; its defaults when None). ``layout``:
    the row layout of a disk store made here (:mod:`bagpipe.store.layout`), or what makes
    it, called only if a store is made (after the lock is taken); a store that
    is reopened keeps its own.
    """
    if kind == "memory":
        from bagpipe.store.memory import MemoryStore

        return MemoryStore(init, state_dim)
    from bagpipe.store.disk import DiskStore

    if directory is None:
        raise ValueError("a disk store needs a directory")
    path = Path(directory)
    flag = "--store-dir" if not owned else "the run's store folder"
    if not owned:  # a user's folder: refused before anything (its lock included) is written in it
        check_users_store_dir(path, reuse, must_exist)
    elif path.is_symlink():  # the run's own store is emptied at start: never through a link (round 19)
        raise ConfigError(
            f"{path} is a symbolic link (to {os.readlink(path)}): the run's own store folder is emptied when a run "
            "starts, so it is not followed; remove the link (or give the folder as --store-dir)"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot create the store's directory ({e.strerror})") from None
    # one run per store, held for the run's life: a second run writing the same rows
    # file would silently change the first one's results
    lock = RunLock(path / LOCK, what=f"--store-dir {path}", hint="wait for it to end or give another --store-dir")
    lock.acquire()
    try:
        if owned:
            for child in path.iterdir():  # the run's own store starts empty (its lock stays)
                if child.name != LOCK:
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        else:  # again under the lock: another run may have made a store there since the check
            check_users_store_dir(path, reuse, must_exist)
        return DiskStore(init, state_dim, path, io=io, lock=lock, layout=layout)
    except BaseException:
        lock.release()
        raise
