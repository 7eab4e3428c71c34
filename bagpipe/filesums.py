"""A file's size and CRC-32, taken while it is written: what checkpoints (MANIFEST.json,
:mod:`bagpipe.checkpoint.verify`) and data sets (meta.json, :mod:`bagpipe.data.integrity`)
record per file so that a reader can tell a whole file from a damaged one.

The JSON files that record those sums carry one of their own content too
(:func:`seal`, :func:`seal_problem`): the CRC-32 of the object's canonical text (sorted
keys, no spaces) without the sum's own key, stored under that key. A change that keeps
valid JSON -- ``"step": 50`` become 51, a table's ``num_rows`` grown -- is found when the
file is read; whitespace and key order, which change no value, are not part of it.

CRC-32 (``zlib.crc32``) guards against damage (a bad disk, a truncated copy, a flipped
bit), not against forgery; zlib computes it at about 1.9 GiB/s on one core here and
releases the GIL while it hashes.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

READ_CHUNK = 8 << 20  # bytes hashed at a time when checking a file


@dataclass(frozen=True)
class FileSum:
    """A file's size and the CRC-32 of its bytes (8 hex digits)."""

    bytes: int
    crc32: str

    @classmethod
    def of(cls, d: FileSum | dict) -> FileSum:
        """From a manifest's (or meta.json's) JSON, or a FileSum already."""
        if isinstance(d, FileSum):
            return d
        return cls(int(d["bytes"]), str(d["crc32"]).lower())

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "crc32": self.crc32}


def crc_hex(crc: int) -> str:
    return f"{crc & 0xFFFFFFFF:08x}"


class SummingFile:
    """A binary file opened for writing that sums what goes through it (size, CRC-32)."""

    def __init__(self, f: BinaryIO):
        self.f = f
        self.crc = 0
        self.size = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.size += len(view)
        return self.f.write(view)

    def flush(self) -> None:
        self.f.flush()

    def tell(self) -> int:
        return self.size

    def sum(self) -> FileSum:
        return FileSum(self.size, crc_hex(self.crc))


def file_crc(path: Path) -> int:
    """CRC-32 of the file at ``path``, read in chunks."""
    crc = 0
    buf = bytearray(READ_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
    return crc & 0xFFFFFFFF


def content_crc(d: dict, key: str) -> str:
    """CRC-32 (8 hex digits) of the JSON object ``d``'s canonical text, ``key`` left out."""
    body = {k: v for k, v in d.items() if k != key}
    return crc_hex(zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()))


def seal(d: dict, key: str) -> dict:
    """``d`` with the CRC-32 of its own content under ``key`` (what a writer stores)."""
    return {**{k: v for k, v in d.items() if k != key}, key: content_crc(d, key)}


def seal_problem(d: dict, key: str) -> str | None:
    """What is wrong with the sum ``d`` carries under ``key`` (None: it matches its content,
    or ``d`` carries none -- whether it must is the reader's rule)."""
    if key not in d:
        return None
    found = content_crc(d, key)
    if str(d[key]).lower() == found:
        return None
    return (
        f"its content does not match the CRC-32 it was written with ({key} {d[key]}, the content's {found}): "
        "it was edited or damaged since it was written"
    )


def sealed_problem(d: dict, key: str, version_key: str, sealed: int) -> str | None:
    """:func:`seal_problem`, and the reader's rule: a ``d`` whose ``version_key`` is ``sealed``
    or later must carry its sum under ``key`` (earlier versions were written without one)."""
    problem = seal_problem(d, key)
    version = d.get(version_key)
    if problem is None and isinstance(version, int) and version >= sealed and key not in d:
        problem = f"it says {version_key} {version}, which carries the CRC-32 of its content ({key}), and has none"
    return problem
