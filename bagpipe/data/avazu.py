"""The Avazu CTR format (Kaggle "Click-Through Rate Prediction", train.csv / test.csv).

Comma-separated, no quoting, normally with the header::

    id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,
    app_category,device_id,device_ip,device_model,device_type,device_conn_type,C14,...,C21

* ``click``: the label, ``0`` or ``1`` (absent with ``--no-label``, e.g. test.csv).
* ``hour``: ``YYMMDDHH`` (20YY, a real date, HH 00-23), turned into two categorical
  features with fixed tables: ``hour_of_day`` (24 rows, id = HH) and ``day_of_week``
  (7 rows, Monday = 0).
* ``id`` is ignored (unique per line). Every other column is a categorical feature whose
  value is taken as an opaque string (key: 63-bit FNV-1a hash of its bytes; empty is the
  missing key -1).

There are no dense features. A file's first line is its header when it holds a field
named ``id``, ``click`` or ``hour`` (columns may then come in any order); otherwise, and always with
``--no-header``, the columns are in the standard order above.
"""

from __future__ import annotations

import datetime

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

from bagpipe.data.preprocess import (
    BadLine,
    Layout,
    Raw,
    RawFormat,
    Row,
    binary_parts,
    fnv1a_key,
    fnv1a_keys,
    padded,
    parse_decimals,
    show,
    strip_cr,
    words,
)
from bagpipe.errors import DataError

COLUMNS = (
    "id click hour C1 banner_pos site_id site_domain site_category app_id app_domain app_category "
    "device_id device_ip device_model device_type device_conn_type C14 C15 C16 C17 C18 C19 C20 C21"
).split()
KEY_FEATURES = [c for c in COLUMNS if c not in ("id", "click", "hour")]
FIXED_FEATURES = [("hour_of_day", 24), ("day_of_week", 7)]


def csv_table(data: bytes, names: list[str], include: list[str]) -> pa.Table | None:
    """Parse comma-separated ``data`` (no quoting) into binary columns, or None."""
    try:
        return pcsv.read_csv(
            pa.BufferReader(data),
            read_options=pcsv.ReadOptions(column_names=names, use_threads=False, block_size=min(len(data) + 1, 1 << 30)),
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
    data: bytes, nlines: int, layout: Layout, label: str | None, columns: list[str]
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
    marks: set[str],
    header: str,
    label: str,
) -> Layout:
    """Layout of a CSV file: from its header if the first line has a field in ``marks``
    (and ``header`` is not "no"), else the standard column order. ``label``: the name
    of the label column (for a hint when it is missing)."""
    if first_line.startswith(b"\xef\xbb\xbf"):
        first_line = first_line[3:]
    fields = [f.strip().decode("utf-8", "replace") for f in first_line.split(b",")]
    if header == "no" or not marks.intersection(fields):
        return Layout(list(standard), 0)
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
    return Layout(fields, 1)


_DAYS = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31])


def hour_features_fast(values: np.ndarray) -> np.ndarray | None:
    """YYMMDDHH int64 -> (n, 2) [hour_of_day, day_of_week], or None if any is invalid."""
    yy = values // 1_000_000
    mm = values // 10_000 % 100
    dd = values // 100 % 100
    hh = values % 100
    if not ((mm >= 1) & (mm <= 12) & (hh <= 23) & (dd >= 1)).all():
        return None
    year = 2000 + yy
    leap = ((year % 4 == 0) & (year % 100 != 0)) | (year % 400 == 0)
    dim = _DAYS[mm - 1] + ((mm == 2) & leap)
    if not (dd <= dim).all():
        return None
    months = (year - 1970) * 12 + (mm - 1)
    days = months.astype("datetime64[M]").astype("datetime64[D]").astype(np.int64) + (dd - 1)
    dow = (days + 3) % 7  # 1970-01-01 was a Thursday; Monday = 0
    return np.stack([hh, dow], axis=1).astype(np.int64)


def hour_features_slow(v: bytes) -> list[int]:
    if len(v) != 8 or not v.isdigit():
        raise BadLine(f"hour {show(v)} is not YYMMDDHH")
    yy, mm, dd, hh = int(v[0:2]), int(v[2:4]), int(v[4:6]), int(v[6:8])
    if hh > 23:
        raise BadLine(f"hour {show(v)} is not YYMMDDHH (hour {hh} > 23)")
    try:
        day = datetime.date(2000 + yy, mm, dd)
    except ValueError:
        raise BadLine(f"hour {show(v)} is not YYMMDDHH (no such date)") from None
    return [hh, day.weekday()]


class AvazuFormat(RawFormat):
    name = "avazu"
    key_kind = "fnv1a64"
    dense_names: list = []
    key_features = KEY_FEATURES
    fixed_features = FIXED_FEATURES
    seq_features: list = []
    feature_order = ["hour_of_day", "day_of_week"] + KEY_FEATURES

    def __init__(self, labelled: bool = True, header: str = "auto"):
        super().__init__(labelled, header)
        self.standard = [c for c in COLUMNS if labelled or c != "click"]

    def layout(self, path: str, first_line: bytes) -> Layout:
        required = [c for c in self.standard if c != "id"]
        optional = {"id"} | ({"click"} if not self.labelled else set())
        return header_layout(path, first_line, self.standard, required, optional, {"id", "click", "hour"}, self.header, "click")

    def parse_line(self, line: bytes, layout: Layout) -> Row:
        fields = strip_cr(line).split(b",")
        if len(fields) != len(layout.names):
            raise BadLine(f"expected {len(layout.names)} comma-separated fields, got {len(fields)}")
        col = dict(zip(layout.names, fields))
        label = label_slow(col["click"]) if self.labelled else 0
        fixed = hour_features_slow(col["hour"])
        keys = [fnv1a_key(col[c]) for c in KEY_FEATURES]
        return Row(label, [], keys, fixed)

    def parse_fast(self, data: bytes, nlines: int, layout: Layout) -> Raw | None:
        block = csv_fast_block(data, nlines, layout, "click" if self.labelled else None, ["hour"] + KEY_FEATURES)
        if block is None:
            return None
        t, labels = block
        n = nlines
        hdata, hs, he = binary_parts(t.column("hour"))
        if not (he - hs == 8).all():
            return None
        hbytes = hdata[int(hs[0]) : int(he[-1])] if n else hdata[:0]
        if not ((hbytes >= 48) & (hbytes <= 57)).all():
            return None
        harr = padded(hdata.tobytes())
        hv = parse_decimals(harr, words(harr), hs, he)
        if hv is None:
            return None
        fixed = hour_features_fast(hv)
        if fixed is None:
            return None
        return Raw(
            rows=np.arange(n, dtype=np.int64),
            labels=labels,
            dense=np.zeros((n, 0), np.float64),
            keys=keys_fast(t, KEY_FEATURES),
            fixed=fixed,
        )
