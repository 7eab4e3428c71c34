"""Reading raw input files: plain or gzip, in blocks of whole lines, with exact line numbers.

* :func:`open_input` opens a file, gunzipping it when it starts with the gzip magic
  (``1f 8b``) whatever its name;
* :func:`is_stream` tells an input that can be read only once -- ``-`` (standard input),
  a pipe or FIFO (``/dev/stdin``, ``<(zcat x.gz)``'s ``/dev/fd/N``), a socket or a
  character device -- from a file: :func:`probe` opens such an input as a
  :class:`Stream`, reads its first lines, and the one pass that reads it gets them
  replayed before the rest (:func:`iter_blocks`); it is never reopened, never seeked
  and has no size (progress counts the bytes read); :func:`spool` keeps its text in a
  file once, for a run that must read it twice (``preprocess`` with ``0 < --split < 1``);
* :func:`probe` checks a file before any work (exists, has a data line) and detects its
  :class:`~bagpipe.preprocess.formats.FieldLayout` (a CSV header) from the first line;
* :func:`iter_blocks` streams a file as :class:`Block` s of about ``block_bytes`` of text
  (default :data:`DEFAULT_BLOCK_BYTES`, 8 MiB) cut after the last newline, so no line is
  split and line numbers stay exact (1-based, a header counts as line 1); a line longer
  than a block makes a longer block;
* :func:`count_data_lines` counts the data lines of a file (for ``0 < --split < 1``);
* :func:`parse_file` parses one whole small file the way ``preprocess`` does (tests).

``Block.disk_bytes`` is what the block consumed of the file on disk (compressed bytes
for gzip; of a stream, the bytes read from it), for progress bars sized by file size.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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


#: The name of standard input as an input file.
STDIN = "-"


def is_stream(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an input that can be read only once: ``-`` (standard input), a
    pipe or FIFO, a socket or a character device (anything that exists and is neither a
    regular file nor a folder)."""
    if str(path) == STDIN:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def identity(path: str | os.PathLike):
    """What makes two input names the same input: the real path of a file; the device and
    inode of a stream (``-`` and ``/dev/stdin`` are the same pipe)."""
    if is_stream(path):
        try:
            st = os.fstat(0) if str(path) == STDIN else os.stat(path)
            return ("stream", st.st_dev, st.st_ino)
        except OSError:
            return ("stream", str(path))
    return os.path.realpath(path)


class _Counted(io.RawIOBase):
    """A raw binary stream that counts the bytes read through it: a pipe's position."""

    def __init__(self, f: io.RawIOBase):
        self.f, self.count = f, 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self.f.readinto(b) or 0
        self.count += n
        return n

    def tell(self) -> int:
        return self.count

    def close(self) -> None:
        if not self.closed:
            self.f.close()
        super().close()


class _Replay(io.RawIOBase):
    """The bytes ``head`` (already read from ``rest``), then the rest of ``rest``."""

    def __init__(self, head: bytes, rest):
        self.head, self.rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.head:
            n = min(len(b), len(self.head))
            b[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        data = self.rest.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self.rest.close()
        super().close()


class Stream:
    """An input that can be read only once (:func:`is_stream`), opened by :func:`probe`.

    ``head`` holds the text lines the probe read; :meth:`take` hands the whole text, those
    lines first, to the one reader there may be. ``count.tell()`` is the bytes read from
    the stream so far (compressed bytes for gzip)."""

    def __init__(self, path: str):
        self.path = path
        try:
            fileio = io.FileIO(0, "rb", closefd=False) if path == STDIN else io.FileIO(path, "rb")
        except OSError as e:
            raise DataError(f"{path}: cannot open ({e.strerror})") from None
        self.count = _Counted(fileio)
        buffered = io.BufferedReader(self.count, 1 << 16)
        try:
            magic = buffered.read(2)
        except OSError as e:
            self.count.close()
            raise DataError(f"{path}: cannot read ({e.strerror})") from None
        raw = io.BufferedReader(_Replay(magic, buffered), 1 << 16)
        self.text: io.BufferedIOBase = gzip.GzipFile(fileobj=raw, mode="rb") if magic == b"\x1f\x8b" else raw
        self.head = b""
        self.taken = False

    def readline(self, limit: int) -> bytes:
        """A line of the text (for the probe), kept to be replayed."""
        line = self.text.readline(limit)
        self.head += line
        return line

    def take(self) -> tuple[io.BufferedIOBase, _Counted]:
        """(reader, counter): the whole text, from its first line; once."""
        if self.taken:
            raise DataError(f"{self.path}: a pipe can be read only once, and it has been read")
        self.taken = True
        return io.BufferedReader(_Replay(self.head, self.text), 1 << 20), self.count

    def close(self) -> None:
        self.text.close()
        self.count.close()


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
    stream: Stream | None = None  # an input read once (a pipe), opened by probe()
    spooled: Path | None = None  # a stream's text kept in a file (spool()), read in its place

    @property
    def read_size(self) -> int:
        """Bytes the next pass reads from disk (0: unknown, a stream)."""
        return self.spooled.stat().st_size if self.spooled is not None else self.size

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()


_PROBE_LIMIT = 16 << 20


def probe(fmt: RawFormat, f: InputFile) -> None:
    """Check the file opens and has a data line; detect its layout (header). A stream
    (:func:`is_stream`) is opened here, once, and its first lines kept for the pass."""
    if is_stream(f.path):
        f.stream = stream = Stream(f.path)
        try:
            first = stream.readline(_PROBE_LIMIT)
            second = stream.readline(_PROBE_LIMIT) if first else b""
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            stream.close()
            raise DataError(f"{f.path}: cannot read ({e})") from None
        f.size = 0  # unknown until read
    else:
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


def _open(f: InputFile):
    """(reader of the text, raw whose ``tell()`` is the position on disk) of ``f``: its
    spooled text, its stream (once), or the file."""
    if f.spooled is not None:
        raw = open(f.spooled, "rb")  # plain text, whatever its first bytes
        return raw, raw
    if f.stream is not None:
        return f.stream.take()
    return open_input(f.path)


def iter_blocks(f: InputFile, block_bytes: int) -> Iterator[Block]:
    """Blocks of whole lines of ``f`` (header skipped). A last line without newline gets
    one. A stream is read here, once; ``f.size`` is then the bytes read from it."""
    reader, raw = _open(f)
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
        if f.stream is not None and f.spooled is None:
            f.size = raw.tell()
    finally:
        reader.close()
        raw.close()


def count_data_lines(f: InputFile, block_bytes: int, progress=None) -> int:
    reader, raw = _open(f)
    try:
        return _data_lines(f, _count_lines(reader, raw, f.path, block_bytes, progress))
    finally:
        reader.close()
        raw.close()


def spool(f: InputFile, folder: Path, block_bytes: int, progress=None) -> int:
    """Read the stream ``f`` once, keeping its text in ``folder`` (which the caller
    removes), so that later passes read the file instead; returns its data lines, as
    :func:`count_data_lines` counts them. ``f.size``: the bytes read from the stream."""
    assert f.stream is not None
    path = folder / f"input-{len(list(folder.iterdir()))}.txt"
    reader, raw = f.stream.take()
    try:
        with open(path, "wb") as out:  # a read error is a DataError, a write error an OSError
            lines = _count_lines(reader, raw, f.path, block_bytes, progress, keep=out)
    except OSError as e:
        raise DataError(
            f"{f.path}: cannot keep the pipe's text in {folder} to split it ({e.strerror}); free space there, "
            "give the input as a file, or --split 0 or 1 (one pass, nothing kept)"
        ) from None
    finally:
        reader.close()
        raw.close()
    f.size = raw.tell()
    f.spooled = path
    return _data_lines(f, lines)


def _count_lines(reader, raw, path, block_bytes: int, progress=None, keep=None) -> int:
    """The lines of ``reader`` read to its end (a last line without a newline counts),
    each block also written to ``keep`` when given; ``progress`` advanced by the bytes
    ``raw`` (the file on disk, or the stream) gave."""
    n, last, pos = 0, b"\n", 0
    while True:
        chunk = _read(reader, block_bytes, path)
        if not chunk:
            break
        if keep is not None:
            keep.write(chunk)
        n += chunk.count(b"\n")
        last = chunk[-1:]
        if progress is not None:
            now = raw.tell()
            progress.update(now - pos)
            pos = now
    return n + (last != b"\n")


def _data_lines(f: InputFile, lines: int) -> int:
    """``lines`` of ``f`` less its header."""
    return lines - (f.layout.header_lines if f.layout else 0)


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
