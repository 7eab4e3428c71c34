"""Every benchmark scenario runs end to end at its ``--quick`` size.

``bagpipe bench modes|sweep|convergence|oracle|distributed|accel|approx --quick`` (driven in-process through
``bagpipe.cli.main``; the training runs are child processes) each write results.json,
results.md and their PNG into a fresh folder, with positive throughputs; the sweep
records its too-small cache points and compares the auto-tuner with the best point;
the convergence scenario finds full and lookahead identical; the oracle scenario also
plans behind a hot tier; the accel scenario runs FAE, Hotline and lookahead with and
without a hot tier under one budget (four of its seven configurations, to save time),
the hot ones serving most lookups from the hot tier; the approx scenario runs its stale-skipping
configuration on the generated data (the others and the Criteo sample left out, to save
time), marked approximate, with its threshold and eval curve. The modes scenario runs
with fewer steps than its --quick default to keep the module at ~2-3 minutes on two
busy cores (each scenario also has its own timeout).
"""

from __future__ import annotations

import json

import pytest

from bagpipe.cli import main

pytestmark = pytest.mark.integration

SCENARIOS = {
    "modes": ["--steps", "8", "--warmup", "2", "--batch-size", "256"],
    "sweep": ["--lookaheads", "10"],
    "convergence": [],
    "oracle": [],
    "distributed": ["--modes", "in-process,2x2-partitioned"],
    "accel": ["--configs", "fae,hotline,lookahead,lookahead+hot", "--steps", "4", "--warmup", "1"],
    # one configuration on the generated data, to save time (every run is a process; the
    # distributed pair costs ~20 s a run; test_approx.py and test_jobs.py run the rest)
    "approx": ["--configs", "skip-stale", "--no-criteo", "--steps", "20", "--warmup", "2", "--eval-every", "8"],
}
PNG = {
    "modes": "modes.png",
    "sweep": "sweep.png",
    "convergence": "convergence.png",
    "oracle": "oracle.png",
    "distributed": "distributed.png",
    "accel": "accel.png",
    "approx": "approx.png",
}


#: Run by ``make test-slow`` only, to keep ``make test`` under 10 minutes: the sweep's and the
#: convergence's runs are what test_autotune.py and test_exactness.py already check.
SLOW = {"sweep", "convergence"}


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "scenario", [pytest.param(s, marks=[pytest.mark.slow] if s in SLOW else []) for s in SCENARIOS]
)
def test_quick_scenario_writes_results(scenario, tmp_path, capsys):
    out = tmp_path / scenario
    rc = main(["bench", scenario, "--quick", "--out", str(out), *SCENARIOS[scenario]])
    printed = capsys.readouterr().out
    assert rc == 0, printed[-2000:]
    payload = json.loads((out / "results.json").read_text())
    assert payload["scenario"] == scenario
    md = (out / "results.md").read_text()
    assert md.startswith(f"# bagpipe bench {scenario}") and "|---|" in md
    png = out / PNG[scenario]
    assert png.stat().st_size > 1000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = payload.get("results", {})
    if scenario == "modes":
        assert set(res) == {"full/memory", "nocache/memory", "lru/memory", "lookahead/memory"}
        assert all(v["samples_per_s"] > 0 and v["peak_anon_rss_mb"] > 0 for v in res.values())
    elif scenario == "distributed":
        assert set(res) == {"in-process", "2x2-partitioned"}
        assert all(v["samples_per_s"] > 0 for v in res.values())
        part = res["2x2-partitioned"]
        assert 0 < part["sync_bytes_per_step"] < part["replicated_sync_bytes_per_step_counterfactual"]
    elif scenario == "oracle":
        assert res and all(v["lookups_per_s"] > 0 for v in res.values())
        assert all(
            v["reference"]["lookups_per_s"] > 0 and v["reference"]["identical_plans"] is True for v in res.values()
        )
        assert len(payload["load_average"]["start"]) == 3 and "load average" in md
        assert all(v["hot"]["ms_per_batch"] > 0 and 0.5 < v["hot"]["lookup_share"] < 1 for v in res.values())
    elif scenario == "accel":
        assert set(res) == {"fae", "hotline", "lookahead", "lookahead+hot"}
        assert all(v["samples_per_s"] > 0 and v["peak_anon_rss_mb"] > 0 for v in res.values())
        assert all(
            res[k]["hot_lookup_share"] > 0.5 and res[k]["hot_rows"] > 0 for k in ("fae", "hotline", "lookahead+hot")
        )
        assert res["lookahead+hot"]["cache_rows"] < res["lookahead"]["cache_rows"]  # the budget is shared
        assert payload["targets"]["lookahead_hot_vs_best_of_fae_hotline"] > 0
    elif scenario == "approx":
        res = payload["datasets"]["generated"]["results"]
        assert set(res) == {"skip-stale"} and payload["criteo_skipped"]
        r = res["skip-stale"]
        assert r["exact"] is False and r["threshold"] is not None and 0 <= r["skipped_share"] < 1
        assert r["samples_per_s"] > 0 and r["ratio"] is None  # no exact run to compare with
        assert len(r["curve"]) == 3 and 0 < r["eval_auc"] < 1
    elif scenario == "sweep":
        ran = {k: v for k, v in res.items() if "samples_per_s" in v}
        assert any(v["too_small"] for v in res.values()), "the quick grid's smallest cache is below one batch"
        assert "too small" in md
        assert len(ran) >= 2 and all(v["samples_per_s"] > 0 and 0 < v["hit_rate"] <= 1 for v in ran.values())
        auto = payload["autotune"]
        assert auto["samples_per_s"] > 0 and auto["ratio_to_best"] > 0 and auto["lookahead"] >= 1
    elif scenario == "convergence":
        assert payload["identical"] is True
        for d in payload["datasets"].values():
            full, la = d["modes"]["full"], d["modes"]["lookahead"]
            assert len(full["curve"]) >= 2 and full["curve"] == la["curve"]
            assert full["params_sha256"] == la["params_sha256"]
            assert all(0 < p["eval_auc"] < 1 and p["eval_logloss"] > 0 for p in full["curve"])
            assert la["samples_per_s"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_recovery_scenario(tmp_path, capsys):
    """The recovery scenario at its --quick size on one topology: checkpoint cost, every
    checkpoint's rows and bytes, and a killed server's recovery with its phases are
    measured and reported (the mechanics themselves are test_recovery.py's)."""
    out = tmp_path / "recovery"
    rc = main(["bench", "recovery", "--quick", "--out", str(out), "--topologies", "1x2", "--intervals", "30"])
    assert rc == 0, capsys.readouterr().out[-2000:]
    payload = json.loads((out / "results.json").read_text())
    assert set(payload["results"]) == {"1x2/0", "1x2/30"}
    res = payload["results"]["1x2/30"]
    assert res["checkpoints"] >= 2 and res["full_checkpoint_mib"] > 0
    assert all(h["bytes"] > 0 and h["rows"] > 0 for h in res["history"])
    (rec,) = payload["recovery"]["1x2"]
    assert rec["role"] == "server 1" and rec["kill_to_training_s"] > 0 and rec["from_checkpoint"] == 30
    assert rec["steps_replayed"] >= 5 and rec["phases_s"]["total"] > 0
    assert (out / "recovery.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
