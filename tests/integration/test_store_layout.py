"""A disk store's frequency row layout (``--store-layout frequency``, issue 30): the rows
a run uses lie in fewer pages, and nothing else changes.

* The same run (lookahead, disk store) in both layouts ends with the same digest and the
  same hit, miss, fetch and write-back counts, and the rows it wrote take fewer of the
  table file's pages (its allocated blocks: a count, not a timing); the summary says why
  each store has its layout (the default, ``auto``, keeps a quarter-epoch run's identity).
* ``bench modes --stores disk-identity,disk`` runs the same modes on both layouts side by
  side with identical counts, ``disk`` in the layout train's default picks for its runs.
* A run on the frequency layout killed with SIGKILL after a checkpoint -- its row log
  holding rows written back since the store's last flush -- resumes to ``--mode full``'s
  digest.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

RUN = (
    "--mode",
    "lookahead",
    "--store",
    "disk",
    "--steps",
    40,
    "--batch-size",
    128,
    "--no-progress",
    "--cache-rows",
    2000,
)


def test_the_frequency_layout_trains_the_same_model_in_fewer_pages(run_cli, tiny_data, tmp_path):
    got = {}
    for layout in ("identity", "frequency"):
        out = tmp_path / layout
        # identity: the default's choice for 40 steps, a quarter of tiny's epoch (--store-layout auto)
        given = ("--store-layout", layout) if layout == "frequency" else ()
        rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, *RUN, *given)
        assert rc == 0, err
        s = json.loads((out / "summary.json").read_text())
        blocks = (out / "store" / "rows.f32").stat().st_blocks * 512
        got[layout] = (s, blocks)
    (a, blocks_a), (b, blocks_b) = got["identity"], got["frequency"]
    assert a["params_sha256"] == b["params_sha256"]
    counts = ("hits", "misses", "rows_fetched", "rows_written_back", "forced_evictions")
    assert {k: a["cache"][k] for k in counts} == {k: b["cache"][k] for k in counts}
    store_a, store_b = a["cache"]["store"], b["cache"]["store"]
    assert (store_a["layout"], store_a["packed_rows"]) == ("identity", 0)
    assert store_a["layout_choice"].startswith("--store-layout auto: the run trains 0.24 of an epoch")
    assert store_b["layout"] == "frequency" and store_b["packed_rows"] > 0
    assert store_b["layout_choice"] == "--store-layout frequency"
    assert store_a["rows_written"] == store_b["rows_written"] > 0
    # the same rows written: packed together they take fewer 4 KiB pages of the file
    assert blocks_b < blocks_a, (blocks_a, blocks_b)
    header = json.loads((tmp_path / "frequency" / "store" / "header.json").read_text())
    assert header["version"] == 3 and header["layout"]["packed_rows"] == store_b["packed_rows"]


def test_bench_modes_runs_both_layouts_side_by_side(run_cli, tmp_path):
    """``disk`` is in the layout train's default picks for the bench's runs (the frequency
    layout: --quick's 8 steps cover its generated split); ``disk-identity`` names its own."""
    out = tmp_path / "bench"
    argv = ("bench", "modes", "--quick", "--profile", "tiny", "--modes", "full,lookahead")
    rc, stdout, err = run_cli(*argv, "--stores", "disk-identity,disk", "--out", out)
    assert rc == 0, err
    payload = json.loads((out / "results.json").read_text())
    res = payload["results"]
    assert set(res) == {"full/memory", "lookahead/disk", "lookahead/disk-identity"}
    counts = ("hits", "misses", "rows_fetched", "rows_written_back")
    plain, packed = res["lookahead/disk-identity"]["cache"], res["lookahead/disk"]["cache"]
    assert {k: plain[k] for k in counts} == {k: packed[k] for k in counts}
    assert plain["store"]["layout"] == "identity" and packed["store"]["layout"] == "frequency"
    assert payload["store_layouts"] == {"disk": "frequency", "disk-identity": "identity"}
    assert "Row layouts of the disk stores' table files: disk frequency, disk-identity identity." in stdout
    template = json.loads((out / "store-template-frequency" / "header.json").read_text())
    assert template["layout"]["packed_rows"] == res["lookahead/disk"]["cache"]["store"]["packed_rows"]


def test_a_run_killed_with_its_row_log_in_use_resumes_to_the_reference(run_cli, tiny_data, tmp_path):
    args = ["--data", tiny_data, "--steps", 120, "--batch-size", 128, "--no-progress", "--checkpoint-every", 20]
    rc, _, err = run_cli("train", *args, "--out", tmp_path / "full", "--mode", "full")
    assert rc == 0, err
    want = json.loads((tmp_path / "full" / "summary.json").read_text())["params_sha256"]
    out = tmp_path / "killed"
    cached = [*args, "--out", out, *RUN[:4], "--cache-rows", 2000, "--store-layout", "frequency"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "bagpipe.cli", "train", *map(str, cached)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latest = out / "checkpoints" / "LATEST"
    try:
        deadline = time.monotonic() + 120
        while not (latest.exists() and int(latest.read_text().strip().split("-")[-1]) >= 40):
            assert proc.poll() is None, "the run ended before it was killed"
            assert time.monotonic() < deadline, "no checkpoint at step 40 in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    header = json.loads((out / "store" / "header.json").read_text())
    assert header["layout"]["log_slots"] > 0  # the store the run made has a row log
    rc, _, err = run_cli("train", *cached, "--resume")
    assert rc == 0, err
    got = json.loads((out / "summary.json").read_text())
    assert got["cache"]["store"]["logged_rows"] > 0  # packed rows were in the log at the end
    assert got["params_sha256"] == want


def test_auto_gives_the_count_up_rather_than_shrink_the_read_ahead(run_cli, tmp_path):
    """In a budget that holds the frequency layout's count only with 1 plan read ahead
    instead of 9, auto keeps the identity layout and the read-ahead (newcomer review)."""
    data = tmp_path / "d"
    rc, _, err = run_cli("synth", "--profile", "tiny", "--samples", 8000, "--out", data, "--no-progress")
    assert rc == 0, err
    job = ("plan", "--data", data, "--mode", "lookahead", "--store", "disk", "--batch-size", 128, "--steps", 40)
    rc, out, err = run_cli(*job, "--memory-budget-mb", 300, "--store-layout", "frequency")
    assert rc == 0 and "1 plan read ahead instead of 9" in out + err, out + err
    rc, out, err = run_cli(*job, "--memory-budget-mb", 300)
    [line] = [ln for ln in out.splitlines() if ln.startswith("layout: ")]
    assert line.startswith("layout: identity (--store-layout auto: the memory budget would hold the frequency")
    assert "9 plans read ahead" in out and "instead of 9" not in out + err, out + err
