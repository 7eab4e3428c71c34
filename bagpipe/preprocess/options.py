"""What a preprocessing run is asked to do (:class:`Options`) and what it reports (:class:`Result`).

:class:`Options` mirrors the ``bagpipe preprocess`` command line and checks itself when
made: a bad value or a contradiction raises :class:`~bagpipe.errors.ConfigError` with a
one-line message naming the option as the command line spells it. Only what needs the
file system (inputs that exist, the same file given twice, an output directory that
already holds a dataset) is left to :func:`bagpipe.preprocess.run.run_preprocess`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from bagpipe.data.shards import DEFAULT_ROWS_PER_SHARD
from bagpipe.errors import ConfigError
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
    max_rows_per_table: int | None = None
    min_count: int | None = None  # None: 1 (vocabulary mode)
    vocab_from: str | None = None
    on_error: str = "fail"
    overwrite: bool = False
    rows_per_shard: int = DEFAULT_ROWS_PER_SHARD
    workers: int | None = None
    block_bytes: int = DEFAULT_BLOCK_BYTES
    progress: bool | None = None  # None: when stderr is a terminal

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise ConfigError for the first bad value or contradiction, in one line."""
        if not str(self.out):
            raise ConfigError("--out is empty (give the output dataset directory)")
        if self.on_error not in ("fail", "skip"):
            raise ConfigError(f"--on-error must be fail or skip, got {self.on_error!r}")
        if self.rows_per_shard <= 0:
            raise ConfigError(f"--rows-per-shard must be > 0, got {self.rows_per_shard}")
        if self.block_bytes < 1024:
            raise ConfigError("block size must be at least 1 KiB")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.max_rows_per_table is not None and self.max_rows_per_table < 1:
            raise ConfigError(f"--max-rows-per-table must be >= 1, got {self.max_rows_per_table}")
        if self.min_count is not None and self.min_count < 1:
            raise ConfigError(f"--min-count must be >= 1, got {self.min_count}")
        if self.max_rows_per_table is not None and (self.min_count is not None or self.vocab_from):
            raise ConfigError("--max-rows-per-table, --min-count and --vocab-from exclude each other")
        if self.min_count is not None and self.vocab_from:
            raise ConfigError("--min-count cannot be combined with --vocab-from (the vocabulary brings its own)")
        if not self.inputs and not self.eval_files:
            raise ConfigError("no input files (give --input FILE... and/or --eval-files FILE...)")
        if not self.labelled and (self.eval_files or self.split is not None):
            raise ConfigError("--no-label writes every line to split 'test'; --split and --eval-files do not apply")
        if self.split is not None and not 0.0 <= self.split <= 1.0:
            raise ConfigError(f"--split must be in [0, 1], got {self.split}")

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
