"""``bagpipe bench scale`` runs its modes inside a cgroup memory limit, and they stay exact,
within the memory they are given and flat over time.

* The CI-sized check (driven in-process through ``bagpipe.cli.main``; the training runs
  are child processes): every cached mode (nocache, lru, lookahead) trains 200 steps on
  the disk store inside a memory group of 320 MiB, page cache included, with a 0.60 GiB
  table file (1.9x the limit; the runs take their budget from the group): no OOM kill,
  every group within its limit and at it (its page cache was reclaimed), every mode's
  ``params_sha256`` equal to unlimited ``full``'s (which also proves that restoring the
  table file between runs gives every run the same tables), the trainer's anonymous
  memory at step 200 within 5% of step 100, the store's dirty pages within twice the
  bound its budget set (and 64 MiB), and the estimate the run was sized by within 25% of
  its measured peak anonymous memory. Skipped, with the reason, where no memory cgroup can
  be made (29 s at load 1.3, 41 s at load 3.9 on this 2-core machine).
* Where none can be made, the scenario says so in one line and exits 0 (forced here by
  making the detection fail).
* (slow) a second invocation on the same table file with other batches restores every row
  the first one's runs wrote (its digest still equals ``full``'s);
* (slow) the ``--quick`` size; ``bench mlperf --quick`` trains the scaled-down
  criteo-1tb profile with the dcn-mlperf recipe on a sparse disk store and reports its
  figures.
"""

from __future__ import annotations

import json

import pytest

from bagpipe.cli import main

pytestmark = pytest.mark.integration


LIMIT_MB = 320
#: The CI size: Criteo-Kaggle at 10% cardinality (3.38M rows), D = 16 with Adam's 2D state
#: values a row (192 B: a 0.60 GiB table file whose state starts as zeros, cheap to write),
#: debug MLPs, batch 64, a 1% cache (lru evicts), 200 steps.
CI = ["--configs", "full,nocache,lru,lookahead", "--steps", "200", "--warmup", "10", "--scale", "0.1",
      "--embedding-dim", "16", "--optimizer", "adam", "--batch-size", "64", "--lookahead", "8",
      "--cache-fraction", "0.01", "--eval-samples", "512", "--sample-s", "0.25"]  # fmt: skip


def _run_scale(tmp_path, capsys, *extra) -> dict:
    from bagpipe.testbed.memlimit import find_memory_controller

    controller, why = find_memory_controller()
    if controller is None:
        pytest.skip(why)
    out = tmp_path / "scale"
    rc = main(["bench", "scale", "--quick", "--out", str(out), "--memory-limit-mb", str(LIMIT_MB), *extra])
    printed = capsys.readouterr().out
    assert rc == 0, printed[-2000:]
    assert (out / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "params_sha256" in (out / "results.md").read_text()
    return json.loads((out / "results.json").read_text())


def _check_limited_and_exact(payload: dict, modes: set[str]) -> None:
    res = payload["results"]
    assert set(res) == {"full"} | modes
    full = res["full"]["params_sha256"]
    assert len(full) == 1 and full[0]
    for mode in modes:
        r = res[mode]
        assert r["status"] == "ok", (mode, r["failures"])
        assert r["params_sha256"] == full, mode
        assert r["same_digest_as_full"] is True
        assert r["limit_mb"] == LIMIT_MB and 0 < r["group_peak_mb"] <= LIMIT_MB, (mode, r["group_peak_mb"])
        assert r["oom_kills"] == 0 and r["samples_per_s"] > 0
    assert payload["targets"]["oom_kills"] == 0


@pytest.mark.timeout(300)
def test_every_cached_mode_200_steps_within_a_memory_limit_below_its_table_file(tmp_path, capsys):
    """The CI-sized check (see the module docstring)."""
    payload = _run_scale(tmp_path, capsys, *CI)
    assert payload["table_to_limit"] > 1.8  # the table file does not fit the limit
    modes = {"nocache", "lru", "lookahead"}
    _check_limited_and_exact(payload, modes)
    for mode in modes:
        r = payload["results"][mode]
        assert r["group_peak_mb"] > LIMIT_MB - 16  # the group reached its limit: its page cache was reclaimed
        ((early, last),) = r["anon_mb"]
        assert r["anon_step"] == [100, 200] and abs(last - early) <= 0.05 * early, (mode, early, last)
        dirty_bound = r["budget"][0]["dirty_mb"]
        assert dirty_bound and r["max_dirty_mb"] <= min(64, 2 * dirty_bound), (mode, r["max_dirty_mb"], dirty_bound)
        peak = r["peak_anon_rss_mb"]
        assert abs(r["estimate_anon_mb"] - peak) <= 0.25 * peak, (mode, r["estimate_anon_mb"], peak)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_scale_every_mode_under_a_memory_limit(tmp_path, capsys):
    """The --quick size itself: every mode."""
    payload = _run_scale(tmp_path, capsys, "--steps", "8", "--warmup", "2", "--memory-limit-mb", "768")
    res = payload["results"]
    assert all(res[m]["status"] == "ok" and res[m]["same_digest_as_full"] for m in ("nocache", "lru", "lookahead"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_second_invocation_on_the_same_table_file_stays_exact(tmp_path, capsys):
    """Runs of the first invocation wrote rows of its batches; the second one's batches are
    others (another batch size): it must restore the first one's rows too."""
    common = ["--configs", "full,lookahead", "--memory-limit-mb", str(LIMIT_MB), "--eval-samples", "256"]
    _run_scale(tmp_path, capsys, *common, "--batch-size", "256", "--steps", "8", "--warmup", "2")
    payload = _run_scale(tmp_path, capsys, *common, "--batch-size", "64", "--steps", "4", "--warmup", "1")
    assert payload["results"]["lookahead"]["same_digest_as_full"] is True


def test_scale_skips_in_one_line_without_cgroups(tmp_path, capsys, monkeypatch):
    import bagpipe.bench.scenarios.scale.scenario as scale

    monkeypatch.setattr(scale, "find_memory_controller", lambda: (None, "no cgroup memory controller mounted"))
    rc = main(["bench", "scale", "--quick", "--out", str(tmp_path / "s")])
    printed = capsys.readouterr().out
    assert rc == 0
    assert "bench scale: skipped: no memory cgroup can be used here (no cgroup memory controller mounted)" in printed
    assert json.loads((tmp_path / "s" / "results.json").read_text())["skipped"].startswith("bench scale: skipped")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_mlperf_run(tmp_path, capsys):
    """``bench mlperf --quick``: the criteo-1tb profile (scaled down) and the dcn-mlperf
    recipe train on a fresh sparse disk store; the oracle's state and the disk are reported."""
    out = tmp_path / "mlperf"
    rc = main(["bench", "mlperf", "--quick", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed[-2000:]
    res = json.loads((out / "results.json").read_text())["results"]["lookahead"]
    assert res["samples_per_s"] > 0 and res["peak_rss_mb"] > 0 and res["planner_state_mb"] > 0
    assert 0 < res["disk_used_gib"] < res["disk_apparent_gib"]  # sparse: only written rows take blocks
    assert not (out / "store").exists()  # deleted unless --keep-store
