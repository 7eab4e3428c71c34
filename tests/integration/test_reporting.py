"""What a run reports beyond its loss: the eval figures, TensorBoard scalars, ``bagpipe plot``.

* Normalized entropy, calibration and accuracy on a hand-computed example (and their
  undefined cases: NaN, never a crash).
* A run with ``--eval-every`` writes every figure into each eval record of
  metrics.jsonl, the summary and the eval note of the progress line; ``bagpipe eval``
  prints the same figures.
* ``--tensorboard DIR`` writes the same records as TensorBoard scalars (skipped when the
  optional tensorboard package is absent; its absence is then a one-line error).
* ``bagpipe plot RUN RUN`` writes a PNG of both runs' curves; a folder without
  metrics.jsonl is a one-line error.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from bagpipe.train.metrics import accuracy, calibration, log_loss, normalized_entropy

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

FIGURES = ("eval_logloss", "eval_auc", "eval_ne", "eval_calibration", "eval_accuracy")
RUN = ("--steps", 40, "--batch-size", 128, "--no-progress", "--eval-samples", 1000)


def test_figures_by_hand():
    y = np.array([1, 0, 0, 0])
    p = np.array([0.5, 0.5, 0.25, 0.25])
    # log loss = -(log 0.5 + log 0.5 + 2 log 0.75) / 4; the base CTR 1/4 has entropy
    # -(0.25 log 0.25 + 0.75 log 0.75)
    ll = -(2 * math.log(0.5) + 2 * math.log(0.75)) / 4
    assert log_loss(y, p) == pytest.approx(ll)
    assert normalized_entropy(y, p) == pytest.approx(ll / -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    assert calibration(y, p) == pytest.approx(1.5 / 1.0)  # predicted clicks 1.5, observed 1
    assert accuracy(y, p) == 0.75  # 0.5 is not above the threshold: predicted 0, wrong for the click
    assert math.isnan(normalized_entropy(np.zeros(3), np.full(3, 0.1)))
    assert math.isnan(calibration(np.zeros(3), np.full(3, 0.1)))


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_runs(tiny_data, tmp_path_factory):
    from bagpipe.cli import main

    root = tmp_path_factory.mktemp("reporting")
    for name, opt in (("adagrad", "adagrad"), ("adam", "adam")):
        assert (
            main(
                [
                    "train",
                    "--data",
                    tiny_data,
                    "--out",
                    str(root / name),
                    "--optimizer",
                    opt,
                    "--lr",
                    "0.01",
                    "--eval-every",
                    "20",
                    *map(str, RUN),
                ]
            )
            == 0
        )
    return root / "adagrad", root / "adam"


def test_every_figure_in_metrics_summary_and_eval(two_runs, run_cli, tiny_data):
    run = two_runs[1]
    evals = [r for r in records(run) if "eval_auc" in r]
    assert [r["step"] for r in evals] == [20, 40]
    s = json.loads((run / "summary.json").read_text())
    for key in FIGURES:
        assert all(isinstance(r[key], float) for r in evals), key
        assert s[key] == evals[-1][key], key
    assert 0 < s["eval_ne"] < 1.05 and 0.5 < s["eval_calibration"] < 2 and 0.5 < s["eval_accuracy"] <= 1
    rc, stdout, err = run_cli("eval", "--run", run, "--data", tiny_data, "--max-samples", 1000)
    assert rc == 0, err
    assert (
        f"NE {s['eval_ne']:.4f}, calibration {s['eval_calibration']:.3f}, accuracy {s['eval_accuracy']:.4f}" in stdout
    )


def test_the_eval_note_shows_every_figure(tiny_data, tmp_path, caplog):
    from bagpipe.config.train import TrainConfig
    from bagpipe.train.loop import train
    from bagpipe.train.topology import SingleProcess

    class Lines(SingleProcess):
        def progress_kind(self, progress):
            return "lines"

    caplog.set_level("INFO", logger="bagpipe")
    train(
        TrainConfig.of(
            data=tiny_data, out=str(tmp_path / "r"), steps=20, batch_size=128, eval_every=10, eval_samples=500
        ),
        topology=Lines(),
    )
    lines = [r.getMessage() for r in caplog.records]
    note = [x for x in lines if x.startswith("step 10: ")]
    assert len(note) == 1 and all(
        k in note[0] for k in ("eval logloss", "eval AUC", "NE", "calibration", "accuracy")
    ), lines


def test_tensorboard_scalars(tiny_data, tmp_path, run_cli):
    args = (
        "train",
        "--data",
        tiny_data,
        "--out",
        tmp_path / "r",
        "--eval-every",
        20,
        "--tensorboard",
        tmp_path / "tb",
        *RUN,
    )
    if importlib.util.find_spec("tensorboard") is None:
        rc, _, err = run_cli(*args)
        assert rc == 2 and "--tensorboard needs the tensorboard package" in err
        pytest.skip("tensorboard is not installed (pip install 'bagpipe[tensorboard]'); checked its one-line error")
    rc, _, err = run_cli(*args)
    assert rc == 0, err
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {
        "train/loss",
        "train/lr",
        "train/embedding_lr",
        "train/samples_per_s",
        "eval/logloss",
        "eval/auc",
        "eval/ne",
        "eval/calibration",
        "eval/accuracy",
    } <= tags
    auc = {e.step: e.value for e in acc.Scalars("eval/auc")}
    want = {r["step"]: r["eval_auc"] for r in records(tmp_path / "r") if "eval_auc" in r}
    assert auc.keys() == want.keys() and all(auc[k] == pytest.approx(want[k], rel=1e-6) for k in want)


def test_plot_two_runs(two_runs, run_cli, tmp_path):
    rc, stdout, err = run_cli(
        "plot", *two_runs, "--labels", "adagrad", "adam", "--title", "optimizers", "--out", tmp_path / "c.png"
    )
    assert rc == 0, err
    png = (tmp_path / "c.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    rc, _, err = run_cli("plot", tmp_path, "--out", tmp_path / "x.png")
    assert rc == 2 and "no metrics.jsonl" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run_cli("plot", *two_runs, "--labels", "one", "--out", tmp_path / "x.png")
    assert rc == 2 and "1 labels for 2 runs" in err


def test_summary_json_is_the_documented_schema(two_runs):
    """summary.json holds exactly the fields of bagpipe.train.summary.Summary, each section its dataclass's."""
    from dataclasses import fields

    from bagpipe.train.summary import StepTimes, Summary

    s = json.loads((two_runs[1] / "summary.json").read_text())
    assert list(s) == [f.name for f in fields(Summary)]
    assert list(s["time_per_step_ms"]) == [f.name for f in fields(StepTimes)]
