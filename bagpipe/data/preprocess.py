"""Shared machinery of ``bagpipe preprocess``: raw logs -> binary shards.

The pipeline, for every format (:mod:`bagpipe.data.criteo`, :mod:`~bagpipe.data.avazu`,
:mod:`~bagpipe.data.taobao`):

1. *probe*: every input file exists, has at least one data line; a CSV header is
   recognised (or refused with ``--no-header``).
2. *count* (only for ``0 < --split < 1``): newlines per file, so the first
   ``floor(split * N)`` data lines can go to ``train``.
3. *vocabulary* (vocabulary mode only): every ``--input`` line is parsed, the
   categorical keys of the train lines are counted, and the parsed blocks are kept in
   a spill file next to the output directory.
4. *write*: every line is parsed (or replayed from the spill), its categorical values
   mapped to ids (vocabulary or hashing), and rows appended to a
   :class:`~bagpipe.data.shards.ShardWriter`, which writes shards as they fill and
   ``meta.json`` last.

Reading is streaming: files (plain or gzip) are read in byte blocks cut at newline
boundaries, so line numbers are exact (1-based, a header counts as line 1). Each block
is parsed by a vectorised *fast path* that either accepts the whole block or declines;
a declined block is bisected into smaller pieces and, at the bottom, parsed line by line
by the format's exact reference parser, which names the bad lines. Blocks are parsed
on a thread pool (numpy and pyarrow release the GIL) and consumed strictly in order, so
the output does not depend on the number of threads or the block size.

Categorical values become int64 *keys* (Criteo: the hex value; CSV formats: a 63-bit
FNV-1a hash of the bytes; a missing value is the key -1) and keys become ids:

* hashing (``--max-rows-per-table M``): ``id = key % M``, a missing value -> 0 (as DLRM's
  ``max-ind-range``);
* vocabulary (``--min-count K``, the default with K = 1): keys seen at least K times in
  the train lines get ids 1.. in increasing key order; rarer and unseen keys share row 0.

The mapping is saved in ``OUT/vocab`` (``vocab.json`` plus, per feature,
``<name>.keys.npy`` and ``<name>.counts.npy``: every distinct key of the train lines,
sorted, with its count) and reused by ``--vocab-from DIR``.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from bagpipe.data.schema import META_FILE, FeatureSpec, read_json
from bagpipe.data.shards import DEFAULT_ROWS_PER_SHARD, ShardWriter
from bagpipe.errors import ConfigError, DataError, ParseError

VOCAB_DIR = "vocab"
VOCAB_FILE = "vocab.json"
VOCAB_VERSION = 1
MISSING_KEY = -1
DEFAULT_BLOCK_BYTES = 8 << 20
MAX_BAD_EXAMPLES = 10


class BadLine(Exception):
    """Raised by a format's line parser; the message is the problem (no file/line)."""


def show(value: bytes, limit: int = 40) -> str:
    """A bad field for an error message: quoted, control bytes escaped, truncated."""
    s = value.decode("utf-8", "backslashreplace")
    if len(s) > limit:
        s = s[:limit] + "..."
    return repr(s)


# ---------------------------------------------------------------------------------
# Vectorised field parsing (SWAR on 8-byte words, in cache-sized chunks)
# ---------------------------------------------------------------------------------

_U = np.uint64
_CHUNK = 1 << 15
_H = _U(0x8080808080808080)
_LOW_NIBBLES = _U(0x0F0F0F0F0F0F0F0F)
_ONE_PER_BYTE = _U(0x0101010101010101)
_CASE_BIT = _U(0x2020202020202020)
_ASCII_ZEROS = 0x3030303030303030


def _ge_const(lo: int) -> np.uint64:
    # x + (0x80 - lo) per byte sets the byte's high bit iff x >= lo (for x < 0x80).
    return _U((0x80 - lo) * 0x0101010101010101)


_GE_0 = _ge_const(0x30)
_GE_COLON = _ge_const(0x3A)
_GE_a = _ge_const(0x61)
_GE_g = _ge_const(0x67)
# For a field of L <= 8 bytes read as a little-endian word w: keep its L bytes, move
# them to the top (the last character is the least significant digit) and fill the
# bottom with ASCII '0', so "1f" and "0000001f" give the same word.
_KEEP = np.array([(1 << (8 * n)) - 1 for n in range(9)], dtype=np.uint64)
_SHIFT = np.array([0] + [8 * (8 - n) for n in range(1, 9)], dtype=np.uint64)
_FILL = np.array([_ASCII_ZEROS & ((1 << (8 * (8 - n))) - 1) for n in range(9)], dtype=np.uint64)


def padded(data: bytes) -> np.ndarray:
    """``data`` as uint8 with 8 zero bytes appended (so any 8-byte word read is in bounds)."""
    arr = np.empty(len(data) + 8, dtype=np.uint8)
    arr[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    arr[len(data) :] = 0
    return arr


def words(arr: np.ndarray) -> np.ndarray:
    """An (unaligned) uint64 view of ``arr`` with a stride of one byte: ``words(a)[i]``
    is the little-endian word of bytes ``a[i:i+8]``."""
    return np.ndarray(shape=(len(arr) - 7,), dtype="<u8", buffer=arr, strides=(1,))


def _aligned_words(wview: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    w = wview[start]
    w &= _KEEP[length]
    w <<= _SHIFT[length]
    w |= _FILL[length]
    return w


class _Scratch:
    """Three reusable uint64 buffers of one chunk (each call makes its own: thread-safe)."""

    def __init__(self) -> None:
        self.a = np.empty(_CHUNK, dtype=np.uint64)
        self.b = np.empty(_CHUNK, dtype=np.uint64)
        self.c = np.empty(_CHUNK, dtype=np.uint64)

    def get(self, k: int):
        return self.a[:k], self.b[:k], self.c[:k]


def _digit_bits(x: np.ndarray, A: np.ndarray, B: np.ndarray) -> bool:
    """False if a byte of x is not ASCII; else A holds, per byte, its high bit set iff
    the byte is '0'..'9' (B is scratch)."""
    np.bitwise_and(x, _H, out=A)
    if A.any():
        return False
    np.add(x, _GE_0, out=A)
    np.add(x, _GE_COLON, out=B)
    np.invert(B, out=B)
    np.bitwise_and(A, B, out=A)
    return True


def _all_ascii_digits(x: np.ndarray, A: np.ndarray, B: np.ndarray) -> bool:
    """Every byte of every word of x is '0'..'9'."""
    if not _digit_bits(x, A, B):
        return False
    np.bitwise_and(A, _H, out=A)
    return bool((A == _H).all())


def _all_ascii_hex(x: np.ndarray, A: np.ndarray, B: np.ndarray, C: np.ndarray) -> bool:
    """Every byte of every word of x is '0'..'9', 'a'..'f' or 'A'..'F'."""
    if not _digit_bits(x, A, B):  # digits
        return False
    np.bitwise_or(x, _CASE_BIT, out=C)
    np.add(C, _GE_a, out=B)
    np.add(C, _GE_g, out=C)
    np.invert(C, out=C)
    np.bitwise_and(B, C, out=B)  # letters
    np.bitwise_or(A, B, out=A)
    np.bitwise_and(A, _H, out=A)
    return bool((A == _H).all())


def _combine_bytes(v: np.ndarray, B: np.ndarray, base: int) -> None:
    """In place: 8 digits of ``base`` (10 or 16), one per byte, most significant first
    (byte 0), -> their value. Three multiply-shift-mask steps (pairs, quads, all)."""
    np.multiply(v, _U(base * 256 + 1), out=v)
    np.right_shift(v, _U(8), out=v)
    np.bitwise_and(v, _U(0x00FF00FF00FF00FF), out=v)
    np.multiply(v, _U(base * base * 65536 + 1), out=v)
    np.right_shift(v, _U(16), out=v)
    np.bitwise_and(v, _U(0x0000FFFF0000FFFF), out=v)
    np.multiply(v, _U((base**4 << 32) + 1), out=v)
    np.right_shift(v, _U(32), out=v)


def parse_decimals(arr: np.ndarray, wview: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """Fields ``arr[start:end]`` as int64: ``-?[0-9]{1,8}``, empty -> 0.

    Returns None if any field is anything else (including longer numbers, which the
    exact line parser then handles)."""
    length = end - start
    m = len(start)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    neg = arr[start] == 0x2D
    neg &= length > 0
    dstart = start + neg
    dlen = length - neg
    if int(dlen.max()) > 8 or (neg & (dlen == 0)).any():
        return None
    out = _aligned_words(wview, dstart, dlen)
    sc = _Scratch()
    for s in range(0, m, _CHUNK):
        x = out[s : s + _CHUNK]
        A, B, _ = sc.get(len(x))
        if not _all_ascii_digits(x, A, B):
            return None
        np.subtract(x, _U(_ASCII_ZEROS), out=x)
        _combine_bytes(x, B, 10)
    val = out.view(np.int64)
    np.negative(val, out=val, where=neg)
    return val


def parse_hex_keys(wview: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """Fields ``[start:end)`` as int64 keys: ``[0-9a-fA-F]{1,8}`` -> its value, empty ->
    :data:`MISSING_KEY`. Returns None for anything else (longer values included)."""
    length = end - start
    m = len(start)
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    empty = length == 0
    full = length == 8
    if bool((empty | full).all()):  # the usual case: 8 hex digits or nothing
        out = wview[start]
        np.copyto(out, _U(_ASCII_ZEROS), where=empty)
    elif int(length.max()) > 8:
        return None
    else:
        out = _aligned_words(wview, start, length)
    sc = _Scratch()
    for s in range(0, m, _CHUNK):
        x = out[s : s + _CHUNK]
        A, B, C = sc.get(len(x))
        if not _all_ascii_hex(x, A, B, C):
            return None
        # nibble = (c & 0xF) + 9 * (c has bit 6, i.e. is a letter)
        np.right_shift(x, _U(6), out=A)
        np.bitwise_and(A, _ONE_PER_BYTE, out=A)
        np.multiply(A, _U(9), out=A)
        np.bitwise_and(x, _LOW_NIBBLES, out=x)
        np.add(x, A, out=x)
        _combine_bytes(x, B, 16)
    keys = out.view(np.int64)
    np.copyto(keys, MISSING_KEY, where=empty)
    return keys


_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK63 = (1 << 63) - 1


def fnv1a_keys(data: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Keys of string fields ``data[start:end]``: 64-bit FNV-1a of the bytes with the top
    bit cleared; an empty field is :data:`MISSING_KEY`. Vectorised over fields."""
    length = end - start
    h = np.full(len(start), _FNV_OFFSET, dtype=np.uint64)
    act = np.flatnonzero(length > 0)
    k = 0
    prime = _U(_FNV_PRIME)
    while act.size:
        b = data[start[act] + k].astype(np.uint64)
        hk = h[act]
        hk ^= b
        hk *= prime
        h[act] = hk
        k += 1
        act = act[length[act] > k]
    keys = (h & _U(_MASK63)).view(np.int64)
    keys[length == 0] = MISSING_KEY
    return keys


def fnv1a_key(value: bytes) -> int:
    """The key of one string value (the reference of :func:`fnv1a_keys`)."""
    if not value:
        return MISSING_KEY
    h = _FNV_OFFSET
    for b in value:
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h & _MASK63


def log1p_clipped(x: np.ndarray) -> np.ndarray:
    """DLRM's dense transform: float32(log(1 + max(x, 0))), computed in float64."""
    x = np.asarray(x, dtype=np.float64)
    return np.log1p(np.maximum(x, 0.0)).astype(np.float32)


def binary_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data uint8, start, end) of a pyarrow binary/string array without nulls."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if arr.type in (pa.large_binary(), pa.large_string()):
        odt = np.int64
    else:
        odt = np.int32
    _, obuf, dbuf = arr.buffers()
    offsets = np.frombuffer(obuf, dtype=odt, count=len(arr) + 1, offset=arr.offset * np.dtype(odt).itemsize)
    offsets = offsets.astype(np.int64)
    data = np.frombuffer(dbuf, dtype=np.uint8) if dbuf is not None and dbuf.size else np.zeros(0, np.uint8)
    return data, offsets[:-1], offsets[1:]


# ---------------------------------------------------------------------------------
# Parsed blocks
# ---------------------------------------------------------------------------------


@dataclass
class Raw:
    """Parsed valid lines of (part of) a block, before categorical mapping.

    rows: (n,) 0-based offsets of the lines inside the block; labels (n,) float32;
    dense (n, Dd) float64 raw numbers (missing = 0), transformed later; keys (Fk, n)
    int64 categorical keys, feature-major; fixed (n, Ff) int64 ids of fixed-size
    features; seqs: one (keys (nnz,), lengths (n,)) per multi-hot feature.
    """

    rows: np.ndarray
    labels: np.ndarray
    dense: np.ndarray
    keys: np.ndarray
    fixed: np.ndarray
    seqs: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, mask: np.ndarray) -> "Raw":
        seqs = []
        for values, lengths in self.seqs:
            owner = np.repeat(np.arange(len(lengths)), lengths)
            seqs.append((values[mask[owner]], lengths[mask]))
        return Raw(self.rows[mask], self.labels[mask], self.dense[mask], self.keys[:, mask], self.fixed[mask], seqs)


def concat_raw(parts: list[Raw], empty: Raw) -> Raw:
    parts = [p for p in parts if len(p)]
    if not parts:
        return empty
    if len(parts) == 1:
        return parts[0]
    seqs = []
    for j in range(len(parts[0].seqs)):
        seqs.append(
            (np.concatenate([p.seqs[j][0] for p in parts]), np.concatenate([p.seqs[j][1] for p in parts]))
        )
    return Raw(
        rows=np.concatenate([p.rows for p in parts]),
        labels=np.concatenate([p.labels for p in parts]),
        dense=np.concatenate([p.dense for p in parts]),
        keys=np.concatenate([p.keys for p in parts], axis=1),
        fixed=np.concatenate([p.fixed for p in parts]),
        seqs=seqs,
    )


@dataclass
class Row:
    """One line parsed by a format's exact line parser."""

    label: int
    dense: list
    keys: list[int]
    fixed: list[int] = field(default_factory=list)
    seqs: list[list[int]] = field(default_factory=list)


# ---------------------------------------------------------------------------------
# Formats
# ---------------------------------------------------------------------------------


@dataclass
class Layout:
    """How one file's lines are laid out: column names in order and header lines."""

    names: list[str]
    header_lines: int = 0


class RawFormat:
    """A raw log format. Subclasses set the schema and implement the two parsers.

    ``parse_fast`` must either return the exact result of ``parse_line`` for *every*
    line of the chunk or return None; it never raises for bad data.
    """

    name = "?"
    key_kind = "?"  # how values become keys: "hex" or "fnv1a64"
    dense_names: list[str] = []
    key_features: list[str] = []  # one-hot features with keys (vocabulary / hashing)
    fixed_features: list[tuple[str, int]] = []  # one-hot features with fixed tables
    seq_features: list[str] = []  # multi-hot features with keys
    feature_order: list[str] = []  # the schema order of all features

    def __init__(self, labelled: bool = True, header: str = "auto"):
        self.labelled = labelled
        self.header = header

    # -- layout ---------------------------------------------------------------
    def layout(self, path: str, first_line: bytes) -> Layout:
        raise NotImplementedError

    # -- parsing --------------------------------------------------------------
    def parse_fast(self, data: bytes, nlines: int, layout: Layout) -> Raw | None:
        return None

    def parse_line(self, line: bytes, layout: Layout) -> Row:
        raise NotImplementedError

    def empty_raw(self) -> Raw:
        return Raw(
            rows=np.zeros(0, np.int64),
            labels=np.zeros(0, np.float32),
            dense=np.zeros((0, len(self.dense_names)), np.float64),
            keys=np.zeros((len(self.key_features), 0), np.int64),
            fixed=np.zeros((0, len(self.fixed_features)), np.int64),
            seqs=[(np.zeros(0, np.int64), np.zeros(0, np.int64)) for _ in self.seq_features],
        )

    def rows_to_raw(self, rows: list[Row], offsets: list[int]) -> Raw:
        n = len(rows)
        if n == 0:
            return self.empty_raw()
        seqs = []
        for j in range(len(self.seq_features)):
            vals = [r.seqs[j] for r in rows]
            seqs.append(
                (
                    np.array([k for v in vals for k in v], dtype=np.int64),
                    np.array([len(v) for v in vals], dtype=np.int64),
                )
            )
        return Raw(
            rows=np.array(offsets, dtype=np.int64),
            labels=np.array([r.label for r in rows], dtype=np.float32),
            dense=np.array([r.dense for r in rows], dtype=np.float64).reshape(n, len(self.dense_names)),
            keys=np.array([r.keys for r in rows], dtype=np.int64).reshape(n, len(self.key_features)).T.copy(),
            fixed=np.array([r.fixed for r in rows], dtype=np.int64).reshape(n, len(self.fixed_features)),
            seqs=seqs,
        )

    def transform_dense(self, dense: np.ndarray) -> np.ndarray:
        return log1p_clipped(dense)

    # -- block parsing with exact fallback -------------------------------------
    def parse_block(self, data: bytes, nlines: int, layout: Layout, stop_at_bad: bool) -> tuple[Raw, list[tuple[int, str]]]:
        """Parse a block of ``nlines`` complete lines (``data`` ends with a newline).

        Returns the valid lines and ``[(offset, problem)]`` of the bad ones (offsets
        0-based inside the block). With ``stop_at_bad`` parsing stops at the first bad
        line.
        """
        raw = self.parse_fast(data, nlines, layout)
        if raw is not None:
            return raw, []
        lines = data.split(b"\n")
        lines.pop()  # data ends with "\n"
        parts: list[Raw] = []
        bad: list[tuple[int, str]] = []
        self._bisect(lines, 0, len(lines), layout, parts, bad, stop_at_bad)
        return concat_raw(parts, self.empty_raw()), bad

    def _bisect(self, lines, lo, hi, layout, parts, bad, stop) -> None:
        n = hi - lo
        if n <= 16:
            rows, offs = [], []
            for i in range(lo, hi):
                try:
                    row = self.parse_line(lines[i], layout)
                except BadLine as e:
                    bad.append((i, str(e)))
                    if stop:
                        break
                    continue
                rows.append(row)
                offs.append(i)
            parts.append(self.rows_to_raw(rows, offs))
            return
        step = -(-n // 8)
        for s in range(lo, hi, step):
            e = min(s + step, hi)
            raw = self.parse_fast(b"\n".join(lines[s:e]) + b"\n", e - s, layout)
            if raw is not None:
                raw.rows += s
                parts.append(raw)
            else:
                self._bisect(lines, s, e, layout, parts, bad, stop)
            if stop and bad:
                return


def strip_cr(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\r") else line


# ---------------------------------------------------------------------------------
# Input files
# ---------------------------------------------------------------------------------


def open_input(path: str | os.PathLike) -> tuple[io.BufferedIOBase, io.BufferedIOBase]:
    """(reader, raw file): ``reader`` yields the text (gunzipped if the file starts with
    the gzip magic); ``raw.tell()`` is the position in the file on disk."""
    try:
        raw = open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not an input file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot open ({e.strerror})") from None
    magic = raw.peek(2)[:2]
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    return raw, raw


def _read(reader, n: int, path) -> bytes:
    try:
        return reader.read(n)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"{path}: cannot read ({e})") from None


@dataclass
class InputFile:
    path: str
    role: str  # "input" (split by --split) or "eval" or "test"
    layout: Layout | None = None
    size: int = 0  # bytes on disk
    lines: int | None = None  # data lines (after counting or writing)
    text_bytes: int = 0  # bytes of text read in the write pass


_PROBE_LIMIT = 16 << 20


def probe(fmt: RawFormat, f: InputFile) -> None:
    """Check the file opens and has a data line; detect its layout (header)."""
    if not os.path.exists(f.path):
        raise DataError(f"{f.path}: no such file")
    reader, raw = open_input(f.path)
    try:
        try:
            first = reader.readline(_PROBE_LIMIT)
            second = reader.readline(_PROBE_LIMIT) if first else b""
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise DataError(f"{f.path}: cannot read ({e})") from None
        f.size = os.fstat(raw.fileno()).st_size
    finally:
        reader.close()
        raw.close()
    if not first:
        raise DataError(f"{f.path}: empty input (no lines)")
    f.layout = fmt.layout(f.path, strip_cr(first.rstrip(b"\n")))
    if f.layout.header_lines and not second:
        raise DataError(f"{f.path}: empty input (only a header line)")


@dataclass
class Block:
    file: InputFile
    data: bytes
    nlines: int
    first_line: int  # 1-based line number of the block's first line in its file
    first_index: int  # 0-based index of its first data line in the file
    disk_bytes: int  # bytes of the file on disk consumed since the previous block
    global_start: int = 0  # index of the first line among all --input data lines
    data_len: int = 0  # bytes of text (kept when ``data`` is dropped)


def iter_blocks(f: InputFile, block_bytes: int) -> Iterator[Block]:
    """Blocks of whole lines of ``f`` (header skipped). A last line without newline gets
    one."""
    reader, raw = open_input(f.path)
    try:
        line_no = 1
        if f.layout is not None and f.layout.header_lines:
            reader.readline()
            line_no += f.layout.header_lines
        index = 0
        pos = raw.tell()
        rest = b""
        while True:
            chunk = _read(reader, block_bytes, f.path)
            if not chunk:
                if rest:
                    data = rest if rest.endswith(b"\n") else rest + b"\n"
                    yield Block(f, data, 1, line_no, index, raw.tell() - pos)
                break
            buf = rest + chunk if rest else chunk
            cut = buf.rfind(b"\n")
            if cut < 0:
                rest = buf  # a line longer than the block: keep reading
                continue
            data, rest = buf[: cut + 1], buf[cut + 1 :]
            n = data.count(b"\n")
            now = raw.tell()
            yield Block(f, data, n, line_no, index, now - pos)
            pos = now
            line_no += n
            index += n
    finally:
        reader.close()
        raw.close()


def count_data_lines(f: InputFile, block_bytes: int, progress=None) -> int:
    reader, raw = open_input(f.path)
    try:
        n = 0
        last = b"\n"
        pos = 0
        while True:
            chunk = _read(reader, block_bytes, f.path)
            if not chunk:
                break
            n += chunk.count(b"\n")
            last = chunk[-1:]
            if progress is not None:
                now = raw.tell()
                progress.update(now - pos)
                pos = now
        if last != b"\n":
            n += 1
    finally:
        reader.close()
        raw.close()
    return n - (f.layout.header_lines if f.layout else 0)


def parse_file(
    fmt: RawFormat, path: str | os.PathLike, block_bytes: int = DEFAULT_BLOCK_BYTES
) -> tuple[Raw, np.ndarray, np.ndarray, list[tuple[int, str]]]:
    """Parse one whole (small) file the way ``preprocess`` does, for tests and debugging.

    Returns (valid lines as a Raw with raw dense values, their transformed dense
    float32 (n, Dd), their 1-based line numbers, [(line number, problem)] of bad lines).
    """
    f = InputFile(str(path), "input")
    probe(fmt, f)
    parts, lines, bad = [], [], []
    for b in iter_blocks(f, block_bytes):
        raw, bad_lines = fmt.parse_block(b.data, b.nlines, f.layout, stop_at_bad=False)
        parts.append(raw)
        lines.append(b.first_line + raw.rows)
        bad += [(b.first_line + off, problem) for off, problem in bad_lines]
    raw = concat_raw(parts, fmt.empty_raw())
    line_numbers = np.concatenate(lines) if lines else np.zeros(0, np.int64)
    return raw, fmt.transform_dense(raw.dense), line_numbers, bad


# ---------------------------------------------------------------------------------
# Categorical mappings
# ---------------------------------------------------------------------------------

_GOLDEN = _U(0x9E3779B97F4A7C15)
_EMPTY_SLOT = np.iinfo(np.int64).min


class KeyIndex:
    """A static hash table (open addressing, linear probing, load <= 1/2) from distinct
    int64 keys to their position in the array it was built from; vectorised lookups.

    ``priority`` (e.g. the counts) inserts frequent keys first, so they sit in their
    home slot and most lookups take one probe. Faster than binary search once a table
    outgrows the cache, and on skewed queries.
    """

    def __init__(self, keys: np.ndarray, priority: np.ndarray | None = None):
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        n = len(keys)
        self.bits = max(4, (2 * n - 1).bit_length())
        self.mask = (1 << self.bits) - 1
        self._shift = _U(64 - self.bits)
        self.slot_key = np.full(1 << self.bits, _EMPTY_SLOT, dtype=np.int64)
        self.slot_pos = np.full(1 << self.bits, -1, dtype=np.int32 if n < (1 << 31) else np.int64)
        order = np.arange(n, dtype=np.int64)
        if priority is not None and n:
            order = np.argsort(-np.asarray(priority), kind="stable")
        # insert in tiers of growing size: the most frequent keys meet few collisions
        lo = 0
        for hi in [n >> 8, n >> 4, n >> 2, n]:
            if hi > lo:
                self._insert(keys, order[lo:hi])
                lo = hi

    def _insert(self, keys: np.ndarray, pend: np.ndarray) -> None:
        sk, sp = self.slot_key, self.slot_pos
        pos = self._home(keys[pend])
        while pend.size:
            free = sp[pos] < 0
            cand, cpos = pend[free], pos[free]
            sp[cpos] = cand  # several keys may claim one slot: one of them wins
            won = sp[cpos] == cand
            sk[cpos[won]] = keys[cand[won]]
            taken = ~free
            pend = np.concatenate([pend[taken], cand[~won]])
            pos = (np.concatenate([pos[taken], cpos[~won]]) + 1) & self.mask

    def _home(self, keys: np.ndarray) -> np.ndarray:
        h = keys.view(np.uint64) * _GOLDEN
        h >>= self._shift
        return h.view(np.int64)

    def lookup(self, q: np.ndarray) -> np.ndarray:
        """Position of each key of ``q`` in the build array, -1 where absent."""
        q = np.ascontiguousarray(q, dtype=np.int64)
        h = self._home(q)
        res = self.slot_pos[h].astype(np.int64)
        miss = self.slot_key[h] != q
        if miss.any():
            idx = np.flatnonzero(miss)
            idx = idx[res[idx] >= 0]  # an empty home slot ends the probe
            hi = h[idx]
            res[miss] = -1
            while idx.size:
                hi = (hi + 1) & self.mask
                k = self.slot_key[hi]
                hit = k == q[idx]
                res[idx[hit]] = self.slot_pos[hi[hit]]
                cont = ~hit & (k != _EMPTY_SLOT)
                idx, hi = idx[cont], hi[cont]
        return res


class KeyCounter:
    """Counts of int64 keys, accumulated block by block as sorted runs (``np.unique``)
    that are merged geometrically, so the total work stays O(N log N)."""

    def __init__(self) -> None:
        self._main: tuple[np.ndarray, np.ndarray] | None = None
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_len = 0

    @staticmethod
    def count(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(distinct keys sorted, counts) of one block's keys."""
        values, counts = np.unique(keys, return_counts=True)
        return values.astype(np.int64, copy=False), counts.astype(np.int64, copy=False)

    def add(self, values: np.ndarray, counts: np.ndarray) -> None:
        self._pending.append((values, counts))
        self._pending_len += len(values)
        main_len = len(self._main[0]) if self._main else 0
        if self._pending_len > max(1 << 20, main_len):
            self._merge()

    def _merge(self) -> None:
        runs = ([self._main] if self._main else []) + self._pending
        self._pending, self._pending_len = [], 0
        if not runs:
            return
        if len(runs) == 1:
            self._main = runs[0]
            return
        keys = np.concatenate([r[0] for r in runs])
        counts = np.concatenate([r[1] for r in runs])
        order = np.argsort(keys, kind="stable")  # a merge of sorted runs (timsort)
        keys, counts = keys[order], counts[order]
        first = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
        self._main = (keys[first], np.add.reduceat(counts, first) if len(first) else counts[:0])

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys sorted ascending, counts) as int64."""
        self._merge()
        if self._main is None:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return self._main


class Mapping:
    """Maps the keys of each keyed feature (one-hot and multi-hot) to ids."""

    mode = "?"

    def num_rows(self, name: str) -> int:
        raise NotImplementedError

    def map(self, name: str, keys: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def describe(self) -> dict:
        raise NotImplementedError


class HashMapping(Mapping):
    """``id = key % max_rows``; a missing value -> 0 (DLRM's max-ind-range)."""

    mode = "hash"

    def __init__(self, names: Sequence[str], max_rows: int):
        if max_rows < 1:
            raise ConfigError(f"--max-rows-per-table must be >= 1, got {max_rows}")
        self.names = list(names)
        self.max_rows = int(max_rows)

    def num_rows(self, name: str) -> int:
        return self.max_rows

    def map(self, name: str, keys: np.ndarray) -> np.ndarray:
        ids = keys % self.max_rows
        ids[keys == MISSING_KEY] = 0
        return ids

    def describe(self) -> dict:
        return {"mode": "hash", "max_rows_per_table": self.max_rows}


class Vocabulary(Mapping):
    """Per feature: every distinct key of the train lines with its count. Keys counted
    at least ``min_count`` times get ids 1.. in increasing key order; others -> 0."""

    mode = "vocab"

    def __init__(self, keys: dict[str, np.ndarray], counts: dict[str, np.ndarray], min_count: int, workers: int = 1):
        if min_count < 1:
            raise ConfigError(f"--min-count must be >= 1, got {min_count}")
        self.keys = keys
        self.counts = counts
        self.min_count = int(min_count)
        self.kept = {n: np.ascontiguousarray(keys[n][counts[n] >= min_count]) for n in keys}

        def build(n: str) -> KeyIndex:
            return KeyIndex(self.kept[n], counts[n][counts[n] >= min_count])

        names = sorted(keys, key=lambda n: -len(self.kept[n]))  # big tables first
        with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
            self._index = dict(zip(names, ex.map(build, names)))

    def num_rows(self, name: str) -> int:
        return len(self.kept[name]) + 1

    def map(self, name: str, keys: np.ndarray) -> np.ndarray:
        ids = self._index[name].lookup(keys)
        ids += 1
        return ids

    def describe(self) -> dict:
        return {"mode": "vocab", "min_count": self.min_count}


def save_mapping(out: Path, fmt: RawFormat, mapping: Mapping) -> None:
    d = out / VOCAB_DIR
    d.mkdir(parents=True, exist_ok=True)
    features = {}
    for name in fmt.key_features + fmt.seq_features:
        entry = {"num_rows": mapping.num_rows(name)}
        if isinstance(mapping, Vocabulary):
            np.save(d / f"{name}.keys.npy", mapping.keys[name])
            np.save(d / f"{name}.counts.npy", mapping.counts[name])
            entry["distinct"] = int(len(mapping.keys[name]))
            entry["keys"] = f"{name}.keys.npy"
            entry["counts"] = f"{name}.counts.npy"
        features[name] = entry
    doc = {
        "version": VOCAB_VERSION,
        "format": fmt.name,
        "key": fmt.key_kind,
        **mapping.describe(),
        "features": features,
        "fixed_features": {n: r for n, r in fmt.fixed_features},
    }
    (d / VOCAB_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def load_mapping(directory: str | os.PathLike, fmt: RawFormat) -> Mapping:
    directory = Path(directory)
    path = directory / VOCAB_DIR / VOCAB_FILE
    if not directory.is_dir():
        raise DataError(f"--vocab-from {directory}: no such directory")
    if not (directory / META_FILE).exists():
        raise DataError(f"--vocab-from {directory}: not a finished dataset (no {META_FILE})")
    if not path.exists():
        raise DataError(f"--vocab-from {directory}: has no {VOCAB_DIR}/{VOCAB_FILE} (not made by bagpipe preprocess)")
    doc = read_json(path)
    if doc.get("version") != VOCAB_VERSION:
        raise DataError(f"{path}: unsupported vocabulary version {doc.get('version')!r}")
    if doc.get("format") != fmt.name:
        raise DataError(f"--vocab-from {directory}: holds a {doc.get('format')} vocabulary, not {fmt.name}")
    names = fmt.key_features + fmt.seq_features
    missing = [n for n in names if n not in doc.get("features", {})]
    if missing:
        raise DataError(f"{path}: no entry for feature(s) {', '.join(missing)}")
    if doc.get("mode") == "hash":
        return HashMapping(names, int(doc["max_rows_per_table"]))
    if doc.get("mode") != "vocab":
        raise DataError(f"{path}: unknown mode {doc.get('mode')!r}")
    keys, counts = {}, {}
    for n in names:
        try:
            keys[n] = np.load(path.parent / doc["features"][n]["keys"])
            counts[n] = np.load(path.parent / doc["features"][n]["counts"])
        except (OSError, ValueError, KeyError) as e:
            raise DataError(f"{path.parent}: vocabulary of {n} unreadable ({e})") from None
        if keys[n].dtype != np.int64 or keys[n].shape != counts[n].shape:
            raise DataError(f"{path.parent}: vocabulary of {n} is malformed")
    return Vocabulary(keys, counts, int(doc["min_count"]))


# ---------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------


@dataclass
class Options:
    out: str
    inputs: list[str] = field(default_factory=list)
    eval_files: list[str] = field(default_factory=list)
    split: float | None = None  # None: 0.9, or 1.0 with eval files
    labelled: bool = True
    header: str = "auto"  # "auto" or "no"
    max_rows_per_table: int | None = None
    min_count: int | None = None  # None: 1 (vocabulary mode)
    vocab_from: str | None = None
    on_error: str = "fail"
    overwrite: bool = False
    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD
    workers: int | None = None
    block_bytes: int = DEFAULT_BLOCK_BYTES
    progress: bool | None = None  # None: when stderr is a terminal


@dataclass
class Result:
    out: str
    rows: dict[str, int]
    skipped: int
    bad_examples: list[str]
    num_tables: int
    total_rows: int
    mapping: dict
    text_bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.text_bytes / 1e6 / max(self.seconds, 1e-9)

    def summary(self, fmt_name: str) -> str:
        splits = ", ".join(f"{k} {v:,}" for k, v in self.rows.items())
        if self.mapping["mode"] == "hash":
            how = f"hashed to {self.mapping['max_rows_per_table']:,} rows"
        else:
            how = f"vocabulary min-count {self.mapping['min_count']}"
        return (
            f"{fmt_name}: rows {splits}; skipped {self.skipped:,} bad lines; "
            f"{self.num_tables} tables ({how}, {self.total_rows:,} rows); "
            f"{self.text_bytes / 1e6:,.1f} MB in {self.seconds:.1f} s = {self.mb_per_s:,.1f} MB/s -> {self.out}"
        )


def _progress(opts: Options, total: int, desc: str):
    from tqdm import tqdm

    disable = None if opts.progress is None else not opts.progress
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=disable, leave=False, dynamic_ncols=True)


def _pipelined(items: Iterator, fn: Callable, workers: int) -> Iterator:
    """``fn(item)`` for each item on a thread pool, yielded in order (bounded read-ahead)."""
    if workers <= 1:
        for it in items:
            yield it, fn(it)
        return
    ex = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bagpipe-preprocess")
    q: deque = deque()
    try:
        for it in items:
            q.append((it, ex.submit(fn, it)))
            if len(q) > 2 * workers:
                it0, fut = q.popleft()
                yield it0, fut.result()
        while q:
            it0, fut = q.popleft()
            yield it0, fut.result()
    finally:
        for _, fut in q:
            fut.cancel()
        ex.shutdown(wait=True, cancel_futures=True)


class _BadLines:
    def __init__(self, on_error: str):
        self.on_error = on_error
        self.count = 0
        self.examples: list[str] = []

    def report(self, block: Block, bad: list[tuple[int, str]]) -> None:
        for off, problem in bad:
            line = block.first_line + off
            if self.on_error == "fail":
                raise ParseError(block.file.path, line, problem)
            self.count += 1
            if len(self.examples) < MAX_BAD_EXAMPLES:
                self.examples.append(f"{block.file.path}:{line}: {problem}")


def run_preprocess(fmt: RawFormat, opts: Options) -> Result:
    t0 = time.perf_counter()
    if opts.on_error not in ("fail", "skip"):
        raise ConfigError(f"--on-error must be fail or skip, got {opts.on_error!r}")
    if opts.rows_per_shard <= 0:
        raise ConfigError(f"--rows-per-shard must be > 0, got {opts.rows_per_shard}")
    if opts.block_bytes < 1024:
        raise ConfigError("block size must be at least 1 KiB")
    workers = opts.workers if opts.workers is not None else min(4, os.cpu_count() or 1)
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    if opts.max_rows_per_table is not None and (opts.min_count is not None or opts.vocab_from):
        raise ConfigError("--max-rows-per-table, --min-count and --vocab-from exclude each other")
    if opts.min_count is not None and opts.vocab_from:
        raise ConfigError("--min-count cannot be combined with --vocab-from (the vocabulary brings its own)")

    # -- the files and their splits ------------------------------------------
    if not opts.inputs and not opts.eval_files:
        raise ConfigError("no input files (give --input FILE... and/or --eval-files FILE...)")
    if not opts.labelled:
        if opts.eval_files or opts.split is not None:
            raise ConfigError("--no-label writes every line to split 'test'; --split and --eval-files do not apply")
        files = [InputFile(p, "test") for p in opts.inputs]
        split = None
    else:
        files = [InputFile(p, "input") for p in opts.inputs] + [InputFile(p, "eval") for p in opts.eval_files]
        split = opts.split if opts.split is not None else (1.0 if opts.eval_files else 0.9)
        if not 0.0 <= split <= 1.0:
            raise ConfigError(f"--split must be in [0, 1], got {split}")
    seen = set()
    for f in files:
        key = os.path.realpath(f.path)
        if key in seen:
            raise ConfigError(f"{f.path}: given twice")
        seen.add(key)
    out = Path(opts.out)
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a directory")
    if (out / META_FILE).exists() and not opts.overwrite:
        raise DataError(f"{out}: already holds a dataset (pass --overwrite to replace it)")
    for f in files:
        probe(fmt, f)

    # -- mapping loaded early (the output may overwrite the directory it is read from)
    mapping: Mapping | None = None
    if opts.vocab_from:
        mapping = load_mapping(opts.vocab_from, fmt)

    inputs = [f for f in files if f.role == "input"]
    n_train: int | None = None  # global data-line index bound of "train" among the inputs
    if split is not None and inputs:
        if split >= 1.0:
            n_train = None  # all train
        elif split <= 0.0:
            n_train = 0
        else:
            bar = _progress(opts, sum(f.size for f in inputs), "counting lines")
            with bar:
                for f in inputs:
                    f.lines = count_data_lines(f, opts.block_bytes, bar)
            total = sum(f.lines for f in inputs)
            n_train = math.floor(Fraction(str(split)) * total)

    bad = _BadLines(opts.on_error)
    stop = opts.on_error == "fail"
    keyed = fmt.key_features + fmt.seq_features
    if mapping is None and opts.max_rows_per_table is not None:
        mapping = HashMapping(keyed, opts.max_rows_per_table)

    def parse(b: Block) -> Parsed:
        raw, bad_lines = fmt.parse_block(b.data, b.nlines, b.file.layout, stop)
        return Parsed(raw, fmt.transform_dense(raw.dense), bad_lines)

    def blocks(which: list[InputFile]) -> Iterator[Block]:
        """Blocks of ``which`` in order; line counts are taken here (not by the consumer,
        which lags behind), so ``global_start`` is right for every block."""
        start = 0
        for f in which:
            n = 0
            for b in iter_blocks(f, opts.block_bytes):
                b.global_start = start + b.first_index
                n += b.nlines
                yield b
            f.lines = n
            if f.role == "input":
                start += n

    def is_train(b: Block, rows: np.ndarray) -> np.ndarray | bool:
        """Which rows of an --input block go to train (True/False for all of them)."""
        if n_train is None:
            return True
        if len(rows) == 0:
            return False
        g0 = b.global_start + int(rows[0])
        g1 = b.global_start + int(rows[-1])
        if g1 < n_train:
            return True
        if g0 >= n_train:
            return False
        return (b.global_start + rows) < n_train

    # -- pass 1 (vocabulary mode): parse the --input files, count the train lines' keys,
    # keep the parsed blocks in a spill so pass 2 does not parse them again.
    spill: _Spill | None = None
    try:
        if mapping is None:
            min_count = opts.min_count if opts.min_count is not None else 1
            if min_count < 1:
                raise ConfigError(f"--min-count must be >= 1, got {min_count}")
            if not inputs or n_train == 0:
                raise ConfigError(
                    "vocabulary mode needs train lines: give --input files that go to train, "
                    "--vocab-from DIR or --max-rows-per-table N"
                )
            counters = {n: KeyCounter() for n in keyed}
            spill = _Spill(out)

            def count_block(b: Block):
                p = parse(b)
                train = is_train(b, p.raw.rows)
                raw = p.raw if train is True else p.raw.take(train) if train is not False else None
                counts = []
                if raw is not None:
                    counts = [KeyCounter.count(k) for k in raw.keys]
                    counts += [KeyCounter.count(v) for v, _ in raw.seqs]
                return p, counts

            bar = _progress(opts, sum(f.size for f in inputs), "vocabulary")
            lines_done = 0
            with bar:
                for b, (p, counts) in _pipelined(blocks(inputs), count_block, workers):
                    bad.report(b, p.bad)
                    for name, (v, c) in zip(keyed, counts):
                        counters[name].add(v, c)
                    spill.put(b, p)
                    lines_done += b.nlines
                    bar.update(b.disk_bytes)
                    bar.set_postfix_str(f"{lines_done:,} lines", refresh=False)
            with ThreadPoolExecutor(max_workers=workers) as ex:
                results = dict(zip(keyed, ex.map(lambda n: counters[n].result(), keyed)))
            keys = {n: r[0] for n, r in results.items()}
            counts_ = {n: r[1] for n, r in results.items()}
            mapping = Vocabulary(keys, counts_, min_count, workers)
        return _write(fmt, opts, out, files, mapping, spill, bad, parse, blocks, is_train, workers, split, n_train, t0)
    finally:
        if spill is not None:
            spill.remove()


@dataclass
class Parsed:
    raw: Raw  # the valid lines (dense still raw)
    dense: np.ndarray  # (n, Dd) float32, transformed
    bad: list[tuple[int, str]]


class _Spill:
    """Parsed blocks of pass 1, kept on disk next to the output directory (the output
    directory itself is cleared when the writer starts) and replayed by pass 2."""

    def __init__(self, out: Path):
        import tempfile

        out.parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f".{out.name}.spill-", dir=out.parent))
        self._f = open(self.dir / "blocks.bin", "wb")
        self.records: list[tuple[Block, list[tuple[str, int, str, tuple]], int]] = []

    def put(self, b: Block, p: Parsed) -> None:
        raw = p.raw
        arrays = {"rows": raw.rows, "labels": raw.labels, "dense": p.dense, "fixed": raw.fixed}
        keys = raw.keys
        if keys.size and keys.min() >= -1 and keys.max() < (1 << 32) - 1:
            keys = (keys + 1).astype(np.uint32)  # most Criteo keys: half the bytes
        arrays["keys"] = keys
        for j, (v, lengths) in enumerate(raw.seqs):
            arrays[f"seq{j}.values"] = v
            arrays[f"seq{j}.lengths"] = lengths
        index = []
        for name, arr in arrays.items():
            arr = np.ascontiguousarray(arr)
            index.append((name, self._f.tell(), arr.dtype.str, arr.shape))
            if arr.size:
                self._f.write(arr)
        # the block's text is not needed any more
        rec = Block(b.file, b"", b.nlines, b.first_line, b.first_index, b.disk_bytes, global_start=b.global_start)
        self.records.append((rec, index, len(b.data)))

    def load(self, index) -> Parsed:
        arrays = {}
        with open(self.dir / "blocks.bin", "rb") as f:
            for name, offset, dtype, shape in index:
                count = int(np.prod(shape)) if shape else 1
                f.seek(offset)
                arrays[name] = np.fromfile(f, dtype=np.dtype(dtype), count=count).reshape(shape)
        keys = arrays["keys"]
        if keys.dtype == np.uint32:
            keys = keys.astype(np.int64) - 1
        nseq = sum(1 for n in arrays if n.endswith(".values"))
        raw = Raw(
            rows=arrays["rows"],
            labels=arrays["labels"],
            dense=np.zeros((len(arrays["rows"]), 0)),
            keys=keys,
            fixed=arrays["fixed"],
            seqs=[(arrays[f"seq{j}.values"], arrays[f"seq{j}.lengths"]) for j in range(nseq)],
        )
        return Parsed(raw, arrays["dense"], [])

    def finish_writing(self) -> None:
        if not self._f.closed:
            self._f.close()

    def remove(self) -> None:
        import shutil

        self.finish_writing()
        shutil.rmtree(self.dir, ignore_errors=True)


def _write(fmt, opts, out, files, mapping, spill, bad, parse, blocks, is_train, workers, split, n_train, t0) -> Result:
    """Pass 2: map categorical keys to ids and append every valid line to its split."""
    features = []
    fixed_rows = dict(fmt.fixed_features)
    for name in fmt.feature_order:
        if name in fixed_rows:
            features.append(FeatureSpec(name, fixed_rows[name]))
        else:
            features.append(FeatureSpec(name, mapping.num_rows(name), multi_hot=name in fmt.seq_features))
    id_dtype = "int32" if max(f.num_rows for f in features) <= np.iinfo(np.int32).max else "int64"
    writer = ShardWriter(
        out, fmt.dense_names, features, id_dtype=id_dtype, rows_per_shard=opts.rows_per_shard, overwrite=opts.overwrite
    )
    save_mapping(out, fmt, mapping)
    fixed_names = [n for n, _ in fmt.fixed_features]
    onehot_src = []  # per one-hot feature in schema order: ("key", j) or ("fixed", j)
    for name in fmt.feature_order:
        if name in fmt.key_features:
            onehot_src.append(("key", fmt.key_features.index(name)))
        elif name in fixed_rows:
            onehot_src.append(("fixed", fixed_names.index(name)))

    def work(item):
        kind, b, index = item
        p = spill.load(index) if kind == "spill" else parse(b)
        raw = p.raw
        n = len(raw)
        ids = np.empty((len(onehot_src), n), dtype=np.int64)  # feature-major, like raw.keys
        for col, (src, j) in enumerate(onehot_src):
            if src == "key":
                ids[col] = mapping.map(fmt.key_features[j], raw.keys[j])
            else:
                ids[col] = raw.fixed[:, j]
        sparse = np.empty((n, len(onehot_src)), dtype=id_dtype)
        sparse[:] = ids.T
        multihot = {name: (mapping.map(name, v), lengths) for name, (v, lengths) in zip(fmt.seq_features, raw.seqs)}
        return raw.rows, raw.labels, p.dense, sparse, multihot, p.bad

    def items():
        if spill is not None:
            spill.finish_writing()
            for rec, index, text in spill.records:
                rec.data_len = text
                yield "spill", rec, index
            for b in blocks([f for f in files if f.role != "input"]):
                yield "parse", b, None
        else:
            for b in blocks(files):
                yield "parse", b, None

    rows_per_split: dict[str, int] = {}
    text_bytes = 0
    lines_done = 0
    bar = _progress(opts, sum(f.size for f in files), "writing shards")
    with bar:
        for (kind, b, _), (rows, labels, dense, sparse, multihot, bad_lines) in _pipelined(items(), work, workers):
            if kind == "parse":
                bad.report(b, bad_lines)
                nbytes = len(b.data)
            else:
                nbytes = b.data_len
            lines_done += b.nlines
            b.file.text_bytes += nbytes
            text_bytes += nbytes
            if b.file.role == "input":
                train = is_train(b, rows)
                if train is True:
                    parts = [("train", None)]
                elif train is False:
                    parts = [("eval", None)]
                else:
                    parts = [("train", train), ("eval", ~train)]
            else:
                parts = [(b.file.role, None)]
            for split_name, mask in parts:
                if mask is None:
                    sel = (labels, dense, sparse, multihot)
                else:
                    mh = {}
                    for name, (v, lengths) in multihot.items():
                        owner = np.repeat(np.arange(len(lengths)), lengths)
                        mh[name] = (v[mask[owner]], lengths[mask])
                    sel = (labels[mask], dense[mask], sparse[mask], mh)
                if len(sel[0]) == 0:
                    continue
                writer.append(split_name, *sel[:3], multihot=sel[3] or None)
                rows_per_split[split_name] = rows_per_split.get(split_name, 0) + len(sel[0])
            bar.update(b.disk_bytes)
            bar.set_postfix_str(f"{lines_done:,} lines", refresh=False)

    if not rows_per_split:
        raise DataError("no valid lines in the input (every line was bad)")
    split_desc: dict
    if split is None:
        split_desc = {"mode": "all-test", "note": "unlabelled input: every line in split 'test', labels written as 0"}
    else:
        split_desc = {"train_fraction_of_inputs": split, "eval_files": list(opts.eval_files)}
        if n_train is not None:
            split_desc["train_lines"] = n_train
    source = {
        "tool": "bagpipe preprocess",
        "format": fmt.name,
        "inputs": [
            {"path": f.path, "role": f.role, "lines": f.lines, "bytes": f.size, "header": bool(f.layout.header_lines)}
            for f in files
        ],
        "split": split_desc,
        "labelled": opts.labelled,
        "categorical": {**mapping.describe(), "key": fmt.key_kind, "vocab_from": opts.vocab_from},
        "dense": "log(1 + max(x, 0)); missing = 0",
        "on_error": opts.on_error,
        "skipped_lines": bad.count,
        "skipped_examples": bad.examples,
        "rows": dict(sorted(rows_per_split.items())),
    }
    meta = writer.close(source=source)
    seconds = time.perf_counter() - t0
    return Result(
        out=str(out),
        rows={k: meta.num_samples(k) for k in ("train", "eval", "test") if k in meta.splits},
        skipped=bad.count,
        bad_examples=bad.examples,
        num_tables=meta.num_features,
        total_rows=meta.total_rows,
        mapping=mapping.describe(),
        text_bytes=text_bytes,
        seconds=seconds,
    )
