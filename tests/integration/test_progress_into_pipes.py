"""Progress written into a pipe or a log file: plain lines, never a redrawn bar.

tqdm redraws its bar with carriage returns; on a terminal that is a bar, in a log file a
wall of fragments. ``train`` shows a line every few seconds instead (and at the first and
last step), ``check`` nothing; ``--no-progress`` still shows no progress at all.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def bagpipe(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bagpipe.cli", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def test_train_into_a_pipe_writes_step_lines_and_no_bar(tiny_data, tmp_path):
    p = bagpipe("train", "--data", tiny_data, "--steps", 12, "--batch-size", 64, "--out", tmp_path / "r")
    assert p.returncode == 0, p.stderr
    both = p.stdout + p.stderr
    assert "\r" not in both and "it/s" not in both and "step/s" not in both
    lines = [ln for ln in both.splitlines() if ln.startswith("step ") and "/12" in ln and "samples/s" in ln]
    assert lines and "step 12/12" in lines[-1]
    quiet = bagpipe(
        "train", "--data", tiny_data, "--steps", 12, "--batch-size", 64, "--out", tmp_path / "q", "--no-progress"
    )
    assert quiet.returncode == 0 and "step 12/12" not in quiet.stdout + quiet.stderr


def test_check_into_a_pipe_draws_no_bar(tiny_data):
    p = bagpipe("check", tiny_data)
    assert p.returncode == 0, p.stderr
    assert "\r" not in p.stderr + p.stdout and "checking shards" not in p.stderr


def test_summary_json_to_dev_stdout_redirected_into_a_file(tiny_data, tmp_path):
    """`--summary-json /dev/stdout > file` was refused as "the file exists and is not this
    run's summary" (the shell's empty file), and a resumed run replaced /dev/stdout itself
    with a regular file (newcomer round 8); then the file held the run's own lines around
    the JSON (round 9)."""
    import os

    with open(tmp_path / "s.txt", "w") as f:  # the shell's `> s.txt`
        p = subprocess.run(
            [sys.executable, "-m", "bagpipe.cli", "train", "--data", str(tiny_data), "--steps", "4", "--batch-size",
             "64", "--out", str(tmp_path / "r"), "--no-progress", "--summary-json", "/dev/stdout"],  # fmt: skip
            stdout=f, stderr=subprocess.PIPE, text=True, timeout=120,
        )  # fmt: skip
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "s.txt").read_text())  # the JSON alone: the run's own lines went to stderr
    assert summary["steps"] == 4 and "run directory:" in p.stderr
    assert os.path.islink("/dev/stdout") or not os.path.isfile("/dev/stdout")
