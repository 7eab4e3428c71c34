"""The cache auto-tuner (``bagpipe train --cache-budget-mb``) and its place in a run.

Proves: the chosen cache fits the budget (and is the most the budget buys); the chosen
L plans without forced evictions (or under 1% of misses) and is the largest candidate
that does, so a bigger budget never gives a smaller L; a budget below one batch's unique
rows is a one-line error, as is a budget together with --cache-rows; and through the
CLI the choice is printed as one line, recorded in summary.json, matches what the run's
own oracle then does, and the run ends with the same params_sha256 as --mode full.
"""

from __future__ import annotations

import json

import pytest
import torch

from bagpipe.config.train import TrainConfig
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.errors import CapacityError, ConfigError
from bagpipe.oracle.autotune import DEFAULT_CANDIDATES, bytes_per_cached_row, choose

pytestmark = pytest.mark.integration

BATCH = 64
STEPS = 120
DIM, STATE = 8, 1  # the debug recipe's D, Adagrad's per-row state


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def stream(tiny_data):
    return BatchStream(Dataset(tiny_data), "train", BATCH, seed=0)


def tune(stream, budget_mb, **kw):
    return choose(budget_mb, stream.meta.total_rows, DIM, STATE, stream.batch, STEPS, **kw)


BUDGETS = (0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.4, 1.0, 4.0)


@pytest.fixture(scope="module")
def choices(stream):
    return [tune(stream, b) for b in BUDGETS]


def test_choice_fits_the_budget(stream, choices):
    bpr = bytes_per_cached_row(DIM, STATE)
    assert bpr == 4 * (DIM + STATE) + 8
    total = stream.meta.total_rows
    for budget, c in zip(BUDGETS, choices):
        assert c.cache_rows * bpr <= budget * 2**20
        # the most the budget buys (or every row)
        assert c.cache_rows == total or (c.cache_rows + 1) * bpr > budget * 2**20
        assert c.lookahead in set(DEFAULT_CANDIDATES) | {STEPS}
        assert c.reason and str(c.cache_rows) not in ("", "0")


def test_chosen_lookahead_is_the_largest_that_fits(choices):
    for c in choices:
        fits = [t for t in c.trials if t.fits]
        assert fits and fits[-1].lookahead == c.lookahead
        chosen = fits[-1]
        assert chosen.forced_evictions == 0 or chosen.forced_evictions < 0.01 * chosen.misses
        assert chosen.max_occupied <= c.cache_rows
        # the search stopped at the first candidate that does not fit, or ran out of candidates
        assert all(t.fits for t in c.trials[:-1])
        if not c.trials[-1].fits:
            assert c.trials[-1].lookahead > c.lookahead


def test_bigger_budget_never_gives_smaller_lookahead(choices):
    ls = [c.lookahead for c in choices]
    rows = [c.cache_rows for c in choices]
    assert ls == sorted(ls), ls
    assert rows == sorted(rows)
    assert ls[0] < ls[-1], "the budgets should span constrained and unconstrained windows"


def test_lru_sizes_the_cache_only(stream):
    c = tune(stream, 0.1, tune_lookahead=False)
    assert c.lookahead is None and c.trials == []
    assert c.cache_rows == tune(stream, 0.1).cache_rows


def test_budget_below_one_batch_is_a_capacity_error(stream):
    with pytest.raises(CapacityError, match="give at least"):
        tune(stream, 0.001)


def test_budget_and_cache_rows_are_exclusive(tmp_path):
    with pytest.raises(ConfigError, match="mutually exclusive"):
        TrainConfig.of(data="d", out=str(tmp_path), cache_budget_mb=1.0, cache_rows=100)
    with pytest.raises(ConfigError, match="cache budget"):
        TrainConfig.of(data="d", out=str(tmp_path), cache_budget_mb=-1.0)


def test_cli_prints_choice_and_stays_exact(tiny_data, tmp_path, run_cli):
    common = [
        "train",
        "--data",
        tiny_data,
        "--steps",
        STEPS,
        "--batch-size",
        BATCH,
        "--seed",
        0,
        "--no-progress",
        "--no-final-checkpoint",
        "--eval-samples",
        512,
    ]
    rc, out, err = run_cli(*common, "--out", tmp_path / "full", "--mode", "full")
    assert rc == 0, err
    full = json.loads((tmp_path / "full" / "summary.json").read_text())

    rc, out, err = run_cli(*common, "--out", tmp_path / "auto", "--mode", "lookahead", "--cache-budget-mb", 0.05)
    assert rc == 0, err
    lines = [ln for ln in out.splitlines() if ln.startswith("cache budget 0.05 MiB -> ")]
    assert len(lines) == 1, out
    auto = json.loads((tmp_path / "auto" / "summary.json").read_text())
    tuned = auto["cache"]["autotune"]
    assert f"{tuned['cache_rows']:,} rows" in lines[0] and f"lookahead {tuned['lookahead']}:" in lines[0]
    assert auto["cache"]["cache_rows"] == tuned["cache_rows"]
    assert auto["cache"]["lookahead"] == tuned["lookahead"]
    # the tuner planned this very run (its first STEPS batches): the run's oracle agrees
    chosen = next(t for t in tuned["trials"] if t["lookahead"] == tuned["lookahead"])
    assert chosen["batches"] == STEPS
    assert auto["cache"]["forced_evictions"] == chosen["forced_evictions"]
    assert auto["cache"]["misses"] == chosen["misses"]
    assert auto["params_sha256"] == full["params_sha256"]

    rc, out, err = run_cli(
        *common, "--out", tmp_path / "bad", "--mode", "lookahead", "--cache-budget-mb", 1, "--cache-rows", 500
    )
    assert rc == 2 and "mutually exclusive" in err and "\n" not in err.strip()
