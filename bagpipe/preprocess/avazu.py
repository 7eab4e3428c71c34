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

from bagpipe.preprocess.csv import CsvColumns, CsvFormat, binary_parts, keys_fast
from bagpipe.preprocess.fastparse import fnv1a_key, padded, parse_decimals, words
from bagpipe.preprocess.formats import BadLine, FieldLayout, Raw, Row, show

COLUMNS = (
    "id click hour C1 banner_pos site_id site_domain site_category app_id app_domain app_category "
    "device_id device_ip device_model device_type device_conn_type C14 C15 C16 C17 C18 C19 C20 C21"
).split()
KEY_FEATURES = [c for c in COLUMNS if c not in ("id", "click", "hour")]
FIXED_FEATURES = [("hour_of_day", 24), ("day_of_week", 7)]


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


class AvazuFormat(CsvFormat):
    name = "avazu"
    dense_names: list = []
    key_features = KEY_FEATURES
    fixed_features = FIXED_FEATURES
    seq_features: list = []
    feature_order = ["hour_of_day", "day_of_week"] + KEY_FEATURES
    columns = CsvColumns(COLUMNS, label="click", ignored="id", header_marks=frozenset({"id", "click", "hour"}))
    unlabelled_file = "Avazu's test file"

    def parse_line(self, line: bytes, layout: FieldLayout) -> Row:
        col, label = self.line_fields(line, layout)
        fixed = hour_features_slow(col["hour"])
        keys = [fnv1a_key(col[c]) for c in KEY_FEATURES]
        return Row(label, [], keys, fixed)

    def parse_fast(self, data: bytes, nlines: int, layout: FieldLayout) -> Raw | None:
        block = self.fast_table(data, nlines, layout, ["hour"] + KEY_FEATURES)
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
