"""What the CSV formats (:mod:`bagpipe.preprocess.avazu`, :mod:`~bagpipe.preprocess.taobao`) share.

Both are comma-separated without quoting, with a ``0``/``1`` label column, an optional
header line and categorical values taken as opaque strings (key: 63-bit FNV-1a of the
bytes, empty -> the missing key -1). :class:`CsvFormat` implements the common parts:

* the layout: a first line holding one of the format's ``header_marks`` is a header
  (columns may then come in any order, and must be exactly the expected ones), else
  the columns are in the standard order (always so with ``--no-header``);
* the start of the exact line parser: split at commas, check the field count and the
  label (:meth:`CsvFormat.line_fields`);
* the start of the fast path: pyarrow's CSV reader on the whole block, every needed
  column as binary, then the labels checked and converted with numpy
  (:meth:`CsvFormat.fast_table`); :func:`keys_fast` hashes whole columns at once.

The fast path declines a block (None) whenever pyarrow would read it differently from
the line parser: a lone ``\\r`` (pyarrow ends a line there), a wrong field count, a
label that is not ``0``/``1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from bagpipe.errors import DataError
from bagpipe.preprocess.fastparse import fnv1a_keys
from bagpipe.preprocess.formats import BadLine, FieldLayout, RawFormat, show, strip_cr


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


def csv_table(data: bytes, names: list[str], include: list[str]) -> pa.Table | None:
    """Parse comma-separated ``data`` (no quoting) into binary columns, or None."""
    try:
        return pcsv.read_csv(
            pa.BufferReader(data),
            read_options=pcsv.ReadOptions(
                column_names=names, use_threads=False, block_size=min(len(data) + 1, 1 << 30)
            ),
            parse_options=pcsv.ParseOptions(
                delimiter=",", quote_char=False, double_quote=False, escape_char=False, ignore_empty_lines=False
            ),
            convert_options=pcsv.ConvertOptions(
                column_types={c: pa.binary() for c in include},
                include_columns=include,
                check_utf8=False,
                strings_can_be_null=False,
                null_values=[],
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowException):
        return None


def csv_fast_ok(data: bytes) -> bool:
    """pyarrow ends a line at ``\\r`` too; only let it see ``\\r`` as part of ``\\r\\n``."""
    if b"\r" in data:
        return data.count(b"\r") == data.count(b"\r\n")
    return True


def labels_fast(table: pa.Table, name: str) -> np.ndarray | None:
    data, s, e = binary_parts(table.column(name))
    if len(s) == 0:
        return np.zeros(0, np.float32)
    if not (e - s == 1).all():
        return None
    lab = data[s]
    if not ((lab == 48) | (lab == 49)).all():
        return None
    return (lab - 48).astype(np.float32)


def csv_fast_block(
    data: bytes, nlines: int, layout: FieldLayout, label: str | None, columns: list[str]
) -> tuple[pa.Table, np.ndarray] | None:
    """The common start of a CSV format's fast path: parse ``columns`` (and the label
    column when ``label`` is given) of a block, and its labels (zeros when unlabelled).

    None sends the block to the exact line-by-line parser.
    """
    if not csv_fast_ok(data):
        return None
    t = csv_table(data, layout.names, ([label] if label else []) + columns)
    if t is None or t.num_rows != nlines:
        return None
    labels = labels_fast(t, label) if label else np.zeros(nlines, np.float32)
    if labels is None:
        return None
    return t, labels


def label_slow(v: bytes) -> int:
    if v not in (b"0", b"1"):
        raise BadLine(f"label {show(v)} is not 0 or 1")
    return v[0] - 48


def keys_fast(table: pa.Table, names: list[str]) -> np.ndarray:
    """(len(names), n) FNV keys of string columns (vectorised over all of them)."""
    n = table.num_rows
    if not names:
        return np.zeros((0, n), np.int64)
    cat = pa.concat_arrays([table.column(c).combine_chunks() for c in names])
    data, s, e = binary_parts(cat)
    return fnv1a_keys(data, s, e).reshape(len(names), n)


def header_layout(
    path: str,
    first_line: bytes,
    standard: list[str],
    required: list[str],
    optional: set[str],
    marks: frozenset[str] | set[str],
    header: str,
    label: str,
) -> FieldLayout:
    """FieldLayout of a CSV file: from its header if the first line has a field in ``marks``
    (and ``header`` is not "no"), else the standard column order. ``label``: the name
    of the label column (for a hint when it is missing)."""
    if first_line.startswith(b"\xef\xbb\xbf"):
        first_line = first_line[3:]
    fields = [f.strip().decode("utf-8", "replace") for f in first_line.split(b",")]
    if header == "no" or not marks.intersection(fields):
        return FieldLayout(list(standard), 0)
    missing = [c for c in required if c not in fields]
    extra = [c for c in fields if c not in required and c not in optional]
    if missing or extra or len(set(fields)) != len(fields):
        what = []
        if missing:
            hint = "; for an unlabelled file pass --no-label" if missing == [label] else ""
            what.append("missing " + ", ".join(missing) + hint)
        if extra:
            what.append("unexpected " + ", ".join(extra))
        if len(set(fields)) != len(fields):
            what.append("duplicate names")
        raise DataError(f"{path}:1: header does not match the expected columns ({'; '.join(what)})")
    return FieldLayout(fields, 1)


@dataclass(frozen=True)
class CsvColumns:
    """The columns of a CSV format: ``standard``, their order when a file has no header
    (label included); ``label``, the label column; ``ignored``, a column that is read
    past (a header may leave it out); ``header_marks``, names that make a first line a
    header."""

    standard: list[str]
    label: str
    ignored: str
    header_marks: frozenset[str]


class CsvFormat(RawFormat):
    """A comma-separated format without quoting whose first line may be a header.

    Subclasses set ``columns`` (a :class:`CsvColumns`) and the schema of
    :class:`~bagpipe.preprocess.formats.RawFormat`.
    """

    key_kind = "fnv1a64"
    columns: CsvColumns

    def __init__(self, labelled: bool = True, header: str = "auto"):
        super().__init__(labelled, header)
        self.label_column = f"a label column ({self.columns.label})"
        self.standard = [c for c in self.columns.standard if labelled or c != self.columns.label]

    def layout(self, path: str, first_line: bytes) -> FieldLayout:
        label, ignored = self.columns.label, self.columns.ignored
        required = [c for c in self.standard if c != ignored]
        optional = {ignored} | ({label} if not self.labelled else set())
        marks = self.columns.header_marks
        return header_layout(path, first_line, self.standard, required, optional, marks, self.header, label)

    def line_fields(self, line: bytes, layout: FieldLayout) -> tuple[dict[str, bytes], int]:
        """A line's fields by column name and its label (0 when unlabelled); raises
        BadLine for a wrong field count or a bad label."""
        fields = strip_cr(line).split(b",")
        if len(fields) != len(layout.names):
            raise BadLine(
                f"expected {len(layout.names)} comma-separated fields, got {len(fields)}"
                + self.label_hint(len(fields), len(layout.names))
            )
        col = dict(zip(layout.names, fields))
        label = label_slow(col[self.columns.label]) if self.labelled else 0
        return col, label

    def fast_table(
        self, data: bytes, nlines: int, layout: FieldLayout, columns: list[str]
    ) -> tuple[pa.Table, np.ndarray] | None:
        """:func:`csv_fast_block` with this format's label column (none when unlabelled)."""
        return csv_fast_block(data, nlines, layout, self.columns.label if self.labelled else None, columns)
