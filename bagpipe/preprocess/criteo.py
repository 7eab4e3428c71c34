"""The Criteo Kaggle / Terabyte text format.

One sample per line, tab-separated, no header, no quoting::

    label \\t I1 .. I13 \\t C1 .. C26          (40 fields; Kaggle test.txt: 39, no label)

* label: ``0`` or ``1``.
* I1..I13: integers ``-?[0-9]+`` within int64, or empty. Dense feature
  ``log(1 + max(x, 0))`` as DLRM does; empty -> 0.
* C1..C26: hex strings of 1 to 16 digits (case-insensitive, value below 2**63), or empty.
  The key is the hex value (so ``"0000001f"`` and ``"1f"`` are the same value), empty is
  the missing key -1. Hashing mode gives ``int(hex, 16) % M`` (empty -> 0), as DLRM's
  ``--max-ind-range``.

A line may end in ``\\r\\n``; the ``\\r`` is dropped. Anything else is a bad line.

The fast path splits a whole block with numpy (every separator found at once, each line
checked to have exactly the expected number of fields) and converts the fields eight
bytes at a time (SWAR); it accepts integers of up to 8 digits and categories of up to 8
hex digits, which is every value of the published data. A block holding anything else
is handed to the exact line parser (see :meth:`RawFormat.parse_block`).
"""

from __future__ import annotations

import re

import numpy as np

from bagpipe.preprocess.fastparse import (
    MISSING_KEY,
    padded,
    parse_decimals,
    parse_hex_keys,
    words,
)
from bagpipe.preprocess.formats import (
    BadLine,
    FieldLayout,
    Raw,
    RawFormat,
    Row,
    show,
    strip_cr,
)

DENSE_NAMES = [f"I{i}" for i in range(1, 14)]
CAT_NAMES = [f"C{i}" for i in range(1, 27)]
_INT_RE = re.compile(rb"-?[0-9]+")
_HEX_RE = re.compile(rb"[0-9a-fA-F]{1,16}")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class CriteoFormat(RawFormat):
    name = "criteo"
    key_kind = "hex"
    dense_names = DENSE_NAMES
    key_features = CAT_NAMES
    fixed_features: list = []
    seq_features: list = []
    feature_order = CAT_NAMES
    unlabelled_file = "Criteo's test.txt"

    def __init__(self, labelled: bool = True, header: str = "auto"):
        super().__init__(labelled, header)
        self.nfields = 40 if labelled else 39
        self._names = (["label"] if labelled else []) + DENSE_NAMES + CAT_NAMES

    def layout(self, path: str, first_line: bytes) -> FieldLayout:
        return FieldLayout(self._names, 0)

    # -- exact line parser ----------------------------------------------------
    def parse_line(self, line: bytes, layout: FieldLayout) -> Row:
        fields = strip_cr(line).split(b"\t")
        if len(fields) != self.nfields:
            raise BadLine(
                f"expected {self.nfields} tab-separated fields, got {len(fields)}"
                + self.label_hint(len(fields), self.nfields)
            )
        label = 0
        i = 0
        if self.labelled:
            if fields[0] not in (b"0", b"1"):
                raise BadLine(f"label {show(fields[0])} is not 0 or 1")
            label = fields[0][0] - 48
            i = 1
        dense = []
        for name, v in zip(DENSE_NAMES, fields[i : i + 13]):
            if not v:
                dense.append(0)
                continue
            if not _INT_RE.fullmatch(v):
                raise BadLine(f"{name} {show(v)} is not an integer")
            x = int(v)
            if not _INT64_MIN <= x <= _INT64_MAX:
                raise BadLine(f"{name} {show(v)} is out of the int64 range")
            dense.append(x)
        keys = []
        for name, v in zip(CAT_NAMES, fields[i + 13 :]):
            if not v:
                keys.append(MISSING_KEY)
                continue
            if not _HEX_RE.fullmatch(v):
                raise BadLine(f"{name} {show(v)} is not a hex category")
            k = int(v, 16)
            if k > _INT64_MAX:
                raise BadLine(f"{name} {show(v)} is out of range (at most 7fffffffffffffff)")
            keys.append(k)
        return Row(label, dense, keys)

    # -- vectorised fast path -------------------------------------------------
    def parse_fast(self, data: bytes, nlines: int, layout: FieldLayout) -> Raw | None:
        nf = self.nfields
        n = nlines
        if n == 0:
            return self.empty_raw()
        arr = padded(data)
        buf = arr[: len(data)]
        seps = np.flatnonzero(buf <= 10)  # tabs and newlines (other control bytes fail below)
        if len(seps) != n * nf:
            return None
        S = seps.reshape(n, nf)  # S[r, k]: the byte ending field k of line r
        if not (buf[S[:, :-1]] == 9).all() or not (buf[S[:, -1]] == 10).all():
            return None  # some line has a different number of fields
        last = S[:, -1]
        line_start = np.empty(n, dtype=np.int64)
        line_start[0] = 0
        line_start[1:] = last[:-1] + 1
        # field k >= 1 of line r spans [S[r, k-1] + 1, S[r, k])
        w = words(arr)
        if self.labelled:
            lab = buf[line_start]
            if not ((S[:, 0] - line_start == 1).all() and ((lab == 48) | (lab == 49)).all()):
                return None
            labels = (lab - 48).astype(np.float32)
            ints = parse_decimals(arr, w, (S[:, 0:13] + 1).ravel(), S[:, 1:14].ravel())
        else:
            labels = np.zeros(n, dtype=np.float32)
            starts = np.empty((n, 13), dtype=np.int64)
            starts[:, 0] = line_start
            starts[:, 1:] = S[:, 0:12] + 1
            ints = parse_decimals(arr, w, starts.ravel(), S[:, 0:13].ravel())
        if ints is None:
            return None
        c = nf - 26
        # categories in line order (the gather walks the buffer once), then transposed
        # to the feature-major layout of Raw.keys
        ends = S[:, c:].copy()
        cr = buf[last - 1] == 13
        if cr.any():
            ends[:, -1] -= cr  # "\r\n": the \r is not part of C26
        keys = parse_hex_keys(w, (S[:, c - 1 : nf - 1] + 1).ravel(), ends.ravel())
        if keys is None:
            return None
        keys = np.ascontiguousarray(keys.reshape(n, 26).T)
        return Raw(
            rows=np.arange(n, dtype=np.int64),
            labels=labels,
            dense=ints.reshape(n, 13),
            keys=keys,
            fixed=np.zeros((n, 0), dtype=np.int64),
        )
