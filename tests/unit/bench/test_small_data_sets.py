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
* ``bench accel --quick --profile tiny`` then ran: every configuration's hot tier or cache
  held all 266 rows, nothing was read from the store, and the command exited 0 with
  ratios and targets as if something had been compared. It is refused in one line (exit
  2) before anything is generated or made; its table says n/a for the hit rate of a cache
  that planned no row (a hot tier served every lookup) and "-" for the cache rows of a
  mode with no cache (they were the staged batch's 2048).
* A refused ``bench sweep`` left the data set it had generated in ``--out``: the data set
  is now checked in a staging folder and swapped in only when the sweep runs, so a
  refusal leaves ``--out`` as it was (no folder made, a data set of another size there
  untouched).
* That refusal named only a larger ``--scale`` (``--budget-mb 100000`` at ``--quick``:
  "at least 87", 2.9 billion rows); it also names the largest ``--budget-mb`` that leaves
  a configuration cold rows to read.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bagpipe.bench.harness.runner import data_samples, ensure_synth, has_synth, prepare_checked
from bagpipe.bench.harness.settings import cache_slots
from bagpipe.bench.scenarios.hot_tiers import scenario as accel
from bagpipe.bench.scenarios.hot_tiers.scenario import AccelBench, plan_budget
from bagpipe.bench.scenarios.sweep.scenario import SweepBench, refuse_unmeasurable
from bagpipe.commands.bench import mark_out
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
    tiny = accel.Tables(total_rows=266, num_features=39)
    settings = plan_budget(b, tiny, row_bytes=4 * (8 + 1))
    assert b.budget_mb * 2**20 // 36 > 266  # the budget holds more rows than there are
    sized = {k: s["cache_rows"] for k, s in settings.items() if "cache_rows" in s}
    assert set(sized) == {"lru", "lookahead", "lookahead+hot"}
    assert sized == {"lru": 266, "lookahead": 266, "lookahead+hot": 266}
    # tables larger than the budget: the budget's rows, as before
    big = plan_budget(b, accel.Tables(total_rows=10**7, num_features=39), row_bytes=36)
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


# -- accel: a budget that holds every row is refused; its table's n/a and "-" ------------------------

ACCEL_TINY = (
    "bench accel: nothing measurable at this size: the 266 rows of all tables (tiny x 0.01) fit in --budget-mb 0.5 "
    "(14,563 rows of 36 bytes), so every configuration keeps every row in its hot tier or cache and none reads one "
    "from the store; raise --scale to at least 0.56, or lower --budget-mb to at most 0.0794, or drop --profile tiny"
)


def one_line_error(rc: int, err: str) -> str:
    """The one ``bagpipe bench: error:`` line of a refusal (exit 2, no traceback), less its prefix."""
    assert rc == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("bagpipe bench: error: ")]
    assert len(lines) == 1, err
    return lines[0].split(": error: ", 1)[1]


def snapshot(folder: Path) -> dict[str, object]:
    """Every entry under ``folder`` (hidden ones too): a file's bytes' digest and mtime, a folder's mtime."""
    return {
        str(p.relative_to(folder)): (
            (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) if p.is_file() else p.stat().st_mtime_ns
        )
        for p in sorted(folder.rglob("*"))
    }


def test_accel_whose_budget_holds_every_row_is_refused_before_anything_is_made(run_cli, tmp_path):
    rc, out, err = run_cli("bench", "accel", "--quick", "--profile", "tiny", "--out", tmp_path / "new" / "accel")
    assert one_line_error(rc, err) == ACCEL_TINY
    assert "[rep" not in out  # no run
    assert list(tmp_path.iterdir()) == []  # no --out, no data set
    # an --out the user has, with files of theirs and a data set: as it was
    mine = tmp_path / "mine"
    ensure_synth(mine / "data", "tiny", 500, 0.01, seed=1, progress=False)
    (mine / "notes.txt").write_text("keep me\n")
    mark_out(mine)  # an earlier bench's --out (its mark) with a note of the user's: a bench's own refusal
    before = snapshot(mine)
    rc, _, err = run_cli("bench", "accel", "--quick", "--profile", "tiny", "--reps", "1", "--out", mine)
    assert one_line_error(rc, err) == ACCEL_TINY
    assert snapshot(mine) == before


@pytest.mark.parametrize(
    "settings, most",
    [
        ({"profile": "tiny"}, 0.0794),  # the tables' 266 rows and fae's staged batch of 256 x 8
        ({"profile": "tiny", "configs": ("lru", "lookahead")}, 0.00913),  # no staged batch: the tables alone
        ({"budget_mb": 100000.0}, 11.8),  # criteo-kaggle at --quick: not only --scale 87 (2.9 billion rows)
    ],
)
def test_accel_nothing_measurable_names_the_largest_budget_that_leaves_cold_rows(settings, most):
    row_bytes = 4 * (8 + 1)
    b = AccelBench.quick(**settings)
    tables = accel.tables(b)
    with pytest.raises(ConfigError, match=rf"or lower --budget-mb to at most {most}(,|$)"):
        accel.refuse_unmeasurable(b, tables, row_bytes)
    fits = AccelBench.quick(**{**settings, "budget_mb": most})  # the budget named: measurable, and no other refusal
    accel.refuse_unmeasurable(fits, tables, row_bytes)
    accel.refuse_no_hot_tier(fits, tables, row_bytes)
    above = AccelBench.quick(**{**settings, "budget_mb": most * 1.01})  # a hair more: every row held again
    with pytest.raises(ConfigError):
        accel.refuse_unmeasurable(above, tables, row_bytes)


def test_accel_runs_where_some_configuration_reads_from_the_store():
    row_bytes = 4 * (8 + 1)  # the debug recipe's D = 8 and Adagrad's one state value
    b = AccelBench.quick(profile="tiny")
    # the scale the message names: no configuration holds every row (14,764 rows > 14,563)
    assert accel.tables(AccelBench.quick(profile="tiny", scale=0.56)).total_rows == 14_764
    accel.refuse_unmeasurable(b, accel.tables(AccelBench.quick(profile="tiny", scale=0.56)), row_bytes)
    # refused as long as fae's hot tier (the budget less one staged batch: 12,515 rows) too holds every row
    accel.refuse_unmeasurable(b, accel.tables(AccelBench.quick(profile="tiny", scale=0.48)), row_bytes)  # 12,654
    with pytest.raises(ConfigError):
        accel.refuse_unmeasurable(b, accel.tables(AccelBench.quick(profile="tiny", scale=0.47)), row_bytes)
    accel.refuse_unmeasurable(AccelBench.quick(), accel.tables(AccelBench.quick()), row_bytes)  # 337,632 rows
    # the budget less one staged batch (fae, hotline) no longer holds the tables: they read the cold rest
    tables = accel.Tables(total_rows=14_000, num_features=8)
    accel.refuse_unmeasurable(b, tables, row_bytes)
    with pytest.raises(ConfigError):
        accel.refuse_unmeasurable(AccelBench.quick(profile="tiny", configs=("lru", "lookahead")), tables, row_bytes)
    # nocache alone has no budget to hold anything: it reads every row
    accel.refuse_unmeasurable(AccelBench.quick(profile="tiny", configs=("nocache",)), accel.tables(b), row_bytes)
    assert accel.tables(b) == accel.Tables(total_rows=266, num_features=8)


ACCEL_NO_HOT_TIER = (
    "bench accel: --budget-mb 0.2 (5,825 rows of 36 bytes) does not cover one batch's staged rows "
    "(--batch-size 256 x 26 features = 6,656 rows), which fae, fae-split and hotline hold besides their hot tier, "
    "so it leaves them no hot row; give --budget-mb of at least 0.229"
)


def test_accel_whose_budget_leaves_fae_no_hot_tier_is_refused_before_anything_is_made(run_cli, tmp_path):
    """It used to generate 19 MB of data and the table file into --out, then stop on the
    profile's "hot budget must be > 0 MiB, got 0.0" (a hot budget the user never gave)."""
    rc, out, err = run_cli("bench", "accel", "--quick", "--budget-mb", "0.2", "--out", tmp_path / "new" / "accel")
    assert one_line_error(rc, err) == ACCEL_NO_HOT_TIER
    assert "[rep" not in out and "profile for" not in out
    assert list(tmp_path.iterdir()) == []  # no --out, no data set
    mine = tmp_path / "mine"  # an --out the user has: as it was
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    mark_out(mine)  # an earlier bench's --out (its mark) with a note of the user's: a bench's own refusal
    before = snapshot(mine)
    rc, _, err = run_cli("bench", "accel", "--quick", "--budget-mb", "0.001", "--out", mine)
    assert one_line_error(rc, err) == ACCEL_NO_HOT_TIER.replace("0.2 (5,825", "0.001 (29")
    assert snapshot(mine) == before


def test_accel_names_the_least_budget_that_leaves_a_hot_tier():
    row_bytes = 4 * (8 + 1)
    shape = accel.tables(AccelBench.quick())  # 26 features: a staged batch is 6,656 rows, 0.2285 MiB
    for mb in (0.2, 0.228):
        with pytest.raises(ConfigError, match="give --budget-mb of at least 0.229$"):
            accel.refuse_no_hot_tier(AccelBench.quick(budget_mb=mb), shape, row_bytes)
    b = AccelBench.quick(budget_mb=0.229)  # the budget it names: fae's hot tier has rows
    accel.refuse_no_hot_tier(b, shape, row_bytes)
    hot_mb = plan_budget(b, shape, row_bytes)["fae"]["hot_mb"]
    assert int(hot_mb * (1 << 20) // row_bytes) >= 1
    # without fae, fae-split and hotline a budget below a batch is no hot-tier problem (the caches are raised to a batch)
    accel.refuse_no_hot_tier(AccelBench.quick(budget_mb=0.2, configs=("nocache", "lru", "lookahead")), shape, row_bytes)
    names = AccelBench.quick(budget_mb=0.2, configs=("lru", "hotline"))
    with pytest.raises(ConfigError, match="which hotline holds besides its hot tier, so it leaves it no hot row"):
        accel.refuse_no_hot_tier(names, shape, row_bytes)
    # lookahead+hot's share of a budget of a row: no hot row
    tiny = AccelBench.quick(budget_mb=0.00003, configs=("lookahead+hot",))
    with pytest.raises(ConfigError, match=r"leaves lookahead\+hot no hot row .* at least 6.87e-05$"):
        accel.refuse_no_hot_tier(tiny, shape, row_bytes)
    accel.refuse_no_hot_tier(AccelBench.quick(budget_mb=6.87e-05, configs=("lookahead+hot",)), shape, row_bytes)


def _summary(mode: str, cache_rows: int, unique_rows: int, hot_rows: int = 0) -> dict:
    hot = {"rows": hot_rows, "lookup_share": 1.0, "split_ms_per_step": 0.1} if hot_rows else None
    return {
        "samples_per_s": 1000.0,
        "peak_anon_rss_mb": 200.0,
        "time_per_step_ms": {"forward": 1.0},
        "mode": mode,
        "eval_auc": 0.7,
        "eval_logloss": 0.5,
        "cache": {
            "cache_rows": cache_rows,
            "unique_rows": unique_rows,
            "hit_rate": 0.0 if unique_rows == 0 else 0.8,
            "planning_ms_per_step": 0.1,
            "hot": hot,
        },
    }


def test_accel_table_says_n_a_for_no_cold_lookups_and_dash_for_no_cache():
    b = AccelBench.quick(configs=("nocache", "fae", "lookahead", "lookahead+hot"))
    results = {
        "nocache": [_summary("nocache", 2048, 2000)],
        "fae": [_summary("fae", 2048, 0, hot_rows=266)],
        "lookahead": [_summary("lookahead", 266, 2000)],
        "lookahead+hot": [_summary("lookahead", 266, 0, hot_rows=266)],  # every lookup served hot
    }
    settings = {k: {"mode": v[0]["mode"]} for k, v in results.items()}
    payload = accel.summarise(b, results, settings, {}, 266)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in payload["table"].splitlines()[2:]}
    head = payload["table"].splitlines()[0].split(" | ")
    cache, hit = head.index("cache rows"), head.index("hit rate (cold)")
    assert [rows[k][cache] for k in results] == ["-", "-", "266", "266"]
    assert [rows[k][hit] for k in results] == ["-", "-", "80.0%", "n/a"]
    res = payload["results"]
    assert [res[k]["cache_rows"] for k in results] == [None, None, 266, 266]
    assert [res[k]["hit_rate"] for k in results] == [None, None, 0.8, None]


# -- sweep: a refusal leaves --out as it was ---------------------------------------------------------

SWEEP_TINY = (
    "bench sweep: nothing measurable at this size: the largest cache of --cache-percents (20% of 266 rows = 53) "
    "is smaller than the 217 unique rows a batch of 256 has, as is the auto-tuner's budget (2%); "
    "raise --scale or drop --profile tiny, or give --cache-percents of at least 82"
)


def test_a_refused_sweep_leaves_no_data_set_and_changes_nothing_of_the_users(run_cli, tmp_path):
    rc, _, err = run_cli("bench", "sweep", "--quick", "--profile", "tiny", "--out", tmp_path / "new" / "sweep")
    assert one_line_error(rc, err) == SWEEP_TINY
    assert list(tmp_path.iterdir()) == []  # neither the data set nor the folders above it
    # a data set of another size (an earlier sweep's) and the user's file: as they were
    mine = tmp_path / "mine"
    ensure_synth(mine / "data", "tiny", 500, 0.01, seed=1, progress=False)
    (mine / "notes.txt").write_text("keep me\n")
    mark_out(mine)  # an earlier bench's --out (its mark) with a note of the user's: a bench's own refusal
    before = snapshot(mine)
    rc, _, err = run_cli("bench", "sweep", "--quick", "--profile", "tiny", "--out", mine)
    assert one_line_error(rc, err) == SWEEP_TINY
    assert snapshot(mine) == before
    # a data set of the very size asked for is checked where it is, and kept
    ensure_synth(mine / "data", "tiny", data_samples(256, 24), 0.01, seed=1, progress=False)
    before = snapshot(mine)
    rc, _, err = run_cli("bench", "sweep", "--quick", "--profile", "tiny", "--out", mine)
    assert one_line_error(rc, err) == SWEEP_TINY
    assert snapshot(mine) == before


def test_a_checked_data_set_takes_its_place_only_when_accepted(tmp_path):
    b = SimpleNamespace(out_dir=tmp_path / "out", profile="tiny", scale=0.01, batch_size=64, steps=3)
    ensure_synth(b.out_dir / "data", "tiny", 500, 0.01, seed=1, progress=False)  # of another size
    (b.out_dir / "store-template").mkdir()  # a disk table of that data set
    seen = []

    def accept(data: Path, meta) -> int:
        seen.append(data)
        assert data != b.out_dir / "data" and has_synth(data, "tiny", data_samples(64, 3), 0.01, seed=1)
        return meta.total_rows

    out, data, meta, found = prepare_checked(b, accept, progress=False)
    assert (out, data, found) == (b.out_dir, b.out_dir / "data", 266) and meta.total_rows == 266
    assert has_synth(data, "tiny", data_samples(64, 3), 0.01, seed=1)
    assert sorted(p.name for p in b.out_dir.iterdir()) == ["data"]  # no staging folder, lock or stale table
    assert not seen[0].exists()
    # the same size again: checked in place
    assert prepare_checked(b, lambda d, m: d, progress=False)[3] == b.out_dir / "data"
