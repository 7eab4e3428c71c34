"""The fourteenth newcomer round's findings on schedules, evaluating and resuming.

* ``--lr-min`` above ``--lr`` or ``--embedding-lr`` was accepted, so the "decay" raised
  the rate: refused in one line naming both values, from a TOML file as from the command
  line (a constant schedule, which reads no floor, is refused as before for that).
* ``eval`` and ``export`` of a run trained with ``--no-final-checkpoint`` used its latest
  checkpoint without saying the run went further: a note on stderr says so (``eval
  --json`` stays JSON on stdout).
* A "complete" refusal named ``--steps`` when the run was given ``--epochs``: it names
  the epochs and their steps. A relative ``data`` in a ``--config`` TOML file, which is
  relative to the working directory, is refused naming the file, the key and that folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bagpipe.config.train import load_config
from bagpipe.errors import ConfigError

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

RUN = ("--batch-size", 64, "--no-progress", "--threads", 1)
STEP_DECAY = ("--lr-schedule", "step", "--lr-warmup-steps", 2, "--lr-decay-start", 10, "--lr-decay-steps", 5)


# -- --lr-min above a base rate ---------------------------------------------------------------


def test_lr_min_above_the_embedding_rate_is_refused_on_the_command_line(run_cli, tiny_data, tmp_path):
    out = tmp_path / "lr"
    argv = ("--data", tiny_data, *RUN, "--steps", 20, *STEP_DECAY, "--out", out)
    rc, _, err = run_cli("train", *argv, "--lr", 0.05, "--embedding-lr", 0.001, "--lr-min", 0.01)
    assert rc == 2 and err.count("\n") == 1, err
    assert (
        "--lr-min 0.01 exceeds --embedding-lr 0.001: the decay's floor would raise the rate, not decay it; "
        "give --lr-min at most 0.001" in err
    ), err
    assert not out.exists()
    rc, _, err = run_cli("train", *argv, "--lr", 0.05, "--embedding-lr", 0.001, "--lr-min", 0.001)
    assert rc == 0, err  # a floor equal to the rate is no raise


def test_lr_min_above_the_rate_is_refused_from_a_toml_file_as_from_the_command_line(tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text(
        'data = "/nonexistent/d"\nout = "o"\nsteps = 5\n[optim]\nlr_schedule = "warmup-poly"\n'
        "lr_decay_start = 1\nlr_decay_steps = 3\nlr_min = 0.5\n"
    )
    said = "--lr-min 0.5 exceeds --lr 0.05, the embedding rows' rate too"
    with pytest.raises(ConfigError, match=said):
        load_config(str(conf), {})
    with pytest.raises(ConfigError, match=said):
        load_config(None, {"data": "/nonexistent/d", "out": "o", "steps": 5, "lr_schedule": "warmup-poly",
                           "lr_decay_start": 1, "lr_decay_steps": 3, "lr_min": 0.5})  # fmt: skip


# -- eval and export of a run whose last steps are in no checkpoint -----------------------------


@pytest.fixture(scope="module")
def no_final(tiny_data, tmp_path_factory) -> Path:
    """A 12-step run with checkpoints at steps 5 and 10 and none at its end."""
    from bagpipe.cli import main

    out = tmp_path_factory.mktemp("nofinal") / "run"
    argv = ["train", "--data", tiny_data, *map(str, RUN), "--steps", "12", "--checkpoint-every", "5"]
    assert main([*argv, "--no-final-checkpoint", "--out", str(out)]) == 0
    return out


def test_eval_of_a_run_without_its_final_checkpoint_says_the_run_went_further(run_cli, tiny_data, no_final):
    note = (
        f"note: {no_final} trained to step 12 (summary.json); its latest checkpoint is step 10 "
        "(--no-final-checkpoint): these figures are step 10's\n"
    )
    rc, out, err = run_cli("eval", "--run", no_final, "--data", tiny_data)
    assert rc == 0 and out.startswith("step 10: ") and err == note, (out, err)
    rc, out, err = run_cli("eval", "--run", no_final, "--data", tiny_data, "--json")
    assert rc == 0 and json.loads(out)["step"] == 10 and err == note, (out, err)


def test_export_of_a_run_without_its_final_checkpoint_says_the_run_went_further(run_cli, tiny_data, no_final, tmp_path):
    rc, out, err = run_cli("export", "--run", no_final, "--data", tiny_data, "--out", tmp_path / "exp")
    assert rc == 0 and out.startswith("exported step 10"), (out, err)
    assert f"note: {no_final} trained to step 12 (summary.json); its latest checkpoint is step 10" in err, err
    assert err.rstrip().endswith("the export is step 10's"), err


def test_eval_of_a_finished_run_adds_no_note(run_cli, tiny_data, tmp_path):
    out = tmp_path / "full"
    assert run_cli("train", "--data", tiny_data, *RUN, "--steps", 5, "--out", out)[0] == 0
    rc, stdout, err = run_cli("eval", "--run", out, "--data", tiny_data, "--json")
    assert rc == 0 and json.loads(stdout)["step"] == 5 and "note:" not in err, err


# -- a complete run given --epochs; a TOML file's relative data ---------------------------------


@pytest.mark.parametrize("command", ["train", "plan"])
def test_a_complete_refusal_names_the_epochs_the_run_was_given(run_cli, tiny_data, tmp_path, command):
    out = tmp_path / "e1"
    argv = ("--data", tiny_data, *RUN, "--epochs", 1, "--out", out)
    assert run_cli("train", *argv)[0] == 0
    steps = json.loads((out / "summary.json").read_text())["steps"]
    rc, _, err = run_cli(command, *argv, "--resume")
    assert rc == 2 and err.count("\n") == 1, err
    assert (
        f"is complete: its checkpoint is at step {steps} and --epochs 1 is {steps} steps; "
        "give a larger --epochs (or --steps) to train further" in err
    ), err
    assert "--steps is" not in err


def test_a_relative_data_path_of_a_toml_file_is_said_with_its_file_and_folder(tmp_path, monkeypatch):
    (tmp_path / "data" / "tiny").mkdir(parents=True)
    conf = tmp_path / "c.toml"
    conf.write_text('data = "data/tiny"\nsteps = 5\nbatch_size = 64\nout = "o"\n')
    sub = tmp_path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)
    with pytest.raises(ConfigError) as e:
        load_config("../c.toml", {})
    said = str(e.value)
    assert said == (
        f'data/tiny: no such dataset directory (data = "data/tiny" in ../c.toml, relative to the working '
        f"directory {sub}, not to the file's folder; ../data/tiny exists: give that path)"
    ), said
    # the command line's --data wins, and is not the file's to explain
    assert load_config("../c.toml", {"data": str(tmp_path / "data" / "tiny")}).data.data.endswith("tiny")
