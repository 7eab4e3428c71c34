"""``bagpipe bench scale`` runs its modes inside a cgroup memory limit, and they stay exact.

* At its ``--quick`` size (driven in-process through ``bagpipe.cli.main``; the training
  runs are child processes), every cached mode (nocache, lru, lookahead) runs on the
  disk store inside a memory group (4 steps in the CI suite, the --quick size under slow):
  each group's peak memory (page cache included) is within the limit with no OOM kill,
  and every mode's ``params_sha256`` equals ``full``'s, which also proves that restoring
  the table file between runs gives every run the same starting tables. Skipped, with
  the reason, where no memory cgroup can be made.
* Where none can be made, the scenario says so in one line and exits 0 (forced here by
  making the detection fail).
* (slow) ``bench mlperf --quick`` trains the scaled-down criteo-1tb profile with the
  dcn-mlperf recipe on a sparse disk store and reports its figures.
"""

from __future__ import annotations

import json

import pytest

from bagpipe.cli import main

pytestmark = pytest.mark.integration


def _run_scale(tmp_path, capsys, *extra) -> dict:
    from bagpipe.bench.memlimit import find_memory_controller

    controller, why = find_memory_controller()
    if controller is None:
        pytest.skip(why)
    out = tmp_path / "scale"
    rc = main(["bench", "scale", "--quick", "--out", str(out), "--no-probe", "--memory-limit-mb", "768", *extra])
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
        assert r["params_sha256"] == full, mode
        assert r["same_digest_as_full"] is True
        assert r["limit_mb"] == 768 and 0 < r["group_peak_mb"] <= 768, (mode, r["group_peak_mb"])
        assert r["oom_kills"] == 0 and r["samples_per_s"] > 0
    assert payload["targets"]["peak_within_limit"] is True


@pytest.mark.timeout(200)
def test_quick_scale_every_mode_4_steps_under_a_memory_limit(tmp_path, capsys):
    """The CI-sized check: every mode, 4 steps."""
    payload = _run_scale(tmp_path, capsys, "--configs", "full,nocache,lru,lookahead", "--steps", "4", "--warmup", "1")
    _check_limited_and_exact(payload, {"nocache", "lru", "lookahead"})


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_scale_every_mode_under_a_memory_limit(tmp_path, capsys):
    """The --quick size itself (~45-80 s on a busy 2-core machine): every mode."""
    payload = _run_scale(tmp_path, capsys, "--steps", "8", "--warmup", "2")
    _check_limited_and_exact(payload, {"nocache", "lru", "lookahead"})


def test_scale_skips_in_one_line_without_cgroups(tmp_path, capsys, monkeypatch):
    import bagpipe.bench.scale as scale

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
