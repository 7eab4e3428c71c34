"""The eleventh newcomer round's findings: what a run, a config file, an option or the
Python API said was not the truth, or said too little.

* ``--mode hotline`` (equal to ``--mode full`` within float rounding, not bitwise) and
  ``--init-from-store`` (started from a store's tables, not the seed's) wrote
  ``"exact": true``. They now say ``"exact": false`` with the reason in ``not_exact`` --
  in summary.json, the printed summary line, every metrics.jsonl record and config.json
  -- and a run resumed from one keeps the reason, whatever the resumed run's settings.
* A ``--config`` file saved with a UTF-8 byte-order mark (and CRLF line ends) was
  ``Invalid statement (at line 1, column 1)``; it is read (the byte offset of a non-UTF-8
  byte still counts the mark).
* ``eval --max-samples 0`` evaluated everything while the help said nothing of 0: the help
  says 0 is all of them, as ``train --eval-samples 0``; a negative count is refused.
* ``train --out`` on a full disk said ``cannot write an output file``: it names the file
  (the run's ``.lock``; the ``.step`` heartbeat).
* ``model.predict`` of no sample was torch's reshape error; it returns an empty array.
  Float ids were truncated (1.9 scored as 1): a fractional, NaN or infinite id is refused
  naming it, a float holding a whole number is taken.
* ``export --out RUN/exp`` (inside the run folder) stays accepted: nothing of a run's
  touches a folder of the user's there, and a resumed run leaves it as it was.
* ``--server-memory-budget-mb`` above the memory cgroup's limit said nothing: one warning,
  the same in ``plan`` and ``train``, as ``--memory-budget-mb``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from bagpipe.config.train import INIT_FROM_STORE_NOT_EXACT, ROUNDING_NOT_EXACT

HOTLINE_NOT_EXACT = ROUNDING_NOT_EXACT.format(mode="hotline")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

RUN = ("--batch-size", 64, "--no-progress", "--threads", 1, "--eval-samples", 256)


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summary_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if "params_sha256" in line]
    assert len(lines) == 1, stdout
    return lines[0]


def says_not_exact(out: Path, stdout: str, lines: list[str]) -> None:
    """summary.json, the printed line, every metrics record and config.json say ``lines``."""
    s = summary(out)
    assert s["exact"] is False and s["not_exact"] == lines and s["approximation"] is None
    assert summary_line(stdout).endswith("; not exact: " + "; ".join(lines))
    recs = records(out)
    assert recs and all(r["exact"] is False and r["not_exact"] == lines and "approximation" not in r for r in recs)
    assert json.loads((out / "config.json").read_text())["not_exact"] == lines


# -- exact: false, and why --------------------------------------------------------------


def test_hotline_says_it_is_not_exact_and_a_resume_keeps_it(run_cli, tiny_data, tmp_path):
    rc, out, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "full", "--steps", 10, *RUN)
    assert rc == 0, err
    full = summary(tmp_path / "full")
    assert full["exact"] is True and full["not_exact"] == [] and "not exact" not in summary_line(out)
    assert all("exact" not in r and "not_exact" not in r for r in records(tmp_path / "full"))
    assert json.loads((tmp_path / "full" / "config.json").read_text())["not_exact"] == []

    hot = tmp_path / "hot"
    rc, out, err = run_cli("train", "--data", tiny_data, "--out", hot, "--mode", "hotline", "--steps", 10, *RUN)
    assert rc == 0, err
    says_not_exact(hot, out, [HOTLINE_NOT_EXACT])
    assert HOTLINE_NOT_EXACT == "hotline: equal to plain training within float rounding, not bitwise"
    assert summary(hot)["params_sha256"] != full["params_sha256"]

    # resumed as --mode full (allowed: any mode resumes any mode's checkpoint): still hotline's parameters
    rc, out, err = run_cli("train", "--data", tiny_data, "--out", hot, "--steps", 20, "--resume", *RUN)
    assert rc == 0, err
    assert summary(hot)["mode"] == "full"
    says_not_exact(hot, out, [HOTLINE_NOT_EXACT])


def test_init_from_store_says_it_is_not_exact_and_a_resume_keeps_it(run_cli, tiny_data, tmp_path):
    disk = ("--mode", "lookahead", "--store", "disk", "--store-dir", tmp_path / "store")
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "a", "--steps", 10, *disk, *RUN)
    assert rc == 0, err
    assert summary(tmp_path / "a")["exact"] is True

    b = tmp_path / "b"
    rc, out, err = run_cli("train", "--data", tiny_data, "--out", b, "--steps", 10, *disk, "--init-from-store", *RUN)
    assert rc == 0, err
    says_not_exact(b, out, [INIT_FROM_STORE_NOT_EXACT])
    assert INIT_FROM_STORE_NOT_EXACT == "init-from-store: started from the store's tables, not the seed's"

    # resumed without --init-from-store (its checkpoint holds the rows): still started from the store's tables
    rc, out, err = run_cli("train", "--data", tiny_data, "--out", b, "--steps", 20, *disk, "--resume", *RUN)
    assert rc == 0, err
    says_not_exact(b, out, [INIT_FROM_STORE_NOT_EXACT])


# -- a config file with a byte-order mark ------------------------------------------------


def test_a_config_file_with_a_byte_order_mark_and_crlf_is_read(run_cli, tiny_data, tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_bytes(b"\xef\xbb\xbfsteps = 3\r\n\r\n[data]\r\nbatch_size = 32\r\n")
    out = tmp_path / "r"
    rc, _, err = run_cli("train", "--config", conf, "--data", tiny_data, "--out", out, "--no-progress")
    assert rc == 0, err
    s = summary(out)
    assert s["steps"] == 3 and s["batch_size"] == 32

    conf.write_bytes(b"\xef\xbb\xbfsteps = 3\r\n# \xff\r\n")  # not UTF-8 at byte 16 of the file (the mark counted)
    rc, _, err = run_cli("train", "--config", conf, "--data", tiny_data, "--out", tmp_path / "r2")
    assert rc == 2 and err.strip() == (
        f"bagpipe train: error: {conf}: not UTF-8 text (byte 16); a TOML file must be UTF-8"
    )


# -- eval --max-samples ------------------------------------------------------------------


def test_eval_max_samples_zero_is_all_as_the_help_says(run_cli, tiny_data, tmp_path):
    out = tmp_path / "r"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, "--steps", 3, *RUN)
    assert rc == 0, err
    rc, help_text, _ = run_cli("eval", "--help")
    assert rc == 0 and "0, the default: all of them" in " ".join(help_text.split())
    evals = {}
    for n in (None, 0, 100):
        rc, stdout, err = run_cli(
            "eval", "--run", out, "--data", tiny_data, "--json", *(() if n is None else ("--max-samples", n))
        )
        assert rc == 0, err
        evals[n] = json.loads(stdout)
    assert evals[0] == evals[None] and evals[0]["eval_samples"] == 2400 and evals[100]["eval_samples"] == 100
    rc, _, err = run_cli("eval", "--run", out, "--data", tiny_data, "--max-samples", -1)
    assert rc == 2 and "argument --max-samples: must be an integer >= 0, got -1" in err


# -- train --out on a full disk ----------------------------------------------------------


def test_train_on_a_full_disk_names_the_file(run_cli, tiny_data, tmp_path, small_disk):
    disk = small_disk(tmp_path / "disk", "256k")
    small_disk.fill(disk)
    out = disk / "run"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, "--steps", 3, *RUN)
    assert rc == 2 and err.strip().splitlines() == [
        f"bagpipe train: error: cannot write {out}/.lock (No space left on device); "
        "free some space or choose another path"
    ]
    assert not out.exists()  # the folder it made is removed


def test_the_heartbeat_on_a_full_disk_names_its_file(tmp_path, monkeypatch):
    from bagpipe.train.rundir import RunDir

    run = RunDir(tmp_path / "r")
    run.create()

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OSError) as e:
        run.heartbeat(1)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "r" / ".step")


# -- model.predict ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tiny_data, tmp_path_factory):
    """A run of 10 steps and its export inside the run folder (RUN/exp)."""
    from bagpipe.cli import main

    run = tmp_path_factory.mktemp("predict") / "run"
    assert main(["train", "--data", tiny_data, "--out", str(run), "--steps", "10", *map(str, RUN)]) == 0
    assert main(["export", "--run", str(run), "--out", str(run / "exp")]) == 0
    return run


def test_predict_of_no_sample_is_an_empty_array_and_float_ids_are_not_truncated(exported, tiny_data):
    import bagpipe
    from bagpipe.errors import DataError

    model = bagpipe.load(exported / "exp")
    dense_n, f = len(model.dense_names), len(model.features)
    empty = model.predict(np.zeros((0, dense_n)), np.zeros((0, f), int))
    assert empty.shape == (0,) and empty.dtype == np.float32
    assert model.predict(np.zeros((0, dense_n)), np.zeros((0, f))).shape == (
        0,
    )  # an empty float array holds no fraction

    ids = np.ones((2, f), np.int64)  # id 1 is in every table
    dense = np.zeros((2, dense_n), np.float32)
    p = model.predict(dense, ids)
    assert p.shape == (2,) and p.dtype == np.float32
    assert np.array_equal(model.predict(dense, ids.astype(np.float64)), p)  # 1.0 is id 1
    for bad, shown in ((1.9, "1.9"), (np.nan, "nan"), (np.inf, "inf")):
        floats = ids.astype(np.float64)
        floats[1, 2] = bad
        with pytest.raises(DataError) as e:
            model.predict(dense, floats)
        assert str(e.value) == (
            f"ids must be integers: got {shown} at (1, 2) (a float id is not truncated; give whole numbers)"
        )
    with pytest.raises(DataError, match=r"^ids must be integers, got an array of <U1$"):
        model.predict(dense, np.full((2, f), "1"))
    # round 12: a NaN dense value gave a NaN probability without a word; one sample given
    # as 1-D arrays was told shapes counted along the wrong axis
    nan_dense = dense.copy()
    nan_dense[1, 0] = np.nan
    with pytest.raises(DataError) as e:
        model.predict(nan_dense, ids)
    assert str(e.value) == (
        f"dense must be finite: got nan at (1, 0), feature {model.dense_names[0]} (1 of its {dense.size} values are not); "
        "transform missing values as the training data did"
    )
    from bagpipe.errors import ConfigError

    with pytest.raises(ConfigError) as shape:
        model.predict(dense[0], ids[0])
    assert str(shape.value) == (
        f"expected dense (B, {dense_n}) and ids (B, {f}) for B samples, got ({dense_n},) and ({f},) "
        "(one sample is dense[None], ids[None])"
    )
    assert model.predict(dense[0][None], ids[0][None]) == pytest.approx(p[:1])


# -- export --out inside the run folder --------------------------------------------------


def test_an_export_inside_the_run_folder_is_left_alone_by_a_resume(exported, tiny_data, run_cli):
    exp = exported / "exp"
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in exp.rglob("*") if p.is_file()}
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", exported, "--steps", 20, "--resume", *RUN)
    assert rc == 0, err
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in exp.rglob("*") if p.is_file()} == before
    rc, _, err = run_cli("eval", "--run", exported, "--data", tiny_data)
    assert rc == 0, err


# -- --server-memory-budget-mb above the cgroup's limit ------------------------------------


def test_server_memory_budget_above_the_cgroup_is_said_once_by_plan_and_train(
    run_cli, tiny_data, tmp_path, monkeypatch
):
    import bagpipe.budget.cgroup as cgroup
    import bagpipe.budget.sizing as sizing
    import bagpipe.distributed.launch as launch
    from bagpipe.budget.estimate import MIB
    from bagpipe.errors import ConfigError

    limit = (100_000 * MIB, "cgroup v1 /x")
    monkeypatch.setattr(sizing, "own_limit", lambda: limit)
    monkeypatch.setattr(cgroup, "own_limit", lambda: limit)
    warning = (
        "--server-memory-budget-mb 200000 is more than the memory cgroup's limit, 100,000 MiB (cgroup v1 /x): "
        "each embedding server is sized to the cgroup's limit"
    )
    job = ("--data", tiny_data, "--mode", "lookahead", "--trainers", 2, "--servers", 1, "--batch-size", 128)
    args = (*job, "--server-memory-budget-mb", 200000, "--steps", 2)
    rc, out, err = run_cli("plan", *args)
    assert rc == 0 and out.count(warning) == 1, out + err

    def stop(cfg, run, placement):  # the job's roles are not started: its checks are what is tested
        raise ConfigError("the roles would start here")

    monkeypatch.setattr(launch, "_run_job", stop)
    rc, out, err = run_cli("train", *args, "--no-progress", "--out", tmp_path / "r")
    assert rc == 2 and err.strip() == "bagpipe train: error: the roles would start here"
    assert out.count(warning) == 1, out
    rc, out, _ = run_cli("plan", *job, "--server-memory-budget-mb", 500, "--steps", 2)
    assert rc == 0 and "--server-memory-budget-mb" not in out  # below the limit: nothing to say
