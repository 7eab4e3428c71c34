"""``train``'s store folder and its end, said in one line with nothing of the user's changed.

* ``--store-dir`` at the run's own ``--out`` (or inside its checkpoints) is refused as
  that, not as "in use by another run" naming the command itself; at another run's
  folder, or inside its checkpoints or logs, it is refused as the data set and export
  folders are -- before anything is written (no lock, no store files there). A store in
  another run's RUN/store stays allowed.
* SIGTERM during training unwinds the run (exit 143) with one line naming the latest
  checkpoint and how to continue; ``--resume`` then ends with the digest of a run never
  stopped.
* ``--threads`` above the CPUs this process may use is said in one line (and runs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

COMMON = ["--steps", "20", "--batch-size", "64", "--threads", "1", "--no-progress"]
STORE = ["--mode", "lookahead", "--store", "disk"]


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_store_dir_at_the_runs_own_folder_says_so(tiny_data, tmp_path, run_cli):
    out = tmp_path / "run"
    for given, said in (
        (out, f"--store-dir {out} is this run's --out: the store's files would be written among the run's "
              f"(config.json, checkpoints/); leave --store-dir out (the run keeps its store in {out / 'store'}) "
              "or choose a folder of its own"),
        (out / "checkpoints", f"--store-dir {out / 'checkpoints'} lies inside this run's {out / 'checkpoints'}, "
              f"which holds only the run's own files; leave --store-dir out (the run keeps its store in "
              f"{out / 'store'}) or choose a folder outside it"),
    ):  # fmt: skip
        rc, _, stderr = run_cli("train", "--data", tiny_data, "--out", out, *COMMON, *STORE, "--store-dir", given)
        assert (rc, stderr) == (2, f"bagpipe train: error: {said}\n")
        assert "in use" not in stderr and not out.exists()


def test_a_store_dir_at_another_run_is_refused_and_that_run_is_untouched(tiny_data, tmp_path, run_cli):
    other = tmp_path / "other"
    assert run_cli("train", "--data", tiny_data, "--out", other, *COMMON)[0] == 0
    before = listing(other)
    out = tmp_path / "run"
    for given, said in (
        (other, f"--store-dir {other} is the run folder {other} (config.json, checkpoints/): the store's files "
                "and lock would be written among that run's; choose a folder of its own"),
        (other / "checkpoints", f"--store-dir {other / 'checkpoints'} lies inside {other / 'checkpoints'}, which "
                f"holds only the run {other}'s own files; choose a folder of its own"),
        (other / "checkpoints" / "st", f"--store-dir {other / 'checkpoints' / 'st'} lies inside "
                f"{other / 'checkpoints'}, which holds only the run {other}'s own files; choose a folder of its own"),
    ):  # fmt: skip
        rc, _, stderr = run_cli("train", "--data", tiny_data, "--out", out, *COMMON, *STORE, "--store-dir", given)
        assert (rc, stderr) == (2, f"bagpipe train: error: {said}\n")
        assert listing(other) == before and not out.exists()
    # another run's own store folder may still be given (its run is untouched otherwise)
    rc, _, stderr = run_cli("train", "--data", tiny_data, "--out", out, *COMMON, *STORE, "--store-dir", other / "st2")
    assert rc == 0, stderr


def _train(args: list, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bagpipe.cli", "train", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_sigterm_says_where_to_continue_and_resume_is_exact(tiny_data, tmp_path, run_cli):
    out = tmp_path / "run"
    args = ["--data", tiny_data, "--out", out, "--batch-size", "64", "--threads", "1", "--no-progress", *STORE]
    proc = _train([*args, "--steps", "100000", "--checkpoint-every", "10"])
    try:
        deadline = time.monotonic() + 200
        while not (out / "checkpoints" / "LATEST").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    step = int((out / "checkpoints" / "LATEST").read_text().strip().split("-")[1])
    assert stderr.strip().splitlines()[-1] == (
        f"bagpipe train: stopped by SIGTERM; its latest checkpoint is step {step} in {out}/checkpoints: run the "
        "same command with --resume to continue from it"
    )
    assert "Traceback" not in stderr and not list((out / "checkpoints").glob(".tmp-*"))
    steps = step + 10
    rc, _, err = run_cli("train", *args, "--steps", steps, "--checkpoint-every", "10", "--resume")
    assert rc == 0, err
    ref = tmp_path / "ref"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", ref, "--batch-size", "64", "--threads", "1",
                         "--no-progress", "--steps", steps)  # fmt: skip
    assert rc == 0, err
    digest = [json.loads((d / "summary.json").read_text())["params_sha256"] for d in (out, ref)]
    assert digest[0] == digest[1]


def test_more_threads_than_cpus_is_said(tiny_data, tmp_path, run_cli, caplog):
    import torch

    cpus = len(os.sched_getaffinity(0))
    before = torch.get_num_threads()
    try:
        rc, _, stderr = run_cli("train", "--data", tiny_data, "--out", tmp_path / "run", *COMMON[:4], "--threads",
                                cpus + 1, "--no-progress")  # fmt: skip
    finally:
        torch.set_num_threads(before)
    assert rc == 0, stderr
    said = [r.getMessage() for r in caplog.records if "--threads" in r.getMessage()]
    assert said == [
        f"--threads {cpus + 1} is more than the {cpus} CPUs this process may run on: torch's threads will wait "
        f"for the cores (slower, not wrong); give --threads {cpus} or fewer"
    ]
