"""The twelfth newcomer round's findings on resuming and evaluating, each said as ``train`` says it.

* ``bagpipe plan ... --resume`` exited 0 for a resume that ``train`` refuses (no
  checkpoint in the folder, a run already complete, a changed seed, ...): it makes
  train's own resume checks, which only read, and refuses in train's words with train's
  exit status, nothing in the run folder changed; ``--resume-from`` is checked but
  LATEST is left to train.
* ``--eval-samples N`` on a data set without an eval split was ignored without a word:
  it is said once, as ``--eval-every`` is.
* A run resumed exactly at an epoch's end did not say that the next epoch begins: it says
  it, as an uninterrupted run does.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from bagpipe.data.synthetic import SynthConfig, generate

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

RUN = ("--batch-size", 64, "--no-progress", "--threads", 1)


def state_of(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file and folder under ``folder`` (the lock and heartbeat too): its bytes'
    sha256 and its mtime -- what changes when anything is written."""
    return {
        str(p.relative_to(folder)): (
            hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "",
            p.stat().st_mtime_ns,
        )
        for p in sorted(folder.rglob("*"))
    }


@pytest.fixture(scope="module")
def checkpointed(tiny_data, tmp_path_factory) -> Path:
    """A 20-step run with checkpoints at steps 10 and 20, made once (tests copy it)."""
    from bagpipe.cli import main

    out = tmp_path_factory.mktemp("resumable") / "run"
    argv = [
        "train",
        "--data",
        tiny_data,
        *map(str, RUN),
        "--steps",
        "20",
        "--checkpoint-every",
        "10",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    return out


@pytest.fixture
def run_copy(checkpointed, tmp_path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(checkpointed, dest)
    return dest


def _records_only(run_cli, tiny_data, out: Path) -> None:
    rc, _, err = run_cli("train", "--data", tiny_data, *RUN, "--steps", 5, "--no-final-checkpoint", "--out", out)
    assert rc == 0, err


def _damaged_latest(run: Path) -> None:
    dense = run / "checkpoints" / "step-00000020" / "dense.pt"
    raw = bytearray(dense.read_bytes())
    raw[-1] ^= 0xFF
    dense.write_bytes(bytes(raw))


# -- plan --resume refuses what train --resume refuses ---------------------------------------


@pytest.mark.parametrize(
    ("case", "extra", "said"),
    [
        ("records only", ("--steps", 30), "saved no checkpoint (it has only its records); it cannot be continued"),
        ("no folder", ("--steps", 30), "--resume given but there is no checkpoint in this folder"),
        ("complete", ("--steps", 20), "is complete: its checkpoint is at step 20 and --steps is 20"),
        ("seed", ("--steps", 30, "--seed", 5), "seed was 0, now 5"),
        ("no such step", ("--steps", 30, "--resume-from", 7), "--resume-from 7: "),
        ("damaged", ("--steps", 30), "the previous intact checkpoint is step 10"),
    ],
)
def test_plan_refuses_a_resume_train_refuses_in_its_words(run_cli, tiny_data, run_copy, tmp_path, case, extra, said):
    out = run_copy
    if case == "records only":
        out = tmp_path / "records"
        _records_only(run_cli, tiny_data, out)
    elif case == "no folder":
        out = tmp_path / "none"
    elif case == "damaged":
        _damaged_latest(run_copy)
    before = state_of(out) if out.exists() else None
    resume = () if "--resume-from" in extra else ("--resume",)
    argv = ("--data", tiny_data, *RUN, *extra, *resume, "--out", out)
    rc, stdout, err = run_cli("plan", *argv)
    assert rc == 2 and stdout == "" and err.startswith("bagpipe plan: error: ") and err.count("\n") == 1, err
    assert said in err, err
    # nothing of the run folder changed (not made where there was none), not even its lock
    assert (state_of(out) if out.exists() else None) == before
    rc_train, _, train_err = run_cli("train", *argv)
    assert rc_train == rc and err.removeprefix("bagpipe plan") == train_err.removeprefix("bagpipe train")


def test_plan_checks_resume_from_but_leaves_latest_to_train(run_cli, tiny_data, run_copy):
    before = state_of(run_copy)
    argv = ("--data", tiny_data, *RUN, "--steps", 30, "--resume-from", 10, "--out", run_copy)
    rc, stdout, err = run_cli("plan", *argv)
    assert rc == 0 and "estimate of the trainer's peak" in stdout, err
    assert state_of(run_copy) == before  # LATEST still names step 20
    assert (run_copy / "checkpoints" / "LATEST").read_text() == "step-00000020\n"
    # a resume train takes, plan passes: a longer run from the latest checkpoint
    rc, _, err = run_cli("plan", "--data", tiny_data, *RUN, "--steps", 30, "--resume", "--out", run_copy)
    assert rc == 0, err
    assert state_of(run_copy) == before


def test_plan_resume_needs_out(run_cli, tiny_data):
    rc, stdout, err = run_cli("plan", "--data", tiny_data, *RUN, "--steps", 30, "--resume")
    assert (
        rc == 2
        and stdout == ""
        and err
        == (
            "bagpipe plan: error: --resume needs --out, the run folder to continue (train requires it): plan checks "
            "the run there as train does\n"
        )
    )


def test_plan_help_promises_the_resume_checks(run_cli):
    rc, stdout, _ = run_cli("plan", "--help")
    text = " ".join(stdout.split())
    assert rc == 0 and "With --resume (or --resume-from) it makes train's resume checks" in text
    assert "reads the checkpoint's files" in text


# -- --eval-samples without an eval split: said once -----------------------------------------


@pytest.fixture(scope="module")
def no_eval(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("noeval") / "noeval"
    generate(SynthConfig(profile="tiny", samples=600, seed=1, eval_fraction=0.0), data, progress=False)
    return data


def test_eval_samples_without_an_eval_split_says_so_once(run_cli, no_eval, tmp_path):
    rc, out, err = run_cli(
        "train", "--data", no_eval, *RUN, "--steps", 6, "--eval-samples", 100, "--out", tmp_path / "a"
    )
    assert rc == 0, err
    said = [line for line in (out + err).splitlines() if "eval split" in line]
    assert said == [f"{no_eval} has no eval split, so --eval-samples 100 evaluates nothing"], out + err
    # with --eval-every too: one line, at the first evaluation, naming both
    rc, out, err = run_cli(
        "train", "--data", no_eval, *RUN, "--steps", 6, "--eval-every", 2, "--eval-samples", 100, "--out", tmp_path / "b"
    )  # fmt: skip
    assert rc == 0, err
    said = [line for line in (out + err).splitlines() if "eval split" in line]
    assert said == [
        f"step 2: {no_eval} has no eval split, so --eval-every and --eval-samples 100 evaluate nothing (said once)"
    ], out + err
    # neither option given: the summary's n/a says it, no note
    rc, out, err = run_cli("train", "--data", no_eval, *RUN, "--steps", 6, "--out", tmp_path / "c")
    assert rc == 0 and "eval split" not in out + err, out + err


# -- a run resumed at an epoch's end says the next one begins --------------------------------


def test_a_run_resumed_at_an_epochs_end_says_the_next_epoch_begins(run_cli, no_eval, tmp_path):
    # 600 samples, all train: 9 batches of 64 an epoch
    out = tmp_path / "ep"
    rc, stdout, err = run_cli("train", "--data", no_eval, *RUN, "--epochs", 1, "--out", out)
    assert rc == 0 and "begins at step" not in stdout + err, err
    rc, stdout, err = run_cli("train", "--data", no_eval, *RUN, "--epochs", 3, "--resume", "--out", out)
    assert rc == 0, err
    said = [line for line in (stdout + err).splitlines() if "begins at step" in line]
    # as the uninterrupted --epochs 3 run says them
    assert said == [
        "epoch 2 begins at step 10 (the train split holds 9 batches; each epoch reshuffles its blocks)",
        "epoch 3 of 3 begins at step 19",
    ], stdout + err
    rc, stdout, err = run_cli("train", "--data", no_eval, *RUN, "--epochs", 3, "--out", tmp_path / "whole")
    assert said == [line for line in (stdout + err).splitlines() if "begins at step" in line]
