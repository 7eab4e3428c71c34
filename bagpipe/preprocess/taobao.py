"""The Taobao display-ad click log (Alimama "Ad Display/Click Data on Taobao.com"), in the
joined one-line-per-impression CSV used by FuxiCTR::

    clk,time_stamp,userid,adgroup_id,pid,cate_id,campaign_id,customer,brand,price,
    cms_segid,cms_group_id,final_gender_code,age_level,pvalue_level,shopping_level,
    occupation,new_user_class_level,click_sequence

Comma-separated, no quoting, header in the file.

* ``clk``: the label, ``0`` or ``1`` (absent with ``--no-label``).
* ``price``: the one dense feature, ``log(1 + max(price, 0))``; a decimal number
  (``[+-]?digits[.digits][e[+-]digits]``, finite) or empty (-> 0).
* ``click_sequence``: a multi-hot feature, the user's clicked items joined by ``^``
  (empty: no items; an empty item, e.g. ``a^^b``, is a bad line); its own table, stored
  as values + offsets.
* ``time_stamp`` is ignored. Every other column is a categorical feature taken as an
  opaque string (key: 63-bit FNV-1a of its bytes; empty is the missing key -1).

A file's first line is its header when it holds a field named ``clk``, ``userid`` or
``adgroup_id`` (columns may then come in any order); otherwise, and always with
``--no-header``, the columns are in the order above.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bagpipe.preprocess.csv import CsvColumns, CsvFormat, binary_parts, keys_fast
from bagpipe.preprocess.fastparse import fnv1a_key, fnv1a_keys
from bagpipe.preprocess.formats import BadLine, FieldLayout, Raw, Row, show

COLUMNS = (
    "clk time_stamp userid adgroup_id pid cate_id campaign_id customer brand price cms_segid cms_group_id "
    "final_gender_code age_level pvalue_level shopping_level occupation new_user_class_level click_sequence"
).split()
KEY_FEATURES = [c for c in COLUMNS if c not in ("clk", "time_stamp", "price", "click_sequence")]
SEQ_FEATURE = "click_sequence"
_PRICE_RE = r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?"
_PRICE_RE_B = re.compile(_PRICE_RE.encode())


class TaobaoFormat(CsvFormat):
    name = "taobao"
    dense_names = ["price"]
    key_features = KEY_FEATURES
    fixed_features: list = []
    seq_features = [SEQ_FEATURE]
    feature_order = KEY_FEATURES + [SEQ_FEATURE]
    columns = CsvColumns(
        COLUMNS, label="clk", ignored="time_stamp", header_marks=frozenset({"clk", "userid", "adgroup_id"})
    )

    def parse_line(self, line: bytes, layout: FieldLayout) -> Row:
        col, label = self.line_fields(line, layout)
        p = col["price"]
        if not p:
            price = 0.0
        else:
            if not _PRICE_RE_B.fullmatch(p):
                raise BadLine(f"price {show(p)} is not a number")
            price = float(p)
            if not math.isfinite(price):
                raise BadLine(f"price {show(p)} is not finite")
        keys = [fnv1a_key(col[c]) for c in KEY_FEATURES]
        seq = col[SEQ_FEATURE]
        items = seq.split(b"^") if seq else []
        if any(not x for x in items):
            raise BadLine(f"{SEQ_FEATURE} {show(seq)} has an empty item")
        return Row(label, [price], keys, [], [[fnv1a_key(x) for x in items]])

    def parse_fast(self, data: bytes, nlines: int, layout: FieldLayout) -> Raw | None:
        block = self.fast_table(data, nlines, layout, ["price"] + KEY_FEATURES + [SEQ_FEATURE])
        if block is None:
            return None
        t, labels = block
        n = nlines
        price = _price_fast(t.column("price").combine_chunks())
        if price is None:
            return None
        seq = _sequence_fast(t.column(SEQ_FEATURE).combine_chunks())
        if seq is None:
            return None
        return Raw(
            rows=np.arange(n, dtype=np.int64),
            labels=labels,
            dense=price.reshape(n, 1),
            keys=keys_fast(t, KEY_FEATURES),
            fixed=np.zeros((n, 0), np.int64),
            seqs=[seq],
        )


def _price_fast(col: pa.Array) -> np.ndarray | None:
    try:
        s = col.cast(pa.string())
    except pa.ArrowInvalid:
        return None  # not UTF-8: not a number either
    empty = pc.equal(pc.binary_length(s), 0)
    ok = pc.or_(empty, pc.match_substring_regex(s, f"^{_PRICE_RE}$"))
    if not pc.all(ok).as_py():
        return None
    filled = pc.if_else(empty, pa.scalar("0"), s)
    try:
        v = pc.cast(filled, pa.float64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:
        return None
    if not np.isfinite(v).all():
        return None
    return v


def _sequence_fast(col: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
    """``^``-joined items -> (keys of all items, items per row), or None on an empty item."""
    data, s, e = binary_parts(col)
    n = len(s)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo, hi = int(s[0]), int(e[-1])
    carets = np.flatnonzero(data[lo:hi] == ord("^")) + lo
    nonempty = e > s
    per_row = np.searchsorted(carets, e) - np.searchsorted(carets, s)
    lengths = np.where(nonempty, per_row + 1, 0).astype(np.int64)
    starts = np.sort(np.concatenate([s[nonempty], carets + 1]))
    ends = np.sort(np.concatenate([carets, e[nonempty]]))
    if (ends <= starts).any():
        return None
    return fnv1a_keys(data, starts, ends), lengths
