"""What a preprocessing run is asked to do (:class:`Options`) and what it reports (:class:`Result`).

:class:`Options` mirrors the ``bagpipe preprocess`` command line;
:func:`bagpipe.preprocess.run.run_preprocess` checks it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from bagpipe.data.shards import DEFAULT_ROWS_PER_SHARD
from bagpipe.preprocess.inputs import DEFAULT_BLOCK_BYTES

DEFAULT_SPLIT = 0.9  # of the --input lines to "train" when no --eval-files are given
MAX_DEFAULT_WORKERS = 4


@dataclass
class Options:
    """The options of one run; see ``bagpipe preprocess --help`` for each one's meaning.

    ``split``: fraction of the ``inputs`` lines (in order) that go to "train", the rest to
    "eval"; None means 0.9, or 1.0 when ``eval_files`` are given. ``min_count`` None is
    vocabulary mode with 1 unless ``max_rows_per_table`` (hashing) or ``vocab_from``
    chooses the mapping. ``workers`` None: the CPU count, at most 4. ``block_bytes``: text
    read per block. ``progress`` None: a progress bar when stderr is a terminal.
    """

    out: str
    inputs: list[str] = field(default_factory=list)
    eval_files: list[str] = field(default_factory=list)
    split: float | None = None  # None: 0.9, or 1.0 with eval files
    labelled: bool = True
    header: str = "auto"  # "auto" or "no"
    max_rows_per_table: int | None = None
    min_count: int | None = None  # None: 1 (vocabulary mode)
    vocab_from: str | None = None
    on_error: str = "fail"
    overwrite: bool = False
    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD
    workers: int | None = None
    block_bytes: int = DEFAULT_BLOCK_BYTES
    progress: bool | None = None  # None: when stderr is a terminal

    @property
    def train_split(self) -> float | None:
        """The fraction of the ``inputs`` lines that go to "train" (None: unlabelled, all "test")."""
        if not self.labelled:
            return None
        if self.split is not None:
            return self.split
        return 1.0 if self.eval_files else DEFAULT_SPLIT

    @property
    def worker_threads(self) -> int:
        """Parser threads: ``workers``, or the CPU count up to :data:`MAX_DEFAULT_WORKERS`."""
        return self.workers if self.workers is not None else min(MAX_DEFAULT_WORKERS, os.cpu_count() or 1)


@dataclass
class Result:
    """What a run wrote: rows per split, skipped lines, tables, and its speed."""

    out: str
    rows: dict[str, int]
    skipped: int
    bad_examples: list[str]
    num_tables: int
    total_rows: int
    mapping: dict
    text_bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.text_bytes / 1e6 / max(self.seconds, 1e-9)

    def summary(self, fmt_name: str) -> str:
        splits = ", ".join(f"{k} {v:,}" for k, v in self.rows.items())
        if self.mapping["mode"] == "hash":
            how = f"hashed to {self.mapping['max_rows_per_table']:,} rows"
        else:
            how = f"vocabulary min-count {self.mapping['min_count']}"
        return (
            f"{fmt_name}: rows {splits}; skipped {self.skipped:,} bad lines; "
            f"{self.num_tables} tables ({how}, {self.total_rows:,} rows); "
            f"{self.text_bytes / 1e6:,.1f} MB in {self.seconds:.1f} s = {self.mb_per_s:,.1f} MB/s -> {self.out}"
        )
