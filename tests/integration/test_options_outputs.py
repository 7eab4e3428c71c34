"""Options and outputs that used to be ignored or misused without a word.

What this proves, each case through ``bagpipe.cli.main`` with its exact message:

* ``--summary-json PATH`` is refused before training, in one line, when PATH is a folder,
  lies under a file, lies inside --out other than RUN/summary.json (one of the run's own
  files, config.json or a checkpoint's, even before it exists: the run's files stay as
  they were), or is an existing file that is not this run's (another run's summary.json:
  its bytes stay as they were); nothing is written (no run folder, no
  temporary file); a resumed run may replace the summary its earlier start wrote there;
* options that change nothing are refused naming why: ``--secret-file`` on one process,
  ``--no-deterministic`` on the CPU, ``--lr-schedule warmup-poly`` with neither warm-up
  nor decay (a constant rate);
* a malformed ``LOCAL_RANK`` is one line naming the variable and its value;
* ``bagpipe eval`` on a data set without an eval split is one line (exit 2) saying so
  and how to make one, rather than exit 0 having evaluated nothing;
* :func:`bagpipe.files.atomic_write_bytes` leaves no temporary file when the rename fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

COMMON = ("--steps", 4, "--batch-size", 64, "--no-progress", "--threads", 1, "--eval-samples", 64)


def assert_one_line_error(rc: int, stderr: str, *fragments: str) -> None:
    lines = stderr.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in stderr, stderr
    assert ": error: " in lines[0], stderr
    for f in fragments:
        assert f in lines[0], (f, stderr)


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# -- --summary-json ------------------------------------------------------------------------


@pytest.mark.integration
def test_summary_json_at_a_folder_is_refused_before_training(run_cli, tiny_data, tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "kept.txt").write_text("mine")
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "run", *COMMON, "--summary-json", folder)
    assert_one_line_error(rc, err, f"--summary-json {folder}: is a directory; give the file to write")
    assert not (tmp_path / "run").exists()  # nothing trained, no run folder
    assert listing(tmp_path) == ["results", "results/kept.txt"]  # no temporary file anywhere


@pytest.mark.integration
def test_summary_json_at_another_runs_summary_is_refused_and_kept(run_cli, tiny_data, tmp_path):
    other = tmp_path / "other" / "summary.json"
    other.parent.mkdir()
    other.write_text(json.dumps({"steps": 1000, "params_sha256": "abc"}))
    before = other.read_bytes()
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "run", *COMMON, "--summary-json", other)
    assert_one_line_error(
        rc, err, f"--summary-json {other}: the file exists and is not this run's summary", "choose a new path"
    )
    assert other.read_bytes() == before
    assert not (tmp_path / "run").exists()
    assert listing(tmp_path) == ["other", "other/summary.json"]


@pytest.mark.integration
def test_summary_json_under_a_file_is_refused(run_cli, tiny_data, tmp_path):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine")
    target = blocker / "s.json"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "run", *COMMON, "--summary-json", target)
    assert_one_line_error(rc, err, f"--summary-json {target}: {blocker} is a file, not a folder")
    assert blocker.read_text() == "mine" and not (tmp_path / "run").exists()


@pytest.mark.integration
def test_summary_json_a_resumed_run_replaces_its_own(run_cli, tiny_data, tmp_path):
    run, summary = tmp_path / "run", tmp_path / "out" / "s.json"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", run, *COMMON, "--summary-json", summary)
    assert rc == 0, err
    assert json.loads(summary.read_text())["steps"] == 4
    common = [a for a in COMMON]
    common[1] = 8
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", run, *common, "--resume", "--summary-json", summary)
    assert rc == 0, err
    assert json.loads(summary.read_text())["steps"] == 8
    assert summary.read_bytes() == (run / "summary.json").read_bytes()
    assert listing(summary.parent) == ["s.json"]
    # the run's own RUN/summary.json may be named too
    rc, _, err = run_cli(
        "train", "--data", tiny_data, "--out", tmp_path / "r2", *COMMON, "--summary-json", run / "summary.json"
    )
    assert_one_line_error(rc, err, "is not this run's summary")


@pytest.mark.integration
@pytest.mark.parametrize("inside", ["config.json", "metrics.jsonl", "checkpoints/LATEST", "s.json", "."])
def test_summary_json_inside_the_new_run_folder_is_refused(run_cli, tiny_data, tmp_path, inside):
    run = tmp_path / "run"
    target = run / inside
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", run, *COMMON, "--summary-json", target)
    assert_one_line_error(
        rc,
        err,
        f"--summary-json {target}: lies inside --out {run}, among the files the run writes (config.json, "
        f"metrics.jsonl, checkpoints/), and would replace one: leave --summary-json out (the run writes "
        f"{run / 'summary.json'}) or choose a path outside --out",
    )
    assert listing(tmp_path) == []  # nothing trained, no run folder


@pytest.mark.integration
def test_summary_json_at_a_resumed_runs_own_file_is_refused_and_the_run_kept(run_cli, tiny_data, tmp_path):
    run = tmp_path / "run"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", run, *COMMON, "--summary-json", run / "summary.json")
    assert rc == 0, err  # RUN/summary.json itself may be named
    before = {p: (run / p).read_bytes() for p in listing(run) if (run / p).is_file()}
    for inside in ("config.json", "checkpoints/LATEST"):
        rc, _, err = run_cli(
            "train", "--data", tiny_data, "--out", run, *COMMON, "--resume", "--summary-json", run / inside
        )
        assert_one_line_error(rc, err, f"--summary-json {run / inside}: lies inside --out {run}")
    assert {p: (run / p).read_bytes() for p in listing(run) if (run / p).is_file()} == before


@pytest.mark.unit
def test_an_atomic_write_that_cannot_rename_leaves_no_temporary_file(tmp_path):
    from bagpipe.files import atomic_write_text

    (tmp_path / "d").mkdir()
    with pytest.raises(OSError):
        atomic_write_text(tmp_path / "d", "{}")
    assert listing(tmp_path) == ["d"]


# -- options that would change nothing ------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(
    "args,fragments",
    [
        (
            ["--secret-file", "job.secret"],
            ["--secret-file applies to distributed runs (--trainers N --servers S), not one process"],
        ),
        (
            ["--no-deterministic"],
            ["--no-deterministic applies to --device cuda", "on --device cpu every run is deterministic already"],
        ),
        (
            ["--lr-schedule", "warmup-poly"],
            [
                "--lr-schedule warmup-poly without --lr-warmup-steps W or --lr-decay-steps N keeps the rate constant",
                "drop --lr-schedule",
            ],
        ),
    ],
    ids=["secret-file", "no-deterministic", "warmup-poly"],
)
def test_options_that_would_do_nothing_are_refused_saying_why(run_cli, tiny_data, tmp_path, args, fragments):
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "run", *COMMON, *args)
    assert_one_line_error(rc, err, *fragments)
    assert listing(tmp_path) == []


@pytest.mark.unit
def test_warmup_poly_with_a_warm_up_or_a_decay_is_accepted():
    from bagpipe.config.train import TrainConfig

    TrainConfig.of(data="d", out="o", steps=10, lr_schedule="warmup-poly", lr_warmup_steps=5)
    TrainConfig.of(data="d", out="o", steps=10, lr_schedule="warmup-poly", lr_decay_steps=5)


# -- LOCAL_RANK -----------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("value", ["x", "-1", "1.5"])
def test_a_malformed_local_rank_names_the_variable(value):
    from bagpipe.device.placement import local_rank
    from bagpipe.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"environment variable LOCAL_RANK must be an integer .*got '?{value}'?"):
        local_rank({"LOCAL_RANK": value})
    assert local_rank({}) == 0 and local_rank({"LOCAL_RANK": "3"}) == 3


@pytest.mark.integration
def test_a_role_with_local_rank_x_is_one_line(run_cli, tiny_data, tmp_path, monkeypatch):
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "RANK": "0", "WORLD_SIZE": "3"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LOCAL_RANK", "x")
    rc, _, err = run_cli(
        "worker", "--data", tiny_data, "--out", tmp_path / "run", *COMMON,
        "--mode", "lookahead", "--trainers", 1, "--servers", 1,
    )  # fmt: skip
    assert_one_line_error(rc, err, "environment variable LOCAL_RANK must be an integer in [0, ", "got 'x'")
    assert not (tmp_path / "run").exists()


# -- eval without an eval split -------------------------------------------------------------


@pytest.mark.integration
def test_eval_on_a_data_set_without_an_eval_split_is_refused(run_cli, tmp_path):
    from bagpipe.data.synthetic import SynthConfig, generate

    data = tmp_path / "data"
    generate(SynthConfig(profile="tiny", samples=2000, seed=1, eval_fraction=0.0), data, progress=False)
    run = tmp_path / "run"
    rc, _, err = run_cli("train", "--data", data, "--out", run, "--steps", 3, "--batch-size", 64, "--no-progress")
    assert rc == 0, err
    before = listing(tmp_path)
    rc, out, err = run_cli("eval", "--run", run, "--data", data)
    assert_one_line_error(
        rc, err, f"{data} has no eval split (its splits: train 2,000)", "nothing to evaluate", "--split 0 --vocab-from"
    )
    assert out == "" and listing(tmp_path) == before


DIST = ("--mode", "lookahead", "--trainers", 1, "--servers", 1)


@pytest.mark.integration
def test_a_hand_started_role_makes_trains_output_checks(run_cli, tiny_data, tmp_path):
    # `bagpipe worker` started by hand (torchrun, a scheduler) checks --out and --summary-json as
    # `bagpipe train` does before launching its roles: before joining any rendezvous
    run = tmp_path / "run"
    target = run / "config.json"
    rc, _, err = run_cli("worker", "--data", tiny_data, "--out", run, *COMMON, *DIST, "--summary-json", target)
    assert_one_line_error(rc, err, f"--summary-json {target}: lies inside --out {run}")
    assert listing(tmp_path) == []
    rc, _, err = run_cli("worker", "--data", tiny_data, "--out", tiny_data, *COMMON, *DIST)
    assert rc == 2 and "Traceback" not in err and "--out" in err


@pytest.mark.integration
def test_resume_compares_settings_derived_from_others_by_their_effective_value(run_cli, tiny_data, tmp_path):
    # a run started without --embedding-dim (the debug recipe's D = 8) resumes with --embedding-dim 8
    # and --embedding-lr equal to its --lr; another D is refused, naming it
    run = tmp_path / "run"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", run, *COMMON, "--checkpoint-every", 2)
    assert rc == 0, err
    more = ("--steps", 6, "--batch-size", 64, "--no-progress", "--threads", 1, "--eval-samples", 64)
    rc, _, err = run_cli(
        "train", "--data", tiny_data, "--out", run, *more, "--resume", "--embedding-dim", 16, "--checkpoint-every", 2
    )
    assert_one_line_error(rc, err, f"cannot resume {run}: embedding_dim was 8, now 16")
    rc, _, err = run_cli(
        "train", "--data", tiny_data, "--out", run, *more, "--resume", "--embedding-dim", 8, "--embedding-lr", 0.05
    )
    assert rc == 0, err
