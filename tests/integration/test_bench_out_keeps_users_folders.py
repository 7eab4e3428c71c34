"""``bagpipe bench SCENARIO --out OUT`` replaces or removes only what a bench wrote.

Newcomer round 15, finding 1 (DATA LOSS): a bench replaced any bagpipe data set in
OUT/data with generated data (one preprocessed from real Criteo logs lost its vocab/) and
removed OUT/store-template, OUT/store-run and OUT/runs/<mode>-<store>-<rep> whatever they
held, exit 0. Now such an OUT is refused in one line before anything is written and left
byte for byte as it was; a bench marks the OUT it uses (OUT/.bagpipe-bench.json), and a
rerun into its own OUT works.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from repo import SHARED_DATA

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CRITEO = SHARED_DATA / "criteo" / "kaggle_part0_100.tsv"
MODES = ("bench", "modes", "--quick", "--profile", "tiny", "--modes", "full", "--reps", "1", "--stores", "memory",
         "--steps", "6", "--warmup", "2")  # fmt: skip


def snapshot(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
        for p in sorted(folder.rglob("*"))
    }


def one_line_error(rc: int, err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0].removeprefix("bagpipe bench: error: ")


@pytest.mark.skipif(not CRITEO.exists(), reason="no Criteo sample in ../shared/data")
def test_a_preprocessed_data_set_in_out_data_is_refused_and_kept(run_cli, tmp_path):
    out = tmp_path / "proj"
    rc, _, err = run_cli("preprocess", "criteo", "--input", CRITEO, "--out", out / "data")
    assert rc == 0, err
    assert (out / "data" / "vocab").is_dir()
    before = snapshot(out)
    for args in (
        ("bench", "oracle", "--quick", "--profile", "tiny", "--batch-sizes", "256", "--lookaheads", "2"),
        MODES,
    ):
        rc, _, err = run_cli(*args, "--out", out)
        line = one_line_error(rc, err)
        assert line.startswith(f"--out {out}: {out / 'data'} exists and it is a data set with a vocabulary"), line
        assert "move it away or choose another --out" in line
        assert snapshot(out) == before


@pytest.mark.parametrize("entry", ["store-template", "store-run", "runs/full-memory-0", "data-criteo"])
def test_a_users_folder_where_a_bench_removes_one_is_refused_and_kept(run_cli, tmp_path, entry):
    out = tmp_path / "proj"
    (out / entry).mkdir(parents=True)
    (out / entry / "mine.txt").write_text("mine\n")
    before = snapshot(out)
    rc, _, err = run_cli(*MODES, "--out", out)
    top = entry.split("/")[0]
    assert one_line_error(rc, err) == (
        f"--out {out}: {out / top} exists and is not a bench's (the folder has no .bagpipe-bench.json nor an "
        "earlier bench's results.json); a bench would remove it, so it is not touched: move it away or choose "
        "another --out"
    )
    assert snapshot(out) == before


@pytest.mark.parametrize("entry", ["data", "store-template", "runs"])
def test_a_symbolic_link_in_out_is_refused_and_what_it_names_is_kept(run_cli, tmp_path, entry):
    """OUT/data as a link to the user's data set elsewhere: a bench wrote its generated data
    through it, replacing that data set (newcomer round 16); even in a bench's own OUT."""
    users = tmp_path / "elsewhere"
    users.mkdir()
    (users / "mine.txt").write_text("mine\n")
    out = tmp_path / "proj"
    out.mkdir()
    (out / ".bagpipe-bench.json").write_text("{}\n")  # a bench's OUT: the link is refused all the same
    (out / entry).symlink_to(users, target_is_directory=True)
    before, theirs = snapshot(out), snapshot(users)
    rc, _, err = run_cli(*MODES, "--out", out)
    assert one_line_error(rc, err) == (
        f"--out {out}: {out / entry} is a symbolic link (to {users}); a bench writes its own files there and would "
        "write through it, so it is not touched: remove the link or choose another --out"
    )
    assert snapshot(out) == before and snapshot(users) == theirs


def test_a_folder_without_a_data_set_at_out_data_is_refused(run_cli, tmp_path):
    out = tmp_path / "proj"
    (out / "data").mkdir(parents=True)
    (out / "data" / "notes.txt").write_text("mine\n")
    before = snapshot(out)
    rc, _, err = run_cli(*MODES, "--out", out)
    assert "it is not a data set bagpipe generated" in one_line_error(rc, err)
    assert snapshot(out) == before


def test_a_bench_reruns_into_its_own_out(run_cli, tmp_path):
    out = tmp_path / "proj"
    rc, _, err = run_cli(*MODES, "--out", out)
    assert rc == 0, err
    assert (out / ".bagpipe-bench.json").is_file() and (out / "runs").is_dir() and (out / "data").is_dir()
    rc, _, err = run_cli(*MODES, "--out", out)
    assert rc == 0, err
    # an OUT from before the mark: recognised by its earlier bench's results.json
    (out / ".bagpipe-bench.json").unlink()
    rc, _, err = run_cli(*MODES, "--out", out)
    assert rc == 0, err
    # a preprocessed data set moved into a bench's OUT is still refused
    (out / "data" / "vocab").mkdir()
    rc, _, err = run_cli(*MODES, "--out", out)
    assert "it is a data set with a vocabulary" in one_line_error(rc, err)
    assert (out / "data" / "vocab").is_dir()


def test_a_users_folder_or_a_training_run_is_not_taken_as_a_benchs_out(run_cli, tmp_path, tiny_data):
    """Newcomer round 16, finding 2: ``bench --out`` wrote into a folder of the user's and into
    a finished training run, mixing in its data set, results and plots, and marked the folder
    as a bench's (after which its stores and runs folders were a bench's to remove). A
    non-empty OUT that is not a bench's is refused in one line and left as it was; an empty
    one, a new one and a bench's own are used."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("hello\n")
    run = tmp_path / "run"
    rc, _, err = run_cli(
        "train", "--data", tiny_data, "--steps", "2", "--batch-size", "64", "--out", run, "--no-progress"
    )
    assert rc == 0, err
    for folder, held in (
        (user, "notes.txt"),
        (run, "checkpoints, config.json, metrics.jsonl, summary.json and 2 more"),
    ):
        before = snapshot(folder)
        rc, stdout, err = run_cli("bench", "oracle", "--quick", "--profile", "tiny", "--batches", "5", "--out", folder)
        assert one_line_error(rc, err) == (
            f"--out {folder}: the folder is not empty ({held}) and is not a bench's (no .bagpipe-bench.json nor an "
            "earlier bench's results.json); a bench writes data, stores and runs there, so it is not used: give a "
            "new or empty folder, e.g. --out bench-out/NAME"
        )
        assert "[rep" not in stdout and snapshot(folder) == before
    empty = tmp_path / "empty"
    empty.mkdir()
    for _ in range(2):  # an empty folder, then the bench's own on a rerun
        rc, _, err = run_cli("bench", "oracle", "--quick", "--profile", "tiny", "--batches", "5", "--out", empty)
        assert rc == 0, err
    assert (empty / "results.json").is_file() and (empty / ".bagpipe-bench.json").is_file()
