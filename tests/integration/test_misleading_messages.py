"""Messages a newcomer round found misleading (issue 32), each now saying what is wrong and
what to do, in one line (exit 2, no traceback), with nothing of the user's changed.

* ``preprocess`` of a one-line input with a fractional --split blamed the vocabulary: a
  line not in the format is named (FILE:LINE and the fields expected), a valid one is
  said to be too few lines to split;
* ``synth`` / ``preprocess --out`` inside an existing data set (its split folder, or
  beside its splits) wrote a second data set among the first one's files: refused,
  naming the data set;
* ``bagpipe serve`` whose rendezvous store closed the connection (rank 0 stopped) said
  "did not all arrive ... within 300 s" after about a second: it says the rendezvous
  failed, after how long and why; a WORLD_SIZE other than --trainers + --servers + 1,
  which it ignored, is refused before the rendezvous;
* ``export --out`` at a data set (or a run) blamed ``--data``, which the user had not
  given (it came from the run's config.json): ``--out`` is named, as the data set it is;
* a failed export (synth, preprocess alike) left the empty folders it had made above
  ``--out``: they are removed, and only they;
* ``plot --out -`` wrote a file named ``-``: it is now standard output, the PNG alone
  (``integration/test_output_conventions.py``); here: never a file named ``-``;
* ``--config DIR`` said "config file not found" of a folder that is there: it is said to
  be a folder where a TOML file is expected;
* ``--hot-rows c.png`` spoke of pickled data (NumPy's guess at a file that is no .npz
  archive): the file is said not to be a hot-row file, and what ``bagpipe profile`` writes;
* ``train --resume`` on a folder without a checkpoint said only that: it now says to drop
  --resume (or to give --out the run that holds the checkpoint), and a run whose LATEST
  is gone is offered its newest complete checkpoint (--resume-from).

(The roles' settings comparison showing ``--cache-rows auto`` is tested in
``unit/config/test_agreement.py``.)
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest


def snapshot(folder: str | Path) -> dict[str, str]:
    """Every file under ``folder`` and the sha256 of its bytes (a run's .lock, which records
    its last holder, left out)."""
    folder = Path(folder)
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def one_line_error(rc: int, err: str, command: str) -> str:
    """The one ``bagpipe COMMAND: error:`` line of a refusal (exit 2, no traceback), less its prefix."""
    assert rc == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"bagpipe {command}: error: ")]
    assert len(lines) == 1, err
    return lines[0].split(": error: ", 1)[1]


def criteo_line() -> str:
    return "\t".join(["1"] + ["3"] * 13 + ["68fd1e64"] * 26) + "\n"


# -- 1. preprocess of one line --------------------------------------------------------------


@pytest.mark.integration
def test_preprocess_of_one_line_says_what_is_wrong_with_the_input(run_cli, tmp_path):
    garbage, one = tmp_path / "g.txt", tmp_path / "one.tsv"
    garbage.write_text("hello garbage\n")
    one.write_text(criteo_line())
    out = tmp_path / "data"
    before = snapshot(tmp_path)
    rc, _, err = run_cli("preprocess", "criteo", "--input", garbage, "--out", out, "--no-progress")
    assert one_line_error(rc, err, "preprocess") == f"{garbage}:1: expected 40 tab-separated fields, got 1"
    rc, _, err = run_cli("preprocess", "criteo", "--input", one, "--out", out, "--no-progress")
    assert one_line_error(rc, err, "preprocess") == (
        f"--input {one}: 1 data line, too few to split: --split 0.9 sends none of them to train, where the "
        "vocabulary comes from; give more lines, --split 1, --vocab-from DIR or --max-rows-per-table N"
    )
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["g.txt", "one.tsv"]


# -- 2. a data set inside another ------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("where", ["train/inner", "sub"])
def test_a_data_set_inside_another_is_refused_naming_it(run_cli, tiny_data, tmp_path, where):
    inner = Path(tiny_data) / where
    raw = tmp_path / "day.tsv"
    raw.write_text(criteo_line() * 20)
    before = snapshot(tiny_data)
    for command in (
        ("synth", "--profile", "tiny", "--samples", 500, "--out", inner, "--no-progress"),
        ("preprocess", "criteo", "--input", raw, "--out", inner, "--max-rows-per-table", 50, "--no-progress"),
    ):
        rc, _, err = run_cli(*command)
        assert one_line_error(rc, err, command[0]) == (
            f"--out {inner} lies inside the data set {os.path.realpath(tiny_data)}: a dataset is not written inside it; "
            "choose a --out outside it"
        )
    assert snapshot(tiny_data) == before and not inner.exists()
    assert sorted(p.name for p in Path(tiny_data).iterdir()) == [".bagpipe-files.json", "eval", "meta.json", "train"]


# -- 4. export --out at a data set ---------------------------------------------------------------


@pytest.fixture(scope="module")
def a_run(tiny_data, tmp_path_factory) -> Path:
    from bagpipe.cli import main

    run = tmp_path_factory.mktemp("misleading") / "run"
    argv = ["train", "--data", tiny_data, "--out", str(run), "--steps", "3", "--batch-size", "64"]
    assert main([*argv, "--no-progress", "--threads", "1", "--eval-samples", "64"]) == 0
    return run


@pytest.mark.integration
def test_export_out_at_the_data_set_names_out(run_cli, tiny_data, a_run):
    before, run_before = snapshot(tiny_data), snapshot(a_run)
    rc, _, err = run_cli("export", "--run", a_run, "--out", tiny_data)
    assert one_line_error(rc, err, "export") == (
        f"--out {tiny_data} is the data set {os.path.realpath(tiny_data)}: an export is not written over it; choose another --out"
    )
    rc, _, err = run_cli("export", "--run", a_run, "--out", a_run)
    assert one_line_error(rc, err, "export") == (
        f"--out {a_run} is the run {os.path.realpath(a_run)}: an export is not written over it; choose another --out"
    )
    assert snapshot(tiny_data) == before and snapshot(a_run) == run_before


# -- 6. a failed export's parent folders ---------------------------------------------------------


@pytest.mark.integration
def test_a_failed_export_removes_only_the_folders_it_made(run_cli, a_run, tmp_path, monkeypatch):
    import bagpipe.export.write
    from bagpipe.errors import DataError

    def full_disk(*args, **kwargs):
        raise DataError("no space left on device (simulated)")

    mine = tmp_path / "exports"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    monkeypatch.setattr(bagpipe.export.write, "_write", full_disk)
    before = snapshot(tmp_path)
    rc, _, err = run_cli("export", "--run", a_run, "--out", mine / "a" / "b" / "model")
    assert one_line_error(rc, err, "export") == "no space left on device (simulated)"
    assert snapshot(tmp_path) == before and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    # a folder that was there already stays, even empty
    (mine / "empty").mkdir()
    rc, _, err = run_cli("export", "--run", a_run, "--out", mine / "empty" / "c" / "model")
    assert rc == 2 and sorted(p.name for p in mine.iterdir()) == ["empty", "notes.txt"]
    assert list((mine / "empty").iterdir()) == []


# -- 5. plot --out - -------------------------------------------------------------------------------


@pytest.mark.integration
def test_plot_out_dash_is_standard_output_not_a_file(run_cli, a_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = snapshot(a_run)
    written = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(written))  # a binary stream, as a shell's `> f.png`
    rc, _, err = run_cli("plot", a_run, "--out", "-")
    assert rc == 0 and "wrote the picture to standard output (-)" in err, err
    assert written.getvalue().startswith(b"\x89PNG")
    assert list(tmp_path.iterdir()) == [] and snapshot(a_run) == before


# -- 8. --config at a folder ---------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("command", ["train", "plan"])
def test_config_at_a_folder_says_a_file_is_expected(run_cli, tiny_data, tmp_path, command):
    out = tmp_path / "run"
    args = ["--data", tiny_data, "--batch-size", 64] + (["--out", out, "--steps", 3] if command == "train" else [])
    before = snapshot(tiny_data)
    rc, _, err = run_cli(command, "--config", tiny_data, *args)
    assert one_line_error(rc, err, command) == (
        f"--config {tiny_data}: is a folder, not a file; give the TOML file of settings (e.g. run.toml)"
    )
    assert snapshot(tiny_data) == before and not out.exists()


# -- 9. --hot-rows at a file that is not one -------------------------------------------------------


@pytest.mark.integration
def test_hot_rows_at_another_file_says_what_a_hot_row_file_is(run_cli, tiny_data, tmp_path):
    picture = tmp_path / "c.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    out = tmp_path / "run"
    before = snapshot(tmp_path)
    rc, _, err = run_cli(
        "train", "--data", tiny_data, "--out", out, "--steps", 3, "--batch-size", 64, "--no-progress",
        "--mode", "lookahead", "--hot-rows", picture,
    )  # fmt: skip
    line = one_line_error(rc, err, "train")
    assert line == (
        f"{picture}: not a hot-row file (not a .npz archive): `bagpipe profile --out FILE` writes one, "
        "a NumPy .npz archive of the rows and their report; give --hot-rows such a file"
    )
    assert "pickle" not in line and snapshot(tmp_path) == before and not out.exists()


# -- 10. train --resume without a checkpoint ---------------------------------------------------------


@pytest.mark.integration
def test_resume_without_a_checkpoint_says_to_drop_resume_and_a_new_run_keeps_the_old_records(
    run_cli, tiny_data, a_run, tmp_path
):
    common: list = ["--data", tiny_data, "--steps", 6, "--batch-size", 64, "--no-progress", "--threads", 1]
    common += ["--eval-samples", 64]
    nothing = tmp_path / "new"
    rc, _, err = run_cli("train", *common, "--out", nothing, "--resume")
    assert one_line_error(rc, err, "train") == (
        f"{nothing}: --resume given but there is no checkpoint in this folder; drop --resume to start a new run "
        "there, or give --out the run folder that holds the checkpoint to resume"
    )
    assert not nothing.exists()
    # a run that ended without a checkpoint
    bare = tmp_path / "bare"
    assert run_cli("train", *common, "--out", bare, "--no-final-checkpoint")[0] == 0
    before = snapshot(bare)
    rc, _, err = run_cli("train", *common, "--out", bare, "--resume")
    assert one_line_error(rc, err, "train") == (
        f"{bare}: --resume given but the run in this folder saved no checkpoint (it has only its records); "
        "it cannot be continued: choose another --out for a new run, or give --out the run folder that "
        "holds the checkpoint to resume"
    )
    assert snapshot(bare) == before
    # ... and a new run there (without --resume) would replace its records: refused too
    rc, _, err = run_cli("train", *common, "--out", bare, "--model", "deepfm", "--batch-size", 32)
    assert one_line_error(rc, err, "train") == (
        f"{bare} already holds the records of an earlier run (config.json, metrics.jsonl, summary.json) that "
        "saved no checkpoint to continue from; choose another --out, or remove that folder to start again there "
        f"(rm -r {bare}; nothing in it was changed)"
    )
    assert snapshot(bare) == before
    # a run stopped before its first checkpoint leaves config.json and metrics.jsonl: the same
    (bare / "summary.json").unlink()
    before = snapshot(bare)
    rc, _, err = run_cli("train", *common, "--out", bare)
    assert "already holds the records of an earlier run (config.json, metrics.jsonl) that saved" in one_line_error(
        rc, err, "train"
    )
    assert snapshot(bare) == before
    # what a run stopped there says (Ctrl-C, SIGTERM) tells how to start over, and that works
    from bagpipe.checkpoint.folder import where_to_continue

    assert where_to_continue(str(bare)) == (
        f"{bare} has no checkpoint: to start over, remove it (rm -r {bare}) and run the command again, "
        "or give another --out"
    )
    assert (
        where_to_continue(str(tmp_path / "none"))
        == f"{tmp_path / 'none'} has no checkpoint: run the command again to start over"
    )
    shutil.rmtree(bare)
    assert run_cli("train", *common, "--out", bare)[0] == 0
    # checkpoints without LATEST: the newest is offered
    lost = tmp_path / "lost"
    shutil.copytree(a_run, lost)
    (lost / "checkpoints" / "LATEST").unlink()
    before = snapshot(lost)
    rc, _, err = run_cli("train", *common, "--out", lost, "--resume")
    assert one_line_error(rc, err, "train") == (
        f"{lost}: --resume given but {lost / 'checkpoints' / 'LATEST'} is missing; resume from the newest "
        "complete checkpoint with --resume-from step-00000003"
    )
    assert snapshot(lost) == before
    rc, _, err = run_cli("train", *common, "--out", lost, "--resume-from", "step-00000003")
    assert rc == 0, err


# -- 3. serve: a failed join, WORLD_SIZE -----------------------------------------------------------


@pytest.mark.integration
def test_serve_refuses_a_world_size_of_another_job(run_cli, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "7")
    rc, _, err = run_cli("serve", "--rank", 1, "--trainers", 1, "--servers", 1, "--rendezvous-timeout", 5)
    assert one_line_error(rc, err, "serve") == (
        "WORLD_SIZE is 7 but 1 trainers + 1 servers + 1 oracle make 3 processes; start every role with the same "
        "--trainers, --servers and WORLD_SIZE (or leave WORLD_SIZE unset for bagpipe serve)"
    )
    assert "waiting for the job" not in err  # refused before the rendezvous


# The rendezvous store of a job's rank 0: it serves until a client has arrived, then stops.
STORE_THAT_STOPS = """
import sys, time
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 3, is_master=True, timeout=timedelta(seconds=60),
                      wait_for_workers=False, multi_tenant=True)
empty = store.num_keys()
print("listening", flush=True)
deadline = time.monotonic() + 60
while store.num_keys() == empty and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(0.5)
"""


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_serve_says_the_rendezvous_failed_and_when_not_that_it_timed_out(tmp_path):
    from bagpipe.distributed.auth import SECRET_ENV, new_secret
    from bagpipe.distributed.launch import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update({SECRET_ENV: new_secret().decode(), "OMP_NUM_THREADS": "1"})
    store = subprocess.Popen([sys.executable, "-c", STORE_THAT_STOPS, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert store.stdout is not None and store.stdout.readline() == "listening\n"
        serve = ["serve", "--rank", "1", "--trainers", "1", "--servers", "1", "--master-port", str(port)]
        t0 = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "bagpipe.cli", *serve, "--rendezvous-timeout", "60"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=100,
        )  # fmt: skip
        took = time.monotonic() - t0
    finally:
        store.kill()
        store.wait()
    line = one_line_error(done.returncode, done.stderr, "serve")
    prefix = f"server 0: the rendezvous at 127.0.0.1:{port} failed after "
    assert line.startswith(prefix), line
    waited = float(line[len(prefix) :].split(" s ", 1)[0])
    assert waited < took < 50 and "within 60 s" not in line
    assert line.endswith(
        "(rank 1 of 3): the process serving it closed the connection (it stopped, or refused this role); "
        "is the job's rank 0 (or torchrun's agent) running there? start it, then this role again"
    )
    assert list(tmp_path.iterdir()) == []
