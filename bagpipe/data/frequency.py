"""How often a split looks up each row: the counts behind a disk store's frequency layout
(:mod:`bagpipe.store.layout`)."""

from __future__ import annotations

import logging
import time

import numpy as np

from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.store.layout import RowLayout, frequency_layout

LAYOUT_MAX_ROWS = 4_000_000
"""The most rows a frequency layout packs (20 bytes each in memory: 80 MB)."""

COUNT_BATCH = 1 << 16
"""Samples read at a time while counting (one pass over the split, in file order)."""


def row_use_counts(dataset: Dataset, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """(rows, counts): every row the split looks up, ascending (int64), and how many times
    (int64). One pass over the split in file order; 4 bytes a row of the tables while it
    counts (uint32, saturating at 2^32 - 1: a Terabyte-sized split looks a low-cardinality
    row up more often than that, and a wrapped count would rank it cold) and at most 20 a
    row used, then 16 a row used (the two arrays returned)."""
    stream = BatchStream(dataset, split, COUNT_BATCH, shuffle=False, drop_last=False)
    counts = np.zeros(dataset.meta.total_rows, dtype=np.uint32)
    for batch in stream.batches():
        count_lookups(counts, batch.rows.numpy())
    rows = np.flatnonzero(counts)
    return rows, counts[rows].astype(np.int64)


def rows_used(dataset: Dataset, split: str = "train") -> int:
    """How many distinct rows the split looks up: one pass over its ids in file order, 1
    byte a row of the tables (a mask) and a counting batch's ids."""
    stream = BatchStream(dataset, split, COUNT_BATCH, shuffle=False, drop_last=False)
    seen = np.zeros(dataset.meta.total_rows, dtype=bool)
    for batch in stream.batches():
        seen[batch.rows.numpy()] = True
    return int(np.count_nonzero(seen))


def count_lookups(counts: np.ndarray, rows: np.ndarray) -> None:
    """Add the lookups ``rows`` (any shape, repeats counted) to ``counts`` (uint32, one a row),
    saturating at 2^32 - 1."""
    u, c = np.unique(rows, return_counts=True)
    counts[u] = np.minimum(counts[u].astype(np.uint64) + c.astype(np.uint64), np.iinfo(np.uint32).max)


def frequency_store_layout(dataset: Dataset, max_rows: int = LAYOUT_MAX_ROWS) -> RowLayout:
    """The frequency layout of the train split's rows (:mod:`bagpipe.store.layout`): the
    ``max_rows`` rows it looks up most, counted over the whole split; said in one line."""
    t0 = time.perf_counter()
    rows, counts = row_use_counts(dataset)
    layout = frequency_layout(rows, counts, max_rows)
    logging.getLogger(__name__).info(
        f"store layout: the {layout.num_packed:,} rows the train split uses most (of {len(rows):,} it uses, "
        f"{int(counts.sum()):,} lookups) at the front of the disk store's file ({time.perf_counter() - t0:.1f} s)"
    )
    return layout
