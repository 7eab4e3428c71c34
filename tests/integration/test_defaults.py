"""What `bagpipe train` does when the user gives little: the run's length, its epoch lines,
the recipes' learning rates, and options a one-process run does not read.

What this proves:

* without ``--steps``, a run trains one epoch of the train split (train samples //
  batch size steps); ``--epochs E`` trains E of them; bad values of ``--epochs``
  (0, -1, text) and ``--epochs`` with ``--steps`` are refused in one line;
* a run of many short epochs notes a handful of "epoch N begins" lines (the second
  epoch's, saying how many epochs there are and which are noted, then every k-th), not
  one per epoch;
* ``--no-spares`` (like every distributed setting) given to a one-process run is refused
  in one line, not silently ignored;
* the ``kaggle`` recipe's own learning rate trains the real Criteo sample
  (``../shared/data``; skipped when absent) without the loss spike of the former
  default (``--lr 0.05``: a step's loss in the thousands), and a run that gives ``--lr``
  keeps it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from repo import SHARED_DATA

from bagpipe.config.train import TrainConfig

CRITEO = SHARED_DATA / "criteo" / "kaggle_train_head10k.tsv"
QUIET = ("--no-progress", "--threads", "1", "--no-digest", "--no-final-checkpoint")


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> str:
    """300 samples: 270 train, so batches of 64 make 4 batches an epoch."""
    from bagpipe.data.synthetic import SynthConfig, generate

    out = tmp_path_factory.mktemp("defaults") / "small"
    generate(SynthConfig(profile="tiny", samples=300, seed=3), out, progress=False)
    return str(out)


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def refusal(rc: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, (rc, err)
    return lines[0]


@pytest.mark.integration
def test_a_run_without_steps_trains_one_epoch(run_cli, small_data, tmp_path, caplog):
    train = json.loads((Path(small_data) / "meta.json").read_text())["splits"]["train"]["num_samples"]
    rc, out, err = run_cli("train", "--data", small_data, "--out", tmp_path / "r", "--batch-size", 64, *QUIET)
    assert rc == 0, err
    s = summary(tmp_path / "r")
    assert s["steps"] == train // 64 and s["epochs"] == 1.0
    assert "begins at step" not in out + err + caplog.text  # one epoch: no new one begins
    rc, out, err = run_cli(
        "train", "--data", small_data, "--out", tmp_path / "e", "--batch-size", 64, "--epochs", 3, *QUIET
    )
    assert rc == 0, err
    assert summary(tmp_path / "e")["steps"] == 3 * (train // 64)
    said = [m.getMessage() for m in caplog.records if " begins at step " in m.getMessage()]
    assert said == [
        "epoch 2 begins at step 5 (the train split holds 4 batches; each epoch reshuffles its blocks)",
        "epoch 3 of 3 begins at step 9",
    ]


@pytest.mark.integration
def test_many_short_epochs_print_a_handful_of_lines(run_cli, small_data, tmp_path, caplog):
    # 250 epochs of 4 batches, as the default --steps 1000 gave on the 9,000-line Criteo sample
    rc, out, err = run_cli(
        "train", "--data", small_data, "--out", tmp_path / "r", "--batch-size", 64, "--epochs", 250, *QUIET
    )
    assert rc == 0, err
    lines = [m.getMessage() for m in caplog.records if " begins at step " in m.getMessage()]
    assert lines[0] == (
        "epoch 2 begins at step 5 (the train split holds 4 batches; each epoch reshuffles its blocks; "
        "250 epochs in all, every 50th is noted)"
    )
    assert lines[1:] == [f"epoch {e} of 250 begins at step {4 * (e - 1) + 1}" for e in (50, 100, 150, 200, 250)]
    assert summary(tmp_path / "r")["steps"] == 1000


@pytest.mark.integration
@pytest.mark.parametrize(
    "args,says",
    [
        (("--epochs", 0), "epochs must be >= 1, got 0"),
        (("--steps", 0), "steps must be > 0, got 0 (leave --steps out for one epoch, or give --epochs E)"),
        (("--epochs", -1), "epochs must be >= 1, got -1"),
        (("--epochs", "two"), "--epochs: invalid"),
        (("--epochs", 2, "--steps", 5), "--epochs 2 and --steps 5 both give the run's length: give one of them"),
        (("--batch-size", 1000), "--batch-size 1000 exceeds the 270 samples of the train split"),
        (("--no-spares",), "--no-spares applies to distributed runs (--trainers N --servers S), not one process"),
        (
            ("--checkpoint-compact-every", 0),
            "--checkpoint-compact-every must be >= 1 (1: every checkpoint is full), got 0",
        ),
        (
            ("--steps", 5, "--warmup-steps", 5),
            "--warmup-steps (steps left out of the throughput, not --lr-warmup-steps) must be in [0, --steps), "
            "got 5 with --steps 5",
        ),
        (("--max-restarts", 1), "--max-restarts applies to distributed runs"),
        (
            ("--mode", "lookahead", "--server-memory-budget-mb", 1),
            "--server-memory-budget-mb applies to distributed runs (--trainers N --servers S), not one process",
        ),
    ],
)
def test_what_a_run_cannot_use_is_refused_in_one_line(run_cli, small_data, tmp_path, args, says):
    rc, _, err = run_cli("train", "--data", small_data, "--out", tmp_path / "r", *args, *QUIET)
    assert says in refusal(rc, err)
    assert not (tmp_path / "r").exists()


@pytest.mark.integration
def test_the_kaggle_recipe_trains_the_criteo_sample_without_a_spike(run_cli, tmp_path):
    if not CRITEO.exists():
        pytest.skip(f"the real Criteo sample is not there: {CRITEO}")
    data = tmp_path / "criteo"
    rc, _, err = run_cli("preprocess", "criteo", "--input", CRITEO, "--out", data, "--no-progress")
    assert rc == 0, err
    run = tmp_path / "r"
    rc, _, err = run_cli("train", "--data", data, "--out", run, "--recipe", "kaggle", "--steps", 12, *QUIET)
    assert rc == 0, err
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    # the former default rate (0.05) logged 347 at step 10 (one step of 3,461 in the window)
    assert max(losses.values()) < 0.7 and losses[12] < losses[1], losses
    assert {r["lr"] for r in records if "lr" in r} == {
        TrainConfig.of(data=str(data), out="o", recipe="kaggle").optim.lr
    }
    assert summary(run)["eval_auc"] > 0.6
    # a given --lr is the run's rate, whatever the recipe
    assert TrainConfig.of(data=str(data), out="o", recipe="kaggle", lr=0.05).optim.lr == 0.05


@pytest.mark.integration
def test_the_command_line_run_length_overrides_the_files_other_one(small_data, tmp_path):
    """``--epochs`` on the command line and ``steps`` in the --config file (or the other way
    round): the command line overrides the file, as for every other setting (it was refused
    naming a --steps the user never typed); both on one side stay refused."""
    from bagpipe.config.train import epoch_steps, load_config

    with_steps = tmp_path / "steps.toml"
    with_steps.write_text(f'data = "{small_data}"\nout = "{tmp_path / "r"}"\nbatch_size = 64\nsteps = 3\n')
    cfg = load_config(str(with_steps), {"epochs": 2})
    assert cfg.run.epochs == 2 and cfg.run.steps == 2 * epoch_steps(cfg.data)
    with_epochs = tmp_path / "epochs.toml"
    with_epochs.write_text(f'data = "{small_data}"\nout = "{tmp_path / "r"}"\nbatch_size = 64\nepochs = 2\n')
    cfg = load_config(str(with_epochs), {"steps": 7})
    assert cfg.run.steps == 7 and cfg.run.epochs is None
    assert load_config(str(with_steps), {}).run.steps == 3  # the file alone
    both = tmp_path / "both.toml"
    both.write_text(f'data = "{small_data}"\nout = "{tmp_path / "r"}"\nbatch_size = 64\nepochs = 2\nsteps = 3\n')
    with pytest.raises(Exception, match="both give the run's length"):
        load_config(str(both), {})
