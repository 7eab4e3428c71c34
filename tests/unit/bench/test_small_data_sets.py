"""Benchmarks at a size where the tables are smaller than the budget or than a batch.

* ``bench accel --quick --profile tiny``: the memory budget holds more rows than the
  tables have (266); the ``lru`` and ``lookahead`` runs were asked for
  ``--cache-rows 14,563``, which ``bagpipe train`` refuses. Every cache now gets at
  most the tables' rows (:func:`bagpipe.bench.harness.settings.cache_slots`, the cap the
  other scenarios use).
* ``bench sweep --quick --profile tiny``: every point was "too small" for a batch's unique
  rows, the command exited 0, matplotlib warned twice of an empty legend, and the plots
  were empty. A sweep with nothing it can measure is refused in one line saying what to
  raise, before any run; a legend is drawn only where there is a labelled line.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import pytest

from bagpipe.bench.harness.settings import cache_slots
from bagpipe.bench.scenarios.hot_tiers.scenario import AccelBench, plan_budget
from bagpipe.bench.scenarios.sweep.scenario import SweepBench, refuse_unmeasurable
from bagpipe.errors import ConfigError
from bagpipe.train.plot import legend, pyplot

pytestmark = pytest.mark.unit


def test_cache_slots_are_raised_to_a_batch_and_capped_at_the_tables():
    assert cache_slots(100, 1_000) == 100
    assert cache_slots(100, 1_000, at_least=300) == 300
    assert cache_slots(14_563, 266) == 266
    assert cache_slots(10, 266, at_least=9_984) == 266  # a batch touches more lookups than there are rows


def test_accel_never_asks_for_more_cache_rows_than_the_tables_hold():
    b = AccelBench.quick(profile="tiny")
    tiny = SimpleNamespace(total_rows=266, num_features=39)
    settings = plan_budget(b, tiny, row_bytes=4 * (8 + 1))
    assert b.budget_mb * 2**20 // 36 > 266  # the budget holds more rows than there are
    sized = {k: s["cache_rows"] for k, s in settings.items() if "cache_rows" in s}
    assert set(sized) == {"lru", "lookahead", "lookahead+hot"}
    assert sized == {"lru": 266, "lookahead": 266, "lookahead+hot": 266}
    # tables larger than the budget: the budget's rows, as before
    big = plan_budget(b, SimpleNamespace(total_rows=10**7, num_features=39), row_bytes=36)
    rows = int(b.budget_mb * 2**20 // 36)
    assert big["lru"]["cache_rows"] == big["lookahead"]["cache_rows"] == rows
    assert big["lookahead+hot"]["cache_rows"] == rows - int(b.hot_share * rows)


def sweep_points(b: SweepBench, total: int, widest: int) -> dict[str, dict[str, Any]]:
    points: dict[str, dict[str, Any]] = {
        f"{pct:g}%/L={L}": {
            "cache_percent": pct,
            "cache_rows": max(1, int(pct / 100 * total)),
            "lookahead": L,
            "too_small": max(1, int(pct / 100 * total)) < widest,
        }
        for pct in b.cache_percents
        for L in b.lookaheads
    }
    points["auto"] = {"cache_percent": None, "cache_rows": None, "lookahead": None, "too_small": False}
    return points


def test_a_sweep_with_nothing_measurable_is_refused_saying_what_to_raise():
    b = SweepBench.quick(profile="tiny")
    with pytest.raises(ConfigError) as e:
        refuse_unmeasurable(b, sweep_points(b, 266, 217), 266, 217)
    assert str(e.value) == (
        "bench sweep: nothing measurable at this size: the largest cache of --cache-percents (20% of 266 rows = 53) "
        "is smaller than the 217 unique rows a batch of 256 has, as is the auto-tuner's budget (2%); "
        "raise --scale or drop --profile tiny, or give --cache-percents of at least 82"
    )
    assert "\n" not in str(e.value)


def test_a_sweep_with_one_measurable_point_runs():
    b = SweepBench.quick(profile="tiny")
    refuse_unmeasurable(b, sweep_points(b, 26_363, 217), 26_363, 217)  # scale 1: 2% is 527 rows
    wide = SweepBench.quick(profile="tiny", cache_percents=(20, 90))
    refuse_unmeasurable(wide, sweep_points(wide, 266, 217), 266, 217)
    auto_only = SweepBench.quick(profile="tiny", autotune_percent=90.0)  # the auto-tuner's budget fits a batch
    refuse_unmeasurable(auto_only, sweep_points(auto_only, 266, 217), 266, 217)


def test_legend_only_where_a_line_is_labelled():
    plt = pyplot()
    fig, (empty, labelled) = plt.subplots(1, 2)
    labelled.plot([1, 2], [3, 4], label="L=1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "No artists with labels found to put in legend"
        legend(empty, fontsize=8)
        legend(labelled, fontsize=8)
    assert empty.get_legend() is None and labelled.get_legend() is not None
    plt.close(fig)
