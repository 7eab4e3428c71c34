"""``bagpipe.preprocess.options.Options`` checks itself when made: one test per check,
each asserting the exact one-line message, plus the defaults it resolves and the
re-check that ``run_preprocess`` does on an Options changed after it was made."""

from __future__ import annotations

import os

import pytest

from bagpipe.errors import ConfigError
from bagpipe.preprocess.criteo import CriteoFormat
from bagpipe.preprocess.options import Options
from bagpipe.preprocess.run import run_preprocess

pytestmark = pytest.mark.unit


def make(**kw) -> Options:
    args = {"out": "out", "inputs": ["day.tsv"], **kw}
    return Options(**args)


BAD = {
    "empty-out": ({"out": ""}, "--out is empty (give the output dataset directory)"),
    "on-error": ({"on_error": "ignore"}, "--on-error must be fail or skip, got 'ignore'"),
    "rows-per-shard-zero": ({"rows_per_shard": 0}, "--rows-per-shard must be > 0, got 0"),
    "rows-per-shard-negative": ({"rows_per_shard": -5}, "--rows-per-shard must be > 0, got -5"),
    "block-bytes-zero": ({"block_bytes": 0}, "block size must be at least 1 KiB"),
    "block-bytes-small": ({"block_bytes": 1023}, "block size must be at least 1 KiB"),
    "workers-zero": ({"workers": 0}, "--workers must be >= 1, got 0"),
    "workers-negative": ({"workers": -2}, "--workers must be >= 1, got -2"),
    "max-rows-zero": ({"max_rows_per_table": 0}, "--max-rows-per-table must be >= 1, got 0"),
    "min-count-zero": ({"min_count": 0}, "--min-count must be >= 1, got 0"),
    "min-count-negative": ({"min_count": -1}, "--min-count must be >= 1, got -1"),
    "hash-and-min-count": (
        {"max_rows_per_table": 10, "min_count": 2},
        "--max-rows-per-table, --min-count and --vocab-from exclude each other",
    ),
    "hash-and-vocab-from": (
        {"max_rows_per_table": 10, "vocab_from": "data/criteo"},
        "--max-rows-per-table, --min-count and --vocab-from exclude each other",
    ),
    "min-count-and-vocab-from": (
        {"min_count": 2, "vocab_from": "data/criteo"},
        "--min-count cannot be combined with --vocab-from (the vocabulary brings its own)",
    ),
    "no-inputs": ({"inputs": []}, "no input files (give --input FILE... and/or --eval-files FILE...)"),
    "no-label-with-eval-files": (
        {"labelled": False, "eval_files": ["valid.tsv"]},
        "--no-label writes every line to split 'test'; --split and --eval-files do not apply",
    ),
    "no-label-with-split": (
        {"labelled": False, "split": 0.5},
        "--no-label writes every line to split 'test'; --split and --eval-files do not apply",
    ),
    "split-above-one": ({"split": 1.5}, "--split must be in [0, 1], got 1.5"),
    "split-negative": ({"split": -0.1}, "--split must be in [0, 1], got -0.1"),
    "split-nan": ({"split": float("nan")}, "--split must be in [0, 1], got nan"),
}


@pytest.mark.parametrize("kw,message", list(BAD.values()), ids=list(BAD))
def test_bad_options_raise_a_one_line_config_error(kw, message):
    with pytest.raises(ConfigError) as e:
        make(**kw)
    assert str(e.value) == message
    assert "\n" not in str(e.value)


def test_good_options_and_their_defaults():
    assert make().train_split == 0.9
    assert make(eval_files=["valid.tsv"]).train_split == 1.0
    assert make(split=0.0).train_split == 0.0
    assert make(split=1.0, eval_files=["valid.tsv"]).train_split == 1.0
    assert make(labelled=False).train_split is None
    assert make(inputs=[], eval_files=["valid.tsv"]).inputs == []
    assert make(workers=3).worker_threads == 3
    assert make().worker_threads == min(4, os.cpu_count() or 1)
    make(max_rows_per_table=1, block_bytes=1024, rows_per_shard=1, on_error="skip")
    make(min_count=1)
    make(vocab_from="data/criteo")


def test_run_checks_options_changed_after_they_were_made(tmp_path):
    opts = make(out=str(tmp_path / "o"), inputs=[str(tmp_path / "missing.tsv")])
    opts.workers = 0
    with pytest.raises(ConfigError, match=r"^--workers must be >= 1, got 0$"):
        run_preprocess(CriteoFormat(), opts)
