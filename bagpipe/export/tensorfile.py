"""safetensors files written chunk by chunk, and tensors read back memory-mapped.

The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header
size N; N bytes of JSON, ``{name: {"dtype": "F32", "shape": [...], "data_offsets":
[begin, end]}, "__metadata__": {str: str}}`` (padded with spaces to a multiple of 8);
then every tensor's bytes, row-major and little-endian, at its offsets counted from
the end of the header. The header needs only the shapes, so :func:`write` emits it
first and then streams each tensor from an iterator of row blocks: a table larger
than memory passes through one chunk at a time. Files are written under a temporary
name, fsynced and renamed. Reading: the ``safetensors`` package (``safe_open``) or
:func:`open_tensor`, a read-only ``numpy.memmap`` of one tensor (nothing is loaded
until rows are indexed).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bagpipe.errors import DataError
from bagpipe.filesums import FileSum, SummingFile

DTYPES: dict[np.dtype, str] = {np.dtype("<f4"): "F32", np.dtype("<i8"): "I64"}
_BY_NAME: dict[str, np.dtype] = {v: k for k, v in DTYPES.items()}


@dataclass
class Entry:
    """One tensor to write: ``chunks()`` yields its rows in order as arrays of ``dtype``
    whose first axis splits ``shape[0]`` (any sizes; together exactly ``shape``)."""

    name: str
    shape: tuple[int, ...]
    chunks: Callable[[], Iterable[np.ndarray]]
    dtype: np.dtype = np.dtype("<f4")

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def write(path: str | os.PathLike, entries: list[Entry], metadata: dict[str, str] | None = None) -> FileSum:
    """Write ``entries`` into one safetensors file at ``path``; returns the file's size and
    CRC-32, summed as it was written (model.json records them: no second read)."""
    path = Path(path)
    header: dict = {}
    offset = 0
    for e in entries:
        header[e.name] = {"dtype": DTYPES[e.dtype], "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    header["__metadata__"] = dict(metadata or {})
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    tmp = path.with_name(f".tmp-{path.name}")
    with open(tmp, "wb") as raw:
        f = SummingFile(raw)
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for e in entries:
            written = 0
            for chunk in e.chunks():
                chunk = np.ascontiguousarray(chunk, dtype=e.dtype)
                if chunk.shape[1:] != tuple(e.shape[1:]):
                    raise ValueError(f"{e.name}: chunk of shape {chunk.shape} does not fit {e.shape}")
                f.write(chunk.data)
                written += chunk.nbytes
            if written != e.nbytes:
                raise ValueError(f"{e.name}: wrote {written} bytes, its shape {e.shape} needs {e.nbytes}")
        f.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, path)
    return f.sum()


def read_header(path: str | os.PathLike) -> tuple[dict, int]:
    """(the JSON header, the file offset where the data starts) of a safetensors file."""
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as e:
        raise DataError(f"{path}: not a readable safetensors file ({e})") from None
    return header, 8 + n


def open_tensor(path: str | os.PathLike, name: str) -> np.ndarray:
    """Tensor ``name`` of the safetensors file ``path`` as a read-only memory map."""
    header, start = read_header(path)
    if not isinstance(header, dict) or name not in header:
        raise DataError(f"{path}: has no tensor {name!r}")
    try:
        info = header[name]
        begin, end = info["data_offsets"]
        shape = tuple(int(n) for n in info["shape"])
        dtype = _BY_NAME[info["dtype"]]
        need = start + int(end)
        have = os.path.getsize(path)
        if have < need or int(end) - int(begin) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise DataError(f"{path}: truncated or damaged ({have:,} bytes, tensor {name!r} needs {need:,})")
        return np.memmap(path, dtype=dtype, mode="r", offset=start + int(begin), shape=shape)
    except (KeyError, TypeError, ValueError, OSError) as e:
        raise DataError(f"{path}: tensor {name!r} unreadable ({type(e).__name__}: {e})") from None
