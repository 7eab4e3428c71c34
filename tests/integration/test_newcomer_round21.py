"""The 21st newcomer round's findings (issue 32), each one line with nothing of the user's
changed:

* a path with a name longer than the file system takes (ENAMETOOLONG), given to any of a
  command's path options, was a traceback from whichever check first looked at it;
* an output that is a loop of symbolic links was a traceback (synth, export: the staging
  folder's rename) or had its link replaced by a regular file (profile --out,
  --summary-json); --tensorboard said the other half of the loop did not exist.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from runs import one_line

pytestmark = pytest.mark.integration

LONG = "x" * 300
TOO_LONG = "a name in it is longer than the file system takes (255 bytes a name, 4,096 a path); give another "
RUN = ("--steps", 2, "--batch-size", 64, "--no-progress")


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(
    "argv",
    [
        ("synth", "--profile", "tiny", "--samples", 100, "--out", "{tmp}/" + LONG),
        ("train", "--data", "{data}", *RUN, "--out", "{tmp}/runs/" + LONG),
        ("train", "--data", "{tmp}/" + LONG, *RUN, "--out", "{tmp}/r"),
        ("train", "--data", "{data}", *RUN, "--out", "{tmp}/r", "--summary-json", "{tmp}/" + LONG),
        ("check", "{tmp}/" + LONG),
        ("eval", "--run", "{tmp}/" + LONG, "--data", "{data}"),
        ("plot", "--out", "{tmp}/" + LONG + ".png", "{tmp}/r"),
        ("profile", "--data", "{tmp}/" + LONG, "--hot-budget-mb", 1, "--out", "{tmp}/h.npz"),
    ],
    ids=["synth-out", "train-out", "train-data", "summary-json", "check", "eval-run", "plot-out", "profile-data"],
)
def test_a_name_too_long_for_the_file_system_is_one_line(run_cli, tiny_data, tmp_path, argv):
    args = [str(a).format(tmp=tmp_path, data=tiny_data) for a in argv]
    before = listing(tmp_path)
    rc, _, err = run_cli(*args)
    line = one_line(rc, err, args[0])
    assert TOO_LONG in line and re.search(r"x{20}\.\.\.\(30\d bytes\)", line), line  # the long name shortened
    assert listing(tmp_path) == before


@pytest.mark.parametrize(
    "argv, flag",
    [
        (("synth", "--profile", "tiny", "--samples", 100, "--out", "{loop}"), "--out"),
        (("export", "--run", "{run}", "--out", "{loop}"), "--out"),
        (("profile", "--data", "{data}", "--hot-budget-mb", 0.01, "--out", "{loop}"), "--out"),
        (("train", "--data", "{data}", *RUN, "--out", "{tmp}/r2", "--summary-json", "{loop}"), "--summary-json"),
        (("train", "--data", "{data}", *RUN, "--out", "{tmp}/r2", "--tensorboard", "{loop}"), "--tensorboard"),
        (
            (
                "train",
                "--data",
                "{data}",
                *RUN,
                "--out",
                "{tmp}/r2",
                "--mode",
                "lookahead",
                "--store",
                "disk",
                "--store-dir",
                "{loop}",
            ),
            "--store-dir",
        ),
    ],  # fmt: skip
    ids=["synth", "export", "profile", "summary-json", "tensorboard", "store-dir"],
)
def test_an_output_that_is_a_loop_of_links_is_one_line_and_the_links_stay(run_cli, tiny_data, tmp_path, argv, flag):
    rc, _, err = run_cli("train", "--data", tiny_data, *RUN, "--out", tmp_path / "run")
    assert rc == 0, err
    loop = tmp_path / "loopa"
    loop.symlink_to("loopb")
    (tmp_path / "loopb").symlink_to("loopa")
    before = listing(tmp_path)
    args = [str(a).format(tmp=tmp_path, data=tiny_data, run=tmp_path / "run", loop=loop) for a in argv]
    rc, _, err = run_cli(*args)
    assert one_line(rc, err, args[0]) == (
        f"{flag} {loop} is a symbolic link that never reaches a file or folder (a loop); remove the link or give "
        f"another {flag}"
    )
    assert listing(tmp_path) == before
    assert os.readlink(loop) == "loopb" and os.readlink(tmp_path / "loopb") == "loopa"


def test_a_resumed_runs_tensorboard_drops_the_steps_after_its_checkpoint(run_cli, tiny_data, tmp_path):
    """Steps an earlier run logged past its last checkpoint are trained again by the resume:
    TensorBoard drew each twice (two samples/s); metrics.jsonl keeps them once."""
    pytest.importorskip("tensorboard", reason="the tensorboard package is an optional extra")
    from tensorboard.backend.event_processing import event_accumulator

    tb, out = tmp_path / "tb", tmp_path / "run"
    common = ("--data", tiny_data, "--batch-size", 64, "--no-progress", "--out", out, "--tensorboard", tb)
    rc, _, err = run_cli("train", *common, "--steps", 30, "--checkpoint-every", 20, "--no-final-checkpoint")
    assert rc == 0, err
    rc, _, err = run_cli("train", *common, "--steps", 40, "--checkpoint-every", 20, "--resume")
    assert rc == 0, err
    acc = event_accumulator.EventAccumulator(str(tb))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("train/loss")]
    assert steps == sorted(set(steps)) and 30 in steps and 40 in steps, steps
    assert all(e.value > 0 for e in acc.Scalars("train/samples_per_s"))


@pytest.mark.parametrize("moved", [("--store", "memory"), ("--mode", "full"), ("--store-dir", "{tmp}/elsewhere")])
def test_a_resume_that_keeps_its_rows_elsewhere_removes_its_old_store(run_cli, tiny_data, tmp_path, caplog, moved):
    """RUN/store stayed behind, stale, after a resume to the memory store, to --mode full or
    to a --store-dir (290 MB in the round); the checkpoints hold the rows. Only a store's
    own files go."""
    run = tmp_path / "run"
    disk = ("--data", tiny_data, "--batch-size", 64, "--no-progress", "--out", run, "--checkpoint-every", 5)
    rc, _, err = run_cli("train", *disk, "--steps", 10, "--mode", "lookahead", "--store", "disk")
    assert rc == 0, err
    assert (run / "store" / "rows.f32").exists()
    (run / "store" / "notes.txt").write_text("mine")
    args = [str(a).format(tmp=tmp_path) for a in moved]
    if "--mode" not in args:
        args += ["--mode", "lookahead"] + (["--store", "disk"] if "--store-dir" in args else [])
    caplog.set_level("INFO")
    rc, _, err = run_cli("train", *disk, "--steps", 15, "--resume", *args)
    assert rc == 0, err
    assert sorted(p.name for p in (run / "store").iterdir()) == ["notes.txt"]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"removed {run / 'store'}")]
    assert len(said) == 1 and "its checkpoints hold them" in said[0], said


def test_plan_suggests_the_frequency_layout_saying_where_the_budget_does_not_hold_it(run_cli, tmp_path):
    """Plan suggested `--store-layout frequency` in a budget where the run with it was
    refused (its count of the split: 4 bytes a table row and a counting batch). The
    default, ``auto``, turns to the identity layout in such a budget, and says so."""
    data = tmp_path / "ck"
    rc, _, err = run_cli("synth", "--profile", "criteo-kaggle", "--scale", 0.05, "--samples", 4000, "--out", data,
                         "--no-progress")  # fmt: skip
    assert rc == 0, err
    job = ("plan", "--data", data, "--mode", "lookahead", "--store", "disk", "--cache-rows", 60000, "--steps", 10)
    rc, out, err = run_cli(*job, "--memory-budget-mb", 360, "--store-layout", "identity")
    assert rc == 0 and "fits: yes" in out, out + err
    [line] = [ln for ln in out.splitlines() if ln.startswith("layout: ")]
    assert line.startswith("layout: identity (--store-layout identity); the identity layout keeps row g")
    assert "; but not in this budget: with it, memory budget 360 MiB (--memory-budget-mb 360) is too small" in line
    assert "store layout" in line and "the smallest budget that works is" in line
    rc, with_it, err = run_cli(*job, "--memory-budget-mb", 360, "--store-layout", "frequency")
    assert rc == 2 and line.split("with it, ")[1] in with_it + err  # the words plan gives the run with it
    rc, out, err = run_cli(*job, "--memory-budget-mb", 2000, "--store-layout", "identity")
    assert rc == 0 and "but not in this budget" not in out and "--store-layout frequency packs" in out, out
    # the default (auto) counts the split for a run of 10 epochs -- unless the budget does not hold the count
    rc, out, err = run_cli(*job, "--memory-budget-mb", 2000)
    [line] = [ln for ln in out.splitlines() if ln.startswith("layout: ")]
    assert rc == 0 and line.startswith("layout: frequency (--store-layout auto: the run trains 10 epochs"), out
    rc, out, err = run_cli(*job, "--memory-budget-mb", 360)
    assert rc == 0 and "fits: yes" in out, out + err
    [line] = [ln for ln in out.splitlines() if ln.startswith("layout: ")]
    assert line.startswith(
        "layout: identity (--store-layout auto: the memory budget does not hold the frequency layout's count"
    ), line
    # and the run does what plan says: identity, the reason in its summary
    run = ("train", *job[1:-2], "--memory-budget-mb", 360, "--out", tmp_path / "run", "--no-progress", "--no-digest")
    rc, _, err = run_cli(*run, "--steps", 3, "--eval-samples", 256)
    assert rc == 0, err
    store = json.loads((tmp_path / "run" / "summary.json").read_text())["cache"]["store"]
    assert store["layout"] == "identity" and "does not hold the frequency layout's count" in store["layout_choice"]
