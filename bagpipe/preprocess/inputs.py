"""Reading raw input files: plain or gzip, in blocks of whole lines, with exact line numbers.

* :func:`open_input` opens a file, gunzipping it when it starts with the gzip magic
  (``1f 8b``) whatever its name;
* :func:`probe` checks a file before any work (exists, has a data line) and detects its
  :class:`~bagpipe.preprocess.formats.FieldLayout` (a CSV header) from the first line;
* :func:`iter_blocks` streams a file as :class:`Block` s of about ``block_bytes`` of text
  (default :data:`DEFAULT_BLOCK_BYTES`, 8 MiB) cut after the last newline, so no line is
  split and line numbers stay exact (1-based, a header counts as line 1); a line longer
  than a block makes a longer block;
* :func:`count_data_lines` counts the data lines of a file (for ``0 < --split < 1``);
* :func:`parse_file` parses one whole small file the way ``preprocess`` does (tests).

``Block.disk_bytes`` is what the block consumed of the file on disk (compressed bytes
for gzip), for progress bars sized by file size.
"""

from __future__ import annotations

import gzip
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bagpipe.errors import DataError
from bagpipe.preprocess.formats import FieldLayout, Raw, RawFormat, concat_raw, strip_cr

DEFAULT_BLOCK_BYTES = 8 << 20


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
    layout: FieldLayout | None = None
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
        assert f.layout is not None  # probe() found it
        raw, bad_lines = fmt.parse_block(b.data, b.nlines, f.layout, stop_at_bad=False)
        parts.append(raw)
        lines.append(b.first_line + raw.rows)
        bad += [(b.first_line + off, problem) for off, problem in bad_lines]
    raw = concat_raw(parts, fmt.empty_raw())
    line_numbers = np.concatenate(lines) if lines else np.zeros(0, np.int64)
    return raw, fmt.transform_dense(raw.dense), line_numbers, bad
