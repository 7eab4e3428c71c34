"""What a raw log format is: its schema, its two parsers, and what they produce.

A format (:class:`RawFormat`; :mod:`bagpipe.preprocess.criteo`, :mod:`~bagpipe.preprocess.avazu`,
:mod:`~bagpipe.preprocess.taobao`) names its features and implements

* ``layout``: a file's :class:`FieldLayout` (column names, header lines) from its first line;
* ``parse_line``: the exact reference parser, one line -> :class:`Row`, or :class:`BadLine`
  naming the problem;
* ``parse_fast``: a vectorised parser of a whole block -> :class:`Raw`, or None to decline.

:meth:`RawFormat.parse_block` combines them: the fast path for the whole block, and when
it declines, a bisection down to pieces of 16 lines that the line parser handles, so a
block with a few bad lines still goes mostly through the fast path and every bad line
is named. The output never depends on which path parsed a line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class BadLine(Exception):
    """Raised by a format's line parser; the message is the problem (no file/line)."""


def show(value: bytes, limit: int = 40) -> str:
    """A bad field for an error message: quoted, control bytes escaped, truncated."""
    s = value.decode("utf-8", "backslashreplace")
    if len(s) > limit:
        s = s[:limit] + "..."
    return repr(s)


def strip_cr(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\r") else line


def log1p_clipped(x: np.ndarray) -> np.ndarray:
    """DLRM's dense transform: float32(log(1 + max(x, 0))), computed in float64."""
    x = np.asarray(x, dtype=np.float64)
    return np.log1p(np.maximum(x, 0.0)).astype(np.float32)


# ---------------------------------------------------------------------------------
# Parsed lines
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

    def take(self, mask: np.ndarray) -> Raw:
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
        seqs.append((np.concatenate([p.seqs[j][0] for p in parts]), np.concatenate([p.seqs[j][1] for p in parts])))
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
class FieldLayout:
    """How one file's lines are laid out: column names in order and header lines.

    (Not :class:`bagpipe.distributed.layout.Layout`, the trainers and servers of a job.)
    """

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

    #: The label column as a hint names it, and a file of lines without it.
    label_column = "a label column first"
    unlabelled_file = "a test file"

    def __init__(self, labelled: bool = True, header: str = "auto"):
        self.labelled = labelled
        self.header = header

    def label_hint(self, got: int, expected: int) -> str:
        """Why a line may have one field too few or too many: the label column (`` (...)``,
        or "" for any other count)."""
        if self.labelled and got == expected - 1:
            return (
                f" (no label column, as in {self.unlabelled_file}? preprocess --no-label, "
                "or predict without --labelled)"
            )
        if not self.labelled and got == expected + 1:
            return f" ({self.label_column}, as in training lines? predict --labelled, or preprocess without --no-label)"
        return ""

    # -- layout ---------------------------------------------------------------
    def layout(self, path: str, first_line: bytes) -> FieldLayout:
        raise NotImplementedError

    # -- parsing --------------------------------------------------------------
    def parse_fast(self, data: bytes, nlines: int, layout: FieldLayout) -> Raw | None:
        return None

    def parse_line(self, line: bytes, layout: FieldLayout) -> Row:
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
    def parse_block(
        self, data: bytes, nlines: int, layout: FieldLayout, stop_at_bad: bool
    ) -> tuple[Raw, list[tuple[int, str]]]:
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
            end = min(s + step, hi)
            raw = self.parse_fast(b"\n".join(lines[s:end]) + b"\n", end - s, layout)
            if raw is not None:
                raw.rows += s
                parts.append(raw)
            else:
                self._bisect(lines, s, end, layout, parts, bad, stop)
            if stop and bad:
                return
