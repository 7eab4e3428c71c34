"""The fourth newcomer round's findings (issue 32), each one line with nothing of the
user's changed:

* a ``synth`` or ``preprocess`` stopped with SIGTERM (``kill``, ``timeout``, a scheduler),
  or with SIGINT when started as a background job (SIGINT inherited ignored), removes its
  staging folder and its lock as Ctrl-C does, and says which signal stopped it;
* ``synth`` and ``preprocess`` (from a regular file) refuse up front an output the disk
  has no room for, saying how much it needs and how much is free;
* a disk that fills mid-way (``preprocess`` from a pipe, ``export``, ``train
  --summary-json``) is one line naming the output, the unfinished files removed and the
  files already there kept;
* ``--out`` at the root of an empty mounted volume is written (staged inside it, so
  nothing is renamed across devices), and ``--overwrite`` there is refused in one line;
* ``--out`` where nothing can be written (``/proc``, a read-only volume) is one line
  ``cannot write in DIR (...)``;
* ``preprocess`` says when --split's eval lines were all bad and skipped (the eval split
  is empty);
* ``bagpipe profile``'s default D is train's default recipe's, and ``train --hot-rows``
  says when the file was sized for another D.

The mounts are small tmpfs volumes (``small_disk``), skipped without root.
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

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PY = sys.executable
CRITEO_LINE = "1\t" + "\t".join(["3"] * 13) + "\t" + "\t".join(["68fd1e64"] * 26) + "\n"


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def start(args: list[str], cwd: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [PY, "-m", "bagpipe", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


def wait_for(path_glob: str, folder: Path, proc: subprocess.Popen, within: float = 60.0) -> None:
    t0 = time.monotonic()
    while not list(folder.glob(path_glob)):
        if proc.poll() is not None or time.monotonic() - t0 > within:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"no {path_glob} in {folder}: {err[-2000:]}")
        time.sleep(0.05)


def finish(proc: subprocess.Popen, within: float = 30.0) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return proc.returncode, err


def _ignore_sigint() -> None:  # what a shell does to a background job (`cmd &`)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT-ignored"])
def test_a_stopped_synth_removes_its_staging_folder_and_lock(tmp_path, how):
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "notes.txt").write_text("mine")
    kw = {"preexec_fn": _ignore_sigint} if how == "SIGINT-ignored" else {}
    proc = start(
        # 8M samples: seconds of writing to stop in, 0.66 GiB of free disk asked for (20M asked 1.64 GiB: red in CI on a full disk)
        ["synth", "--profile", "tiny", "--samples", "8000000", "--out", "k/syn", "--no-progress"],
        tmp_path,
        **kw,
    )
    try:
        wait_for(".syn.partial-*/train/00000/labels.npy", tmp_path / "k", proc)
        proc.send_signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGINT)
        rc, err = finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if how == "SIGTERM":
        assert (rc, err.strip()) == (143, "bagpipe synth: stopped by SIGTERM")
    else:
        assert (rc, err.strip()) == (130, "bagpipe synth: interrupted")
    assert listing(tmp_path / "k") == ["notes.txt"]


def test_a_preprocess_stopped_with_sigterm_removes_its_staging_folder_and_lock(tmp_path):
    proc = start(
        ["preprocess", "criteo", "--input", "-", "--split", "1", "--max-rows-per-table", "100", "--out", "pp",
         "--rows-per-shard", "64", "--no-progress"],
        tmp_path, stdin=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdin is not None
        try:
            proc.stdin.write(CRITEO_LINE * 2000)  # the pipe stays open: preprocess waits for more
            proc.stdin.flush()
        except BrokenPipeError:
            raise AssertionError(proc.communicate()[1]) from None
        wait_for(".pp.partial-*", tmp_path, proc)  # staged; reading the pipe, which stays open
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, err.strip()) == (143, "bagpipe preprocess: stopped by SIGTERM")
    assert listing(tmp_path) == []


def test_synth_and_preprocess_refuse_an_output_the_disk_cannot_hold(tmp_path, small_disk, run_cli):
    disk = small_disk(tmp_path / "t", "1m")
    (disk / "w").mkdir()
    rc, _, err = run_cli("synth", "--profile", "tiny", "--samples", "5000000", "--out", disk / "w" / "syn")
    assert rc == 2
    assert err.strip() == (
        f"bagpipe synth: error: --out {disk}/w/syn: this dataset needs about 419.62 MiB (5,000,000 samples x 88 "
        f"bytes) but {disk}/w has 1.00 MiB free; free some space, choose another --out, or write fewer --samples"
    )
    raw = tmp_path / "raw.tsv"
    raw.write_text(CRITEO_LINE * 20000)
    rc, _, err = run_cli("preprocess", "criteo", "--input", raw, "--out", disk / "w" / "pp")
    assert rc == 2
    assert err.strip() == (
        f"bagpipe preprocess: error: --out {disk}/w/pp: this dataset needs about 3.05 MiB (about 20,000 input "
        f"lines x at least 160 bytes a sample) but {disk}/w has 1.00 MiB free; free some space, choose another "
        "--out, or convert fewer lines"
    )
    assert listing(disk / "w") == []


def test_a_disk_that_fills_midway_is_one_line_and_keeps_what_was_there(tmp_path, small_disk, run_cli, tiny_data):
    disk = small_disk(tmp_path / "t", "1m")
    w = disk / "w"
    w.mkdir()
    (w / "keep.txt").write_text("mine")
    # preprocess from a pipe: no size up front
    proc = subprocess.run(
        [PY, "-m", "bagpipe", "preprocess", "criteo", "--input", "-", "--split", "1", "--max-rows-per-table", "100",
         "--out", str(w / "pp"), "--no-progress"],
        input=CRITEO_LINE * 20000, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (proc.returncode, proc.stderr.strip()) == (
        2,
        f"bagpipe preprocess: error: cannot write the dataset {w}/pp (No space left on device); its unfinished "
        "files were removed: free some space or choose another --out",
    )
    assert listing(w) == ["keep.txt"]
    # a run to export and to write a summary of
    run = tmp_path / "run"
    rc, _, err = run_cli("train", "--data", tiny_data, "--steps", "2", "--threads", "1", "--no-progress", "--out", run)
    assert rc == 0, err
    small_disk.fill(disk)
    rc, _, err = run_cli("export", "--run", run, "--out", w / "ex")
    assert (rc, err.strip()) == (
        2,
        f"bagpipe export: error: cannot write the export {w}/ex (No space left on device); its unfinished files "
        "were removed: free some space or choose another --out",
    )
    assert listing(w) == ["keep.txt"]
    rc, _, err = run_cli(
        "train", "--data", tiny_data, "--steps", "2", "--threads", "1", "--no-progress", "--out", tmp_path / "r2",
        "--summary-json", w / "s.json",
    )  # fmt: skip
    assert (rc, err.strip().splitlines()[-1]) == (
        2,
        f"bagpipe train: error: cannot write {w}/s.json (No space left on device); free some space or choose "
        "another path",
    )
    assert listing(w) == ["keep.txt"]  # its temporary file removed


def test_out_at_an_empty_volumes_root_is_written_and_overwrite_there_refused(tmp_path, small_disk, run_cli):
    mnt = small_disk(tmp_path / "mnt", "16m")
    rc, out, err = run_cli("synth", "--profile", "tiny", "--samples", "500", "--out", mnt, "--no-progress")
    assert rc == 0, err
    assert listing(mnt) == [".bagpipe-files.json", "eval", "meta.json", "train"]
    assert listing(tmp_path) == ["mnt"]  # no lock nor staging left beside it
    before = (mnt / "meta.json").read_bytes()
    rc, _, err = run_cli("synth", "--profile", "tiny", "--samples", "600", "--out", mnt, "--overwrite")
    assert (rc, err.strip()) == (
        2,
        f"bagpipe synth: error: --out {mnt} is a mount point (a volume's root), which --overwrite cannot swap for "
        "a new dataset; remove the old dataset's files from it yourself, or write to a folder inside it",
    )
    assert (mnt / "meta.json").read_bytes() == before


def test_out_where_nothing_can_be_written_is_one_line(tmp_path, small_disk, run_cli, tiny_data):
    rc, _, err = run_cli("train", "--data", tiny_data, "--steps", "1", "--out", "/proc")
    # /proc holds entries no run writes: refused as any such folder is, before a write is tried
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("bagpipe train: error: --out /proc is not empty and is not a bagpipe run folder (it holds ")
    ro = small_disk(tmp_path / "ro", "1m,ro")
    rc, _, err = run_cli("train", "--data", tiny_data, "--steps", "1", "--out", ro)
    assert (rc, err.strip()) == (
        2,
        f"bagpipe train: error: cannot write in {ro} (Read-only file system); choose another path",
    )
    rc, _, err = run_cli("synth", "--profile", "tiny", "--samples", "500", "--out", ro / "x")
    assert (rc, err.strip()) == (
        2,
        f"bagpipe synth: error: --out {ro}/x: cannot write in {ro} (Read-only file system); choose another path",
    )
    assert listing(ro) == []


def test_preprocess_says_the_eval_split_is_empty_when_its_lines_were_all_bad(tmp_path, run_cli):
    raw = tmp_path / "raw.tsv"
    raw.write_text(CRITEO_LINE * 27 + "bad line\n" * 3)
    rc, out, err = run_cli(
        "preprocess", "criteo", "--input", raw, "--split", "0.9", "--on-error", "skip", "--out", tmp_path / "ds",
        "--no-progress",
    )  # fmt: skip
    assert rc == 0, err
    assert (
        "the eval split is empty: --split 0.9 sends the last 3 lines of --input to it and every one was bad "
        f"(skipped, --on-error skip; 3 skipped in all, e.g. {raw}:28: "
    ) in out
    assert "a run on this data set reports no eval metrics" in out
    meta = json.loads((tmp_path / "ds" / "meta.json").read_text())
    assert list(meta["splits"]) == ["train"]


def test_profile_default_dim_is_trains_and_train_says_a_file_of_another_dim(tmp_path, run_cli, tiny_data):
    rc, out, err = run_cli("profile", "--data", tiny_data, "--hot-budget-mb", "0.05", "--out", tmp_path / "h8.npz",
                           "--no-progress")  # fmt: skip
    assert rc == 0, err
    rc, out16, err = run_cli("profile", "--data", tiny_data, "--hot-budget-mb", "0.05", "--embedding-dim", "16",
                             "--out", tmp_path / "h16.npz", "--no-progress")  # fmt: skip
    assert rc == 0, err
    rows8 = int(out.splitlines()[-2].split()[2].replace(",", ""))
    rows16 = int(out16.splitlines()[-2].split()[2].replace(",", ""))
    assert rows8 > rows16  # D=8 rows: twice as many fit
    common = ["train", "--data", tiny_data, "--steps", "1", "--mode", "fae", "--threads", "1", "--no-progress"]
    rc, out, err = run_cli(*common, "--hot-rows", tmp_path / "h8.npz", "--out", tmp_path / "r8")
    assert rc == 0, err
    assert "sized for" not in out
    assert f"hot rows: {rows8:,} ({rows8 * 4 * (8 + 1) / 2**20:,.2f} MiB) serve " in out  # one size: the file's
    rc, out, err = run_cli(*common, "--hot-rows", tmp_path / "h16.npz", "--out", tmp_path / "r16")
    assert rc == 0, err
    assert (
        f"--hot-rows {tmp_path}/h16.npz: sized for D=16 + 1 optimizer values a row, this run has D=8 + 1: its "
        f"{rows16:,} rows take "
    ) in out
    assert "profile again with `bagpipe profile --embedding-dim 8` and this run's --optimizer" in out
    assert os.path.exists(tmp_path / "h16.npz")
    # the line after it says the same size (finding 5 of newcomer round 14: 1.07 MiB, then 0.0 MiB)
    from bagpipe.accel.profile import MIB

    here, profiled = rows16 * 4 * (8 + 1) / MIB, rows16 * 4 * (16 + 1) / MIB
    assert f"rows take {here:,.2f} MiB, not the 0.05 MiB it was chosen for" in out
    assert f"hot rows: {rows16:,} ({here:,.2f} MiB in this run; profiled as {profiled:,.2f} MiB) serve " in out
