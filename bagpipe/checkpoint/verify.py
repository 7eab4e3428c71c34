"""Checkpoint files that prove they are whole: a size and a CRC-32 per file, taken while
the file is written, checked before a checkpoint is read.

The manifest (format version 4 and later) records, for every file of a checkpoint -- each part's
``.ids.npy`` and ``.npy``, and ``dense.pt`` -- its size in bytes and the CRC-32 of its
bytes (:class:`FileSum`). The writers hash the bytes as they write them
(:class:`~bagpipe.filesums.SummingFile`, shared with data sets), so a checksum costs no second read. A reader checks every file of
the checkpoint and of the chain it rests on before reading any of them
(:func:`check_file`): a file of another size is *truncated* (or grew), a file of the size
but another CRC-32 was *changed*; either is a one-line :class:`~bagpipe.errors.CheckpointError`
naming the file, what the manifest expects and what was found. Nothing is repaired or
removed.

CRC-32 (``zlib.crc32``) rather than a cryptographic hash: it guards against damage
(a bad disk, a truncated copy, a flipped bit), not against someone forging a file -- a
run folder's writer could rewrite the manifest as well. It detects every single-bit
flip and every burst of up to 32 bits, and zlib computes it about 5x faster than
``hashlib.blake2b`` (1.9 vs 0.4 GiB/s on one core here), so checksums add little to a
checkpoint's write or to a recovery's read. zlib releases the GIL while it hashes, so a
background write does not slow the training thread.

Checkpoints of versions 2 and 3 (written before checksums) are checked by size only:
each ``.npy`` file's size must be what its header's shape says (and, version 3, the
part's files must add up to the part's bytes).

A file checked once (or written) by this process is not hashed again while its inode,
size and modification time stay the same (:data:`_known`): a resume reads the latest
checkpoint more than once (the resume's checks, the disk-space estimate, the restore),
and a compaction merges the chain this process wrote.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import numpy as np

from bagpipe.errors import CheckpointError
from bagpipe.filesums import READ_CHUNK, FileSum, SummingFile, crc_hex, file_crc

__all__ = [
    "READ_CHUNK",
    "FileSum",
    "SummingFile",
    "check_file",
    "check_npy_size",
    "crc_hex",
    "file_crc",
    "forget",
    "npy_size",
    "remember",
]

# (device, inode, size, mtime_ns, ctime_ns) of files this process wrote or checked -> their CRC-32
_known: dict[tuple[int, int, int, int, int], str] = {}
_lock = threading.Lock()


def _key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def remember(path: Path, s: FileSum) -> None:
    """``path`` was just written with the sum ``s`` (it need not be hashed again by this process)."""
    with _lock:
        _known[_key(os.stat(path))] = s.crc32


def forget() -> None:
    """Hash every file again when next checked (tests that damage files in place)."""
    with _lock:
        _known.clear()


def _damaged(path: Path, what: str) -> CheckpointError:
    return CheckpointError(f"{path}: damaged checkpoint file: {what}")


def not_a_file(path: Path, st: os.stat_result | None = None) -> CheckpointError | None:
    """The error for a checkpoint file replaced by a folder (or a pipe, a device), else None:
    its size would otherwise read as a truncated file's."""
    mode = (st or os.stat(path)).st_mode
    if stat.S_ISDIR(mode):
        return _damaged(path, "a folder where a file is expected")
    if not stat.S_ISREG(mode):
        return _damaged(path, "not a regular file (a pipe, socket or device) where a file is expected")
    return None


def check_file(path: Path, expected: FileSum) -> None:
    """``path`` has the size and CRC-32 the manifest recorded, or a one-line CheckpointError."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (the checkpoint is damaged)") from None
    if (wrong := not_a_file(path, st)) is not None:
        raise wrong
    if st.st_size != expected.bytes:
        how = "truncated" if st.st_size < expected.bytes else "longer than written"
        raise _damaged(path, f"expected {expected.bytes:,} bytes, found {st.st_size:,} ({how})")
    key = _key(st)
    with _lock:
        if _known.get(key) == expected.crc32:
            return
    found = crc_hex(file_crc(path))
    if found != expected.crc32:
        raise _damaged(
            path, f"expected CRC-32 {expected.crc32}, found {found} (its bytes changed since it was written)"
        )
    with _lock:
        _known[key] = found


def npy_size(path: Path) -> tuple[int, int]:
    """(size its header's shape implies, size on disk) of the .npy file at ``path``."""
    try:
        if (wrong := not_a_file(path)) is not None:
            raise wrong
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
            if version not in read:
                raise ValueError(f"unknown .npy format version {version}")
            shape, _, dtype = read[version](f)
            implied = f.tell() + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            return implied, os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (the checkpoint is damaged)") from None
    except (ValueError, OSError, EOFError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise _damaged(path, f"not a readable .npy file ({first})") from None


def check_npy_size(path: Path) -> int:
    """An unsummed (version 2 or 3) .npy file is as long as its header says; returns its size."""
    implied, found = npy_size(path)
    if implied != found:
        how = "truncated" if found < implied else "longer than its header says"
        raise _damaged(path, f"expected {implied:,} bytes (its header's shape), found {found:,} ({how})")
    return found
