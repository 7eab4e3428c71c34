"""Never failing for want of disk: checked before training, survived during it.

On real full filesystems (a small tmpfs, ``small_disk``; skipped where none can be mounted):

* a run whose largest checkpoint cannot fit on the disk of its run folder refuses to
  start, in one line that says how much it needs and how much is free, and trains nothing;
  ``plan`` with the same ``--out`` refuses it in the same words;
* a run whose final checkpoint meets a full disk says so in one line, removes the
  checkpoint's partial files, keeps the previous checkpoint as the latest; its summary is
  written and its digest is ``--mode full``'s (the trained rows in the store were not
  lost), and its last line says the final checkpoint was lost, which step is the last
  intact one and how to retrain the rest (exit 1).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runs import last_checkpoint, trained

from bagpipe.config.train import TrainConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STEPS, BATCH, EVERY = 40, 64, 10
COMMON = [
    "--steps",
    STEPS,
    "--batch-size",
    BATCH,
    "--optimizer",
    "adagrad",
    "--lr",
    "0.05",
    "--threads",
    "1",
    "--no-progress",
]


def test_a_run_whose_checkpoints_cannot_fit_refuses_to_start_in_one_line(tiny_data, tmp_path, small_disk, run_cli):
    out = small_disk(tmp_path / "disk", "64k") / "run"
    rc, stdout, stderr = run_cli("train", "--data", tiny_data, "--out", out, *COMMON)
    lines = stderr.strip().splitlines()
    assert rc == 2 and len(lines) == 1, stderr
    assert re.match(
        rf"bagpipe train: error: {out}: this run's checkpoints need up to \d+ KiB \([\d,]+ rows trained at "
        rf"most x 44 bytes, and the dense state\) but {out} has \d+ KiB free; free some space, choose "
        r"another --out, or checkpoint less \(--checkpoint-every 0 --no-final-checkpoint\)$",
        lines[0],
    ), lines[0]
    assert not out.exists()  # nothing trained, nothing left behind
    # plan refuses it with train's words: the same disk, whose free space train measured in the
    # run folder it had made and plan (which makes nothing) in the nearest existing folder
    rc, _, plan_err = run_cli("plan", "--data", tiny_data, "--out", out, *COMMON)
    free = re.compile(r" but \S+ has \d+ KiB free;")
    assert rc == 2 and free.sub(" but D has N free;", plan_err.strip()) == free.sub(
        " but D has N free;", lines[0].replace("bagpipe train: error:", "bagpipe plan: error:", 1)
    )
    assert not out.exists()


def test_a_final_checkpoint_that_meets_a_full_disk_leaves_the_previous_one_and_loses_no_row(
    tiny_data, tmp_path, small_disk
):
    want = trained(
        TrainConfig.of(
            data=tiny_data,
            out=str(tmp_path / "full"),
            steps=STEPS,
            batch_size=BATCH,
            optimizer="adagrad",
            lr=0.05,
            threads=1,
            progress=False,
        )
    )["params_sha256"]
    out = tmp_path / "run"
    small_disk(out / "checkpoints", "2m")  # room for the estimate (~0.7 MB), filled before the final checkpoint
    flag = tmp_path / "paused"
    cmd = [
        sys.executable,
        "-m",
        "bagpipe.cli",
        "train",
        "--data",
        tiny_data,
        "--out",
        str(out),
        *map(str, COMMON),
        "--mode",
        "lookahead",
        "--store",
        "disk",
        "--cache-rows",
        "1000",
        "--lookahead",
        "4",
        "--checkpoint-every",
        str(EVERY),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, BAGPIPE_TEST_PAUSE=f"cut:{STEPS}:{flag}"),
    )
    try:
        deadline = time.monotonic() + 200
        while not flag.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        small_disk.fill(out / "checkpoints")  # the disk fills up during the last steps
        Path(str(flag) + ".go").touch()
        stdout, stderr = proc.communicate(timeout=200)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr[-3000:]  # trained, but the folder cannot continue from its last step
    said = [line for line in (stdout + stderr).splitlines() if "not written" in line]
    assert said[0] == (
        f"checkpoint of step {STEPS} not written: no space left on the disk of {out / 'checkpoints'} "
        f"(0 MiB free); its partial files are removed and step-{STEPS - EVERY:08d} stays the latest checkpoint"
    )
    assert re.fullmatch(
        rf"bagpipe train: error: the final checkpoint \(step {STEPS}\) was not written \(.*No space left on "
        rf"device.*\); the last intact checkpoint is step {STEPS - EVERY} in {out}/checkpoints: free some space, "
        rf"then train again with --resume \(it retrains steps {STEPS - EVERY + 1}..{STEPS}\)",
        said[1],
    ), said
    assert stderr.strip().splitlines()[-1] == said[1]  # the run's last word
    assert last_checkpoint(out).step == STEPS - EVERY and not list((out / "checkpoints").glob(".tmp-*"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checkpoints"]["failed"] == 1 and summary["checkpoints"]["last_step"] == STEPS - EVERY
    assert summary["params_sha256"] == want  # every trained row is in the store


def test_a_disk_store_that_cannot_fit_refuses_to_start_in_one_line(tiny_data, tmp_path, small_disk, run_cli):
    disk = small_disk(tmp_path / "disk", "256k")
    mine = disk / "mine.txt"
    mine.write_text("the user's\n")
    out, store = tmp_path / "run", disk / "st"
    rc, stdout, stderr = run_cli(
        "train", "--data", tiny_data, "--out", out, *COMMON, "--mode", "lookahead", "--store", "disk",
        "--store-dir", store,
    )  # fmt: skip
    lines = stderr.strip().splitlines()
    assert rc == 2 and len(lines) == 1, stderr
    assert re.fullmatch(
        rf"bagpipe train: error: --store-dir {store}: this run's disk store needs up to [\d.,]+ [KM]iB \([\d,]+ rows "
        rf"of 36 bytes, at most the pages of [\d,]+ row writes\) but {disk} has \d+ KiB free; free some space, give "
        r"another --store-dir, or train fewer --steps",
        lines[0],
    ), lines[0]
    # nothing made, nothing of the user's changed: no run folder, no store, no lock
    assert not out.exists() and sorted(p.name for p in disk.iterdir()) == ["mine.txt"]
    assert mine.read_text() == "the user's\n"
