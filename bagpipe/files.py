"""Durable files: a write either happens completely or not at all, and survives a crash;
and :class:`RunLock`, one user of a folder at a time."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from bagpipe.errors import ConfigError


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write a text file so that readers see either the old or the new content."""
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # never a temporary file left beside the target
        raise
    fsync_dir(path.parent)


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w"):
    """Write a file that appears only complete: yields an open file beside ``path``
    (``.NAME.tmp-PID``), fsynced and renamed onto ``path`` when the block ends, removed
    if it fails. A device such as /dev/null (anything but a regular file or nothing) is
    written directly."""
    path = Path(path)
    if path.exists() and not path.is_file():
        with open(path, mode) as f:
            yield f
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def check_out_file(path: str | os.PathLike, flag: str, inputs: dict | None = None) -> Path:
    """Refuse, in one line and before anything is written, an output file that cannot be
    written whole or would destroy an input: a directory, a path in a folder that does not
    exist, one of the command's inputs (``inputs``: flag -> paths) or a path inside an
    input folder. Returns the path."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; give the file to write")
    parent = path.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: the folder {parent} does not exist")
    real = os.path.realpath(path)
    for opt, paths in (inputs or {}).items():
        for p in paths:
            if not p:
                continue
            r = os.path.realpath(p)
            if real == r or (os.path.isdir(r) and real.startswith(r.rstrip(os.sep) + os.sep)):
                what = "is" if real == r else "lies inside"
                raise ConfigError(
                    f"{flag} {path} {what} {opt} {p}: writing it would destroy an input; choose another {flag}"
                )
    return path


def fsync_dir(directory: str | os.PathLike) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RunLock:
    """One user of a folder at a time: an exclusive ``flock`` on a lock file for the life
    of the run (the run folder's RUN/.lock, a store directory's DIR/.lock, the lock beside
    a dataset or export being built).

    The kernel drops a ``flock`` when its holder dies however it dies (even SIGKILL), so
    a lock left by a dead process never blocks the next run; the file keeps the last
    holder's pid, host and start time, which a refused run names. ``what`` and ``hint``
    make the refusal's message (``runs/a is in use by another run (...); wait for it to
    end or choose another --out``).
    """

    def __init__(self, path: Path, what: str | None = None, hint: str = "wait for it to end or choose another --out"):
        self.path = Path(path)
        self.what = what if what is not None else str(self.path.parent)
        self.hint = hint
        self.fd: int | None = None

    def acquire(self) -> None:
        for _ in range(3):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise ConfigError(f"{self.what} is in use by another run ({holder}); {self.hint}") from None
            try:  # a holder that removes its lock file on release may have done so meanwhile
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:
            raise ConfigError(f"{self.what}: its lock file {self.path} keeps changing; {self.hint}")
        os.ftruncate(fd, 0)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv[:3]),
        }
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (ValueError, KeyError, OSError):
        return "holder unknown"
