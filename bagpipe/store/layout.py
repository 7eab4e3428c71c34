"""Where a disk store keeps each row: the row layout of ``rows.f32``.

A disk store reads and writes whole pages: a row of 4 (D + S) bytes that is not in the
page cache costs the kernel a page (4 KiB) read -- and a read-modify-write when it is
written back -- whatever else that page holds. With row g at slot g (the *identity*
layout) the rows a job uses are spread over the whole file: the Criteo-Kaggle profile of
``bench scale`` touches 302,372 of its 16.9M rows (75 MiB of a 4.1 GiB file) yet nearly
one page per touched row, 1.1 GiB of pages, more than its memory group holds, so almost
every row fetched or written back is a cold page.

The *frequency* layout packs the K rows a job uses most into the first K slots, hottest
first, so that pages hold rows that are used often -- and stay in the page cache -- and
the rest keep their place behind them::

    slot(g) = i        if g is packed[i]       (0 <= i < K)
    slot(g) = K + g    otherwise

``rows.f32`` then holds num_rows + K slots (a packed row's own slot K + g is never used:
a hole of the sparse file). The mapping is a pure relabelling of where bytes lie: every
read returns the row's value whatever the layout (:class:`RowLayout` is tested against
the identity, the plain reference). Idea from Bandana (Eisenman et al., SysML 2019),
which places embedding rows used together in the same NVM block.

Memory: 20 bytes a packed row (the rows in slot order, sorted, and their slots); K = 0 costs nothing.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from bagpipe.errors import DataError


@dataclass(frozen=True)
class LayoutChoice:
    """The row layout a run's disk store has, and why (``--store-layout``, default ``auto``:
    :func:`bagpipe.budget.shape.choose_layout`); the summary's ``store.layout_choice``."""

    name: Literal["identity", "frequency"]
    why: str
    """One line: the option given, the rule ``auto`` applied, or the store reopened."""
    made: bool = True
    """The run makes the store here (a frequency layout then counts the train split at
    start-up); False: it reopens one, which keeps the layout it was made with."""
    packed_rows: int = 0
    """A reopened store's packed rows (its header's); 0 for a store made here (counted then)."""
    auto: bool = False
    """Chosen by ``--store-layout auto`` (which falls back to identity where a memory budget
    does not hold the count)."""
    used_rows: int = 0
    """A frequency layout made here: the rows the train split uses, where they were counted
    before deciding (a memory budget that does not hold the estimate bounded by the split's
    lookups); 0: not counted (the estimate takes every lookup as a row)."""


@dataclass(frozen=True, eq=False)  # compared by identity: == over an array field would raise
class RowLayout:
    """The slots of a store's rows: ``packed`` (K,) int64 are the rows of slots 0..K-1 (unique,
    in [0, num_rows)); every other row g is at slot K + g. ``RowLayout.identity()`` is K = 0."""

    packed: np.ndarray
    _ids: np.ndarray = field(init=False, repr=False, compare=False)  # (K,) the packed rows, ascending
    _slots: np.ndarray = field(init=False, repr=False, compare=False)  # (K,) int32/64: slot of _ids[i]

    def __post_init__(self) -> None:
        packed = np.ascontiguousarray(self.packed, dtype=np.int64).reshape(-1)
        order = np.argsort(packed, kind="stable")
        ids = packed[order]
        if len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):
            raise ValueError("RowLayout: packed rows must be unique")
        if len(ids) and ids[0] < 0:
            raise ValueError(f"RowLayout: packed row {int(ids[0])} is negative")
        object.__setattr__(self, "packed", packed)
        object.__setattr__(self, "_ids", ids)
        object.__setattr__(self, "_slots", order.astype(np.int32 if len(ids) < 2**31 else np.int64))

    @classmethod
    def identity(cls) -> RowLayout:
        return cls(np.zeros(0, dtype=np.int64))

    @property
    def num_packed(self) -> int:
        """K: the rows at the front of the file."""
        return len(self._ids)

    @property
    def is_identity(self) -> bool:
        return self.num_packed == 0

    def slot_count(self, num_rows: int) -> int:
        """Slots of ``rows.f32`` for a table of ``num_rows`` rows."""
        return num_rows + self.num_packed

    def slots(self, rows: np.ndarray) -> np.ndarray:
        """(n,) int64 slots of ``rows`` (n,) int64 (the rows themselves, not a copy, when K = 0)."""
        k = self.num_packed
        if k == 0:
            return rows
        pos = np.searchsorted(self._ids, rows)
        np.minimum(pos, k - 1, out=pos)
        hit = self._ids[pos] == rows
        out = rows + k
        out[hit] = self._slots[pos[hit]]
        return out

    def packed_in(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """The packed rows in [start, stop), ascending, and their slots."""
        a, b = np.searchsorted(self._ids, [start, stop])
        return self._ids[a:b], self._slots[a:b].astype(np.int64)

    def check(self, num_rows: int, where: Path | str) -> None:
        """Raise :class:`DataError` naming ``where`` if a packed row is outside [0, num_rows)."""
        if self.num_packed and self._ids[-1] >= num_rows:
            raise DataError(f"{where}: packed row {int(self._ids[-1])} outside the table's {num_rows:,} rows")

    def crc32(self) -> str:
        return _crc32(self.packed.astype("<i8").tobytes())

    def save(self, path: Path) -> None:
        """``packed`` as raw little-endian int64 (K * 8 bytes), fsynced."""
        import os

        with open(path, "wb") as f:
            f.write(self.packed.astype("<i8").tobytes())
            f.flush()
            os.fsync(f.fileno())

    @classmethod
    def load(cls, path: Path, num_packed: int, crc32: str) -> RowLayout:
        """A layout :meth:`save` wrote, checked against the header's K and CRC-32."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise DataError(
                f"{path}: DiskStore file missing (the store's header names a layout of {num_packed:,} rows)"
            ) from None
        if len(raw) != 8 * num_packed:
            raise DataError(f"{path}: DiskStore file is {len(raw)} bytes, expected {8 * num_packed}")
        got = _crc32(raw)  # on the bytes, before they are read as rows
        if got != crc32:
            raise DataError(f"{path}: its CRC-32 is {got}, the store's header says {crc32}: the file is damaged")
        try:
            return cls(np.frombuffer(raw, dtype="<i8").astype(np.int64))
        except ValueError as e:  # a layout written wrong, its CRC with it
            raise DataError(f"{path}: {str(e).removeprefix('RowLayout: ')}: the file is damaged") from None


def _crc32(raw: bytes) -> str:
    """The CRC-32 of layout.i64's bytes, as the header keeps it (8 hex digits)."""
    return f"{zlib.crc32(raw) & 0xFFFFFFFF:08x}"


def frequency_layout(counts_rows: np.ndarray, counts: np.ndarray, max_rows: int) -> RowLayout:
    """The frequency layout of rows used ``counts`` times (rows ``counts_rows``, counts > 0):
    the ``max_rows`` most used, most used first (ties: lower row first). Peak memory, with
    the two arguments' 16 bytes a row: 44 bytes a row given; the layout keeps 20 a packed row."""
    if max_rows < 0:
        raise ValueError(f"frequency_layout: max_rows must be >= 0, got {max_rows}")
    order = np.lexsort((counts_rows, np.negative(counts, dtype=np.int64)))[:max_rows]
    packed = counts_rows[order]
    del order  # before RowLayout sorts its own copies: 28 bytes a row at the peak, not 36
    return RowLayout(packed)
