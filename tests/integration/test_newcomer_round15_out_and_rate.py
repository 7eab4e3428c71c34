"""The fifteenth newcomer round's findings 2 and 3.

* ``train --out`` took any non-empty folder (the user's ``data/`` of data sets), and the
  next try called the user's files "records of an earlier run" and offered ``rm -r`` on
  it: a new run refuses a folder holding anything no run writes, in one line, with the
  folder left byte-identical; an empty folder is still taken; the ``rm -r`` advice is
  given only for a folder holding nothing but a run's own entries.
* ``--recipe kaggle --optimizer adam`` without ``--lr`` trained at the default 0.05
  without a word: a note on stderr says the recipe's rate does not apply and to give --lr.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from bagpipe.train.resume import RUN_ENTRIES, not_its_own

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

RUN = ("--batch-size", 64, "--no-progress", "--threads", 1, "--steps", 2, "--no-final-checkpoint")
NOTE = "the kaggle recipe's rate (adagrad 0.002) does not apply"


def tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def test_a_users_folder_is_refused_and_left_byte_identical(run_cli, tiny_data, tmp_path):
    out = tmp_path / "data"
    (out / "criteo").mkdir(parents=True)
    (out / "criteo" / "part-0.tsv").write_text("1\t2\t3\n")
    (out / "notes.txt").write_text("mine\n")
    before = tree(out)
    rc, _, err = run_cli("train", "--data", tiny_data, *RUN, "--out", out)
    assert rc == 2 and err.count("\n") == 1, err
    assert (
        f"--out {out} is not empty and is not a bagpipe run folder (it holds criteo/, notes.txt): "
        "give a new or empty folder" in err
    ), err
    assert "rm -r" not in err
    assert tree(out) == before  # no .lock, nothing of a run's


def test_an_empty_folder_is_taken_and_only_a_pure_run_folder_is_offered_rm(run_cli, tiny_data, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    rc, _, err = run_cli("train", "--data", tiny_data, *RUN, "--out", out)
    assert rc == 0, err
    assert not not_its_own(out), sorted(p.name for p in out.iterdir())  # every entry is a run's own
    rc, _, err = run_cli("train", "--data", tiny_data, *RUN, "--out", out)
    assert rc == 2 and "already holds the records of an earlier run" in err and "rm -r" in err, err
    (out / "mine.txt").write_text("mine\n")
    before = tree(out)
    rc, _, err = run_cli("train", "--data", tiny_data, *RUN, "--out", out)
    assert rc == 2 and err.count("\n") == 1, err
    assert "beside files that are not the run's (mine.txt)" in err and "rm -r" not in err, err
    assert tree(out) == before


def test_the_launchers_entries_are_a_runs_own():
    assert {"job.json", "roles.json", "logs", ".phases", ".lock", ".step", "store", "checkpoints"} <= RUN_ENTRIES


@pytest.mark.parametrize(
    "extra, noted",
    [
        (("--recipe", "kaggle", "--optimizer", "adam"), True),
        (("--recipe", "kaggle", "--optimizer", "adam", "--lr", "0.001"), False),
        (("--recipe", "kaggle"), False),
        (("--recipe", "kaggle", "--optimizer", "adagrad"), False),
    ],
)
def test_a_recipes_rate_dropped_for_another_optimizer_is_noted(run_cli, tiny_data, tmp_path, extra, noted):
    rc, _, err = run_cli("train", "--data", tiny_data, *RUN, "--out", tmp_path / "r", *extra)
    assert rc == 0, err
    assert (NOTE in err) == noted, err
    if noted:
        assert "trains at the default --lr 0.05 (tuned for adagrad); adam usually wants about 1e-3: give --lr" in err


def test_a_rate_from_the_toml_file_is_given(run_cli, tiny_data, tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text('recipe = "kaggle"\noptimizer = "adam"\nlr = 0.001\n')
    rc, _, err = run_cli("train", "--config", conf, "--data", tiny_data, *RUN, "--out", tmp_path / "r")
    assert rc == 0, err
    assert NOTE not in err
