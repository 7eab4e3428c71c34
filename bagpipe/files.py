"""Durable files: a write either happens completely or not at all, and survives a crash."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write a text file so that readers see either the old or the new content."""
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: str | os.PathLike) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
