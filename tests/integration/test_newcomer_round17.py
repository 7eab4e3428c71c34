"""The seventeenth newcomer round's findings, each refused in one line before anything is
written, the user's files as they were.

* ``--tensorboard`` had no guard: a file (or a path under one) was a traceback after the
  run had started (in a job, blamed on the oracle), and any folder took the event files --
  the data set, a shard folder, an export, another run, the run's own folder or store, a
  user's folder (through a link too) -- after which ``synth``/``export --overwrite`` and
  ``--init-from-store`` refused those folders. A new folder, one of TensorBoard logs and a
  folder of its own inside the run (RUN/tb) are used. (The refusals come before the
  tensorboard package is imported: they hold without it, as in CI.)
* ``--hot-rows`` given a named pipe waited for ever (the file is opened twice), and
  ``<(...)`` said a valid file was "not a hot-row file": a pipe or a device is refused.
* ``--config <(...)`` and ``--config -`` said "config file not found": the settings are read
  more than once, so a pipe is refused saying so.
* ``--secret-file /dev/null`` advised ``chmod 600 /dev/null``: a file that is not regular
  is refused before its mode is read.
* ``export`` from another folder said the run's relatively given data set had "moved?":
  it says the path is relative to where ``bagpipe train`` ran.
"""

from __future__ import annotations

import os
import threading

import pytest
from runs import one_line

pytestmark = pytest.mark.integration

RUN = ("--steps", 2, "--batch-size", 64, "--no-progress")


def snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def test_tensorboard_takes_only_a_folder_of_its_own(run_cli, tiny_data, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("precious\n")
    (tmp_path / "link").symlink_to(user)
    other = tmp_path / "other"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", other, *RUN)
    assert rc == 0, err
    out = tmp_path / "run"
    example = f"e.g. --tensorboard {out / 'tb'}"
    cases = {
        notes: f"is a file: TensorBoard writes a folder of event files; give a folder ({example})",
        notes
        / "sub": f"lies under the file {notes}: TensorBoard writes a folder of event files; give a folder ({example})",
        tiny_data: f"is --data {tiny_data}: the event files would be mixed with the data set's; {example}",
        f"{tiny_data}/train/00000": f"lies inside --data {tiny_data}: the event files would be mixed with the data set's; {example}",
        other: f"is the run folder {other}: the event files would be mixed with that run's files; {example}",
        other / "checkpoints": (
            f"lies inside {other / 'checkpoints'} of the run: the event files would be mixed with that run's files; {example}"
        ),
        out: f"is this run's --out: the event files would be mixed with the run's files; {example}",
        out
        / "store": f"is this run's store/ ({out / 'store'}): the event files would be mixed with its files; {example}",
        user: (
            "holds files that are not TensorBoard event files (notes.txt): the run's event file would be mixed with "
            f"them; give a new or empty folder, or one of TensorBoard logs ({example})"
        ),
        tmp_path / "link": (
            "holds files that are not TensorBoard event files (notes.txt): the run's event file would be mixed with "
            f"them; give a new or empty folder, or one of TensorBoard logs ({example})"
        ),
    }
    before = snapshot(tmp_path)
    for given, said in cases.items():
        rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, *RUN, "--tensorboard", given)
        assert one_line(rc, err) == f"--tensorboard {given} {said}"
        assert snapshot(tmp_path) == before and not out.exists()
    # a job's launcher refuses it before any role starts (it was blamed on the oracle)
    job = ("--mode", "lookahead", "--trainers", 2, "--servers", 1)
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, *RUN, *job, "--tensorboard", notes)
    assert one_line(rc, err).startswith(f"--tensorboard {notes} is a file")
    assert not out.exists()


def test_tensorboard_writes_a_new_folder_one_of_logs_and_one_of_its_own_inside_the_run(run_cli, tiny_data, tmp_path):
    """A new folder (its parents made), a folder of TensorBoard logs with one subfolder a
    run, and RUN/tb; a resumed run appends to its own folder (round 18: a second run's
    event files beside another's are refused, tests/integration/test_newcomer_round18_store.py)."""
    pytest.importorskip("tensorboard", reason="the tensorboard package is an optional extra")
    logs = tmp_path / "logs"
    runs = ((tmp_path / "a", logs / "a"), (tmp_path / "b", logs / "b"), (tmp_path / "c", tmp_path / "c" / "tb"))
    for out, tb in runs:
        rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, *RUN, "--tensorboard", tb)
        assert rc == 0, err
        names = sorted(p.name for p in tb.iterdir())
        assert len(names) == 1 and names[0].startswith("events.out.tfevents."), names
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "a", "--steps", 4, "--batch-size", 64,
                         "--no-progress", "--resume", "--tensorboard", logs / "a")  # fmt: skip
    assert rc == 0, err
    assert all(p.name.startswith("events.out.tfevents.") for p in (logs / "a").iterdir())


def test_hot_rows_from_a_named_pipe_is_refused_at_once(run_cli, tiny_data, tmp_path):
    fifo = tmp_path / "hot.npz"
    os.mkfifo(fifo)
    done = []
    t = threading.Thread(target=lambda: done.append(run_cli("train", "--data", tiny_data, "--out", tmp_path / "r",
                                                            *RUN, "--mode", "lookahead", "--hot-rows", fifo)))  # fmt: skip
    t.start()
    t.join(timeout=60)
    if t.is_alive():  # the old behaviour: blocked in the pipe's second open; free it to end the test
        with open(fifo, "wb"):
            pass
        t.join(timeout=30)
        pytest.fail("--hot-rows on a named pipe blocked")
    rc, _, err = done[0]
    assert one_line(rc, err) == (
        f"{fifo}: a hot-row file is read by seeking (a .npz archive), so a pipe or a device cannot be read; write "
        "it to a file first (bagpipe profile ... --out hot.npz) and give --hot-rows hot.npz"
    )


def test_config_from_a_pipe_or_standard_input_says_why_not(run_cli, tiny_data, tmp_path):
    fifo = tmp_path / "run.toml"
    os.mkfifo(fifo)
    for given in (fifo, "-"):
        rc, _, err = run_cli("train", "--config", given, "--out", tmp_path / "r")
        assert one_line(rc, err) == (
            f"--config {given}: the settings are read more than once (and by every role of a job), so a pipe or "
            "standard input cannot be used; write them to a file (e.g. run.toml) and give --config run.toml"
        )
    rc, _, err = run_cli("train", "--config", tmp_path / "missing.toml", "--out", tmp_path / "r")
    assert one_line(rc, err) == f"{tmp_path / 'missing.toml'}: config file not found"


def test_a_secret_file_that_is_not_a_regular_file_is_refused_before_its_mode():
    from bagpipe.distributed.auth import read_secret_file
    from bagpipe.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        read_secret_file("/dev/null")
    assert str(e.value) == (
        "the job's secret file /dev/null is not a regular file; give a file of its own, readable by its owner only, "
        "e.g. `(umask 077; openssl rand -hex 32 > job.secret)` and --secret-file job.secret"
    )
    assert "chmod" not in str(e.value)


def test_export_from_another_folder_says_the_data_path_is_relative(run_cli, tiny_data, tmp_path, monkeypatch):
    import shutil

    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    shutil.copytree(tiny_data, work / "data" / "tiny")
    monkeypatch.chdir(work)
    rc, _, err = run_cli("train", "--data", "data/tiny", "--out", "runs/a", *RUN)
    assert rc == 0, err
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    rc, _, err = run_cli("export", "--run", work / "runs" / "a", "--out", elsewhere / "e")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, err
    assert lines[0] == (
        "bagpipe export: error: data/tiny: the run's dataset (its --data, a path relative to the folder `bagpipe "
        f"train` ran in) is not found from {elsewhere}; run export from that folder, or give --data DIR, a dataset "
        "with the same tables"
    )
    rc, _, err = run_cli(
        "export", "--run", work / "runs" / "a", "--out", elsewhere / "e", "--data", work / "data" / "tiny"
    )
    assert rc == 0, err
