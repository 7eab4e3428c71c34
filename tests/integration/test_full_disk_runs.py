"""A run's own records (metrics.jsonl, summary.json) on a disk that fills up, and
metrics.jsonl lines that a crash or a full disk left unreadable:

* ``train --resume`` drops a metrics.jsonl line that is not a record -- cut short, NUL
  bytes, valid JSON but not an object -- in one line naming ``metrics.jsonl:N``, keeps
  every readable record up to its checkpoint byte for byte, and ends with the digest of
  an uninterrupted run (it used to stop with a JSONDecodeError / AttributeError);
* on a real small tmpfs filled after the first checkpoint, the metrics records the disk
  cannot take are left out in one line and the run goes on to its last step; the file
  holds whole records only; the summary.json the disk cannot take then ends the run in
  one line naming it, the last intact checkpoint and --resume (it used to stop at the
  next metrics flush with "cannot write an output file"); once space is freed, --resume
  from that checkpoint ends with the uninterrupted digest (skipped without root);
* a summary.json that meets a full disk after an intact final checkpoint says so (and a
  --summary-json elsewhere still holds the figures), exit 2; nothing else changes;
* :class:`~bagpipe.train.rundir.MetricsLog` itself on a small tmpfs: a record the disk
  cuts short is truncated away, the records that fit again once space is freed are
  written, the loss is said once and counted at the end; any other write error names
  the file.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runs import last_checkpoint

pytestmark = pytest.mark.timeout(300)

STEPS, BATCH, EVERY = 40, 64, 20
COMMON = ["--batch-size", BATCH, "--checkpoint-every", EVERY, "--threads", 1, "--no-progress"]


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory) -> dict:
    """A finished 40-step run (checkpoints at 20 and 40) and the digest of an
    uninterrupted 60-step run, trained once for the module."""
    from bagpipe.cli import main

    root = tmp_path_factory.mktemp("runs")
    assert (
        main(["train", "--data", tiny_data, "--out", str(root / "base"), "--steps", str(STEPS), *map(str, COMMON)]) == 0
    )
    assert main(["train", "--data", tiny_data, "--out", str(root / "ref"), "--steps", "60", *map(str, COMMON)]) == 0
    return {"base": root / "base", "digest60": json.loads((root / "ref" / "summary.json").read_text())["params_sha256"]}


def damaged(lines: list[bytes], case: str) -> tuple[list[bytes], int, str]:
    """(metrics.jsonl's lines damaged as ``case`` says, the 1-based line that is not a
    record, why the warning says it is not)."""
    if case == "cut short":  # a crash or a full disk in the middle of the last record
        return [*lines[:-1], lines[-1][:-30]], len(lines), "cut short: a write that did not finish"
    if case == "NUL bytes":  # a block lost in a crash: the size was written, the data not
        return [*lines[:3], b"\0" * len(lines[3]), *lines[4:]], 4, "NUL bytes: a write lost in a crash"
    return [*lines[:2], b"[1, 2]", *lines[2:]], 3, "a JSON array, not an object"


@pytest.mark.integration
@pytest.mark.parametrize("case", ["cut short", "NUL bytes", "not an object"])
def test_resume_drops_an_unreadable_metrics_line_naming_it(case, runs, tiny_data, tmp_path, run_cli):
    out = tmp_path / "run"
    shutil.copytree(runs["base"], out)
    metrics = out / "metrics.jsonl"
    lines = metrics.read_bytes().splitlines()
    assert json.loads(lines[-1])["step"] == STEPS and "eval_auc" in json.loads(lines[-1])
    bad, n, why = damaged(lines, case)
    metrics.write_bytes(b"\n".join(bad) + (b"\n" if case != "cut short" else b""))
    readable = [line for i, line in enumerate(bad, 1) if i != n]

    rc, stdout, stderr = run_cli("train", "--data", tiny_data, "--out", out, "--steps", 60, "--resume", *COMMON)
    assert rc == 0, stdout + stderr
    said = [line for line in stdout.splitlines() if "metrics.jsonl" in line]
    assert said == [
        f"{metrics}:{n}: dropped an unreadable line ({why}); the readable records up to step {STEPS} are kept"
    ]
    after = metrics.read_bytes().splitlines()
    assert after[: len(readable)] == readable  # every readable record, byte for byte, in its place
    records = [json.loads(line) for line in after]  # every line a record
    assert [r["step"] for r in records[len(readable) :]] == [41, 50, 60, 60]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 60 and summary["params_sha256"] == runs["digest60"]
    assert not list(out.glob(".metrics.jsonl.tmp-*"))


def train_until_paused(tiny_data, out: Path, steps: int, pause: str, flag: Path) -> subprocess.Popen:
    """``bagpipe train`` in a child that waits at ``pause`` (POINT:STEP) until FLAG.go exists."""
    cmd = [sys.executable, "-m", "bagpipe.cli", "train", "--data", tiny_data, "--out", str(out)]
    cmd += ["--steps", str(steps), *map(str, COMMON)]
    env = dict(os.environ, BAGPIPE_TEST_PAUSE=f"{pause}:{flag}")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.integration
def test_a_disk_that_fills_up_leaves_out_metrics_records_and_the_summary_names_the_last_checkpoint(
    runs, tiny_data, tmp_path, small_disk, run_cli
):
    steps = 400  # a page of metrics.jsonl (4 KiB on tmpfs) takes about 30 records: it fills long before the end
    disk = small_disk(tmp_path / "disk", "2m")
    mine = disk / "mine.txt"
    mine.write_text("the user's\n")
    out, flag = disk / "run", tmp_path / "paused"
    proc = train_until_paused(tiny_data, out, steps, f"cut:{2 * EVERY}", flag)  # step-20 is committed by then
    try:
        deadline = time.monotonic() + 200
        while not flag.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        small_disk.fill(disk)  # another program fills the disk
        Path(f"{flag}.go").touch()
        stdout, stderr = proc.communicate(timeout=250)
    finally:
        if proc.poll() is None:
            proc.kill()
    metrics = out / "metrics.jsonl"
    assert proc.returncode == 2, stdout[-3000:] + stderr[-3000:]
    assert stderr.strip().splitlines() == [
        f"bagpipe train: error: cannot write {out}/summary.json (No space left on device), so this run's figures "
        f"are not saved, and its final checkpoint (step {steps}) was not written either; the last intact "
        f"checkpoint is step {EVERY} in {out}/checkpoints: free some space, then train again with --resume (it "
        f"retrains steps {EVERY + 1}..{steps})"
    ]
    said = [line for line in stdout.splitlines() if "metrics.jsonl" in line]
    first = re.fullmatch(
        rf"{metrics}: the record of step (\d+) was not written \(No space left on device\); the run goes on, "
        r"leaving out each record the disk cannot take \(--resume needs the checkpoints, not the metrics\)",
        said[0],
    )
    assert first and len(said) == 2, said
    lost = int(first[1])
    assert re.fullmatch(
        rf"{metrics}: \d+ records \(steps {lost}..{steps}\) were not written for lack of space", said[1]
    )
    # the file holds whole records only, every one before the first left out
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert metrics.read_bytes().endswith(b"\n") and records[-1]["step"] < lost
    # the run went on to its last step (the summary's line names it, above); the checkpoints
    # not written at each cut after the disk filled are said once, not one line each
    assert stdout.count("not written: no space left on the disk of") == 1
    # what survives: the checkpoint of step 20, the user's file; nothing half-written
    assert last_checkpoint(out).step == EVERY and not (out / "summary.json").exists()
    assert mine.read_text() == "the user's\n"
    assert not [p.name for p in out.rglob(".*tmp*")]

    (disk / "filler").unlink()  # space freed: the line's advice
    rc, stdout, stderr = run_cli("train", "--data", tiny_data, "--out", out, "--steps", steps, "--resume", *COMMON)
    assert rc == 0, stdout + stderr
    assert "metrics.jsonl" not in stdout  # every line it kept was a record
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == steps and summary["checkpoints"]["last_step"] == steps


def fail_summary_json(monkeypatch) -> None:
    """RUN/summary.json meets a full disk; every other file is written."""
    import bagpipe.train.rundir as rundir

    write = rundir.atomic_write_text

    def full(path, text):
        if Path(path).name == "summary.json" and Path(path).parent.name == "run":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        write(path, text)

    monkeypatch.setattr(rundir, "atomic_write_text", full)


@pytest.mark.integration
@pytest.mark.parametrize("copy", [False, True], ids=["alone", "with --summary-json"])
def test_a_summary_that_meets_a_full_disk_after_the_final_checkpoint_says_nothing_trained_is_lost(
    copy, tiny_data, tmp_path, monkeypatch, run_cli
):
    out, elsewhere = tmp_path / "run", tmp_path / "figures.json"
    fail_summary_json(monkeypatch)
    extra = ["--summary-json", elsewhere] if copy else []
    rc, stdout, stderr = run_cli("train", "--data", tiny_data, "--out", out, "--steps", STEPS, *COMMON, *extra)
    assert rc == 2, stdout + stderr
    where = f"only in {elsewhere}" if copy else "not saved"
    assert stderr.strip().splitlines() == [
        f"bagpipe train: error: cannot write {out}/summary.json (No space left on device), so this run's figures "
        f"are {where}; nothing trained is lost: its final checkpoint (step {STEPS}) is intact in {out}/checkpoints "
        f"(free some space, then `bagpipe eval --run {out} --data {tiny_data}` evaluates it and `bagpipe train --resume` with a larger "
        "--steps continues it)"
    ]
    assert last_checkpoint(out).step == STEPS and not (out / "summary.json").exists()
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()][-1] == STEPS
    assert not list(out.glob(".summary.json.tmp-*"))
    if copy:
        assert json.loads(elsewhere.read_text())["steps"] == STEPS
    else:
        assert not elsewhere.exists()


@pytest.mark.unit
def test_metrics_log_writes_whole_records_only_and_goes_on_past_a_full_disk(tmp_path, small_disk, caplog):
    from bagpipe.train.rundir import MetricsLog

    disk = small_disk(tmp_path / "disk", "64k")
    log = MetricsLog(disk / "metrics.jsonl")
    log.write(step=1, loss=0.5)
    small_disk.fill(disk)
    caplog.set_level(logging.INFO, logger="bagpipe")
    pad = "x" * 300  # a page (4 KiB) holds a dozen: the page of the first record fills up, then nothing fits
    for step in range(10, 400, 10):
        log.write(step=step, pad=pad)
    (disk / "filler").unlink()  # space again
    log.write(step=400, loss=0.25)
    log.close()
    records = [json.loads(line) for line in (disk / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records]
    lost = [s for s in range(10, 400, 10) if s not in steps]
    assert steps[0] == 1 and steps[-1] == 400 and lost == list(range(lost[0], 400, 10)), steps
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"{disk}/metrics.jsonl: the record of step {lost[0]} was not written (No space left on device); the run "
        "goes on, leaving out each record the disk cannot take (--resume needs the checkpoints, not the metrics)",
        f"{disk}/metrics.jsonl: {len(lost)} records (steps {lost[0]}..{lost[-1]}) were not written for lack of space",
    ]


@pytest.mark.unit
def test_metrics_log_names_the_file_in_any_other_write_error(tmp_path, monkeypatch):
    import bagpipe.train.rundir as rundir

    log = rundir.MetricsLog(tmp_path / "metrics.jsonl")
    log.write(step=1, loss=0.5)

    def broken(fd, data):
        raise OSError(errno.EIO, os.strerror(errno.EIO))  # as os.write() raises it: no file named

    monkeypatch.setattr(log, "_append", broken)
    with pytest.raises(OSError) as e:
        log.write(step=10, loss=0.4)
    log.close()
    assert e.value.errno == errno.EIO and e.value.filename == str(tmp_path / "metrics.jsonl")
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 0.5}\n'
