"""``profile --out`` and ``predict --out`` replace only an earlier output of their own
kind (newcomer round 13, finding 1: a user's raw TSV became a zip archive, or five
probabilities, without a word), as ``plot --out``, ``train --summary-json`` and
``bench --out`` already did.

What this proves:

* **Refused, untouched.** An existing file that is not the command's own earlier output
  -- a raw log, notes, another ``.npz``, a column of 0/1 labels, a file of numbers
  outside [0, 1] -- is refused in one line (exit 2) naming it and what to do, before
  any work (the profiler and the model loader are never called), and its bytes are
  as they were. ``predict --out`` at a hard link of ``--input`` is refused as the input
  itself is (one inode, compared with ``os.path.samefile``).
* **Replaced.** Rerunning the same command over its own earlier output works: a hot-row
  file (also one truncated: the damaged file ``train --hot-rows`` tells to profile
  again), a predictions file (also one of ``nan`` lines from ``--on-error skip``, and an
  empty one); a device (``/dev/null``) is written directly, as before.
* **The tests themselves.** :func:`bagpipe.accel.profile.is_hot_row_file` and
  :func:`bagpipe.export.score.is_predictions_file` on files made by hand: a predictions
  file larger than the 64 KiB they read, a line cut at that boundary, no final line break.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

NOTES = b"label\tI1\tC1\n1\t3\t68fd1e64\n0\t\t05db9164\n"


def criteo_text(n: int, seed: int = 13) -> str:
    rng = np.random.default_rng(seed)
    return "".join(
        "\t".join(
            [str(int(rng.random() < 0.25))]
            + [str(int(rng.integers(0, 500))) for _ in range(13)]
            + [f"{int(rng.integers(0, 40 + 10 * j)):08x}" for j in range(26)]
        )
        + "\n"
        for _ in range(n)
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> dict:
    """An export of a DLRM trained a few steps on preprocessed Criteo lines, and 5 unlabelled lines to score."""
    from bagpipe.cli import main

    root = tmp_path_factory.mktemp("own")
    raw = root / "day.tsv"
    raw.write_text(criteo_text(600))
    data, run, export = root / "data", root / "run", root / "export"
    assert main(["preprocess", "criteo", "--input", str(raw), "--out", str(data), "--no-progress"]) == 0
    train = ["train", "--data", str(data), "--out", str(run), "--steps", "4", "--batch-size", "64"]
    assert main([*train, "--no-progress", "--eval-samples", "64", "--threads", "1"]) == 0
    assert main(["export", "--run", str(run), "--out", str(export)]) == 0
    t5 = root / "t5.tsv"
    t5.write_text("".join(line.split("\t", 1)[1] + "\n" for line in raw.read_text().splitlines()[:5]))
    return {"export": export, "t5": t5}


def refused(result: tuple[int, str, str], command: str, out: Path, what: str) -> None:
    rc, _, err = result
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err == (
        f"bagpipe {command}: error: --out {out}: the file exists and is not {what}; it is not replaced: "
        "choose another --out, or move the file away first\n"
    )


def never_called(*a, **k):
    raise AssertionError("the work began before --out was checked")


# ============================================================================ profile --out

HOT = "a hot-row file (an earlier `bagpipe profile --out`)"


def test_profile_out_refuses_a_file_not_its_own_and_replaces_its_own(run_cli, tiny_data, tmp_path, monkeypatch):
    profile = ("profile", "--data", tiny_data, "--hot-budget-mb", 0.05, "--no-progress", "--out")
    # the user's TSV, and an .npz that is not a hot-row file: one line, before profiling, the bytes kept
    other_npz = tmp_path / "mine.npz"
    np.savez(other_npz, rows=np.arange(3), weights=np.ones(2))
    user_npz = tmp_path / "user.npz"  # the members' names, not the profiler's report (newcomer round 14, finding 3)
    np.savez(user_npz, rows=np.arange(5), report=np.array([1]))
    notes = tmp_path / "important.tsv"
    notes.write_bytes(NOTES)
    with monkeypatch.context() as m:
        m.setattr("bagpipe.accel.profile.profile", never_called)
        for path in (notes, other_npz, user_npz):
            kept = path.read_bytes()
            refused(run_cli(*profile, path), "profile", path, HOT)
            assert path.read_bytes() == kept
    # its own earlier output is replaced: the same command twice, then another budget
    from bagpipe.accel.profile import HotSet

    hot = tmp_path / "hot.npz"
    for budget in (0.05, 0.05, 0.02):
        rc, out, err = run_cli(*profile[:4], budget, "--no-progress", "--out", hot)
        assert rc == 0 and out.endswith(f"hot rows written to {hot}\n"), err
    from bagpipe.data.shards import Dataset

    sizes = Dataset(tiny_data).meta.table_sizes
    assert HotSet.load(hot, sizes).report["budget_mb"] == 0.02
    # a truncated one, which train --hot-rows calls damaged and says to profile again: replaced too
    hot.write_bytes(hot.read_bytes()[:100])
    assert run_cli(*profile, hot)[0] == 0 and len(HotSet.load(hot, sizes)) > 0
    # a device is written directly, as before
    assert run_cli(*profile, os.devnull)[0] == 0 and Path(os.devnull).is_char_device()


# ============================================================================ predict --out

PREDICTIONS = "an earlier predictions file (one probability a line)"


@pytest.mark.parametrize(
    "content",
    [
        NOTES,
        b"0\n1\n1\n0\n",  # a label column
        b"0.5\n1.5\n",  # not probabilities
        b"0.25\n0.5",  # no final line break: not predict's
        b"0.25\n\n0.5\n",  # an empty line
        b"0.25\r\n0.5\r\n",
        b"-0.25\n",
        b"\x89PNG\r\n\x1a\n",
    ],
    ids=["tsv", "labels", "above-1", "unended", "empty-line", "crlf", "negative", "png"],
)
def test_predict_out_refuses_a_file_not_its_own(run_cli, model, tmp_path, monkeypatch, content):
    mine = tmp_path / "important.tsv"
    mine.write_bytes(content)
    monkeypatch.setattr("bagpipe.export.model.load", never_called)
    refused(
        run_cli("predict", "--model", model["export"], "--input", model["t5"], "--out", mine),
        "predict",
        mine,
        PREDICTIONS,
    )
    assert mine.read_bytes() == content


def test_predict_out_at_a_hard_link_of_the_input_is_the_input(run_cli, model, tmp_path, monkeypatch):
    source = tmp_path / "t5.tsv"
    source.write_bytes(model["t5"].read_bytes())
    hard = tmp_path / "hard.tsv"
    os.link(source, hard)
    kept = source.read_bytes()
    monkeypatch.setattr("bagpipe.export.model.load", never_called)
    rc, _, err = run_cli("predict", "--model", model["export"], "--input", source, "--out", hard)
    assert rc == 2 and err == (
        f"bagpipe predict: error: --out {hard} is the same file as --input {source}: writing it would destroy an "
        "input; choose another --out\n"
    )
    assert source.read_bytes() == kept and hard.read_bytes() == kept and os.path.samefile(source, hard)


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_predict_standard_output_into_its_own_input_is_refused(model, tmp_path, on_error):
    """``predict --input f >> f`` (finding 1 of newcomer round 14): the probabilities would be
    appended to the input and read back (``--on-error skip`` grew it forever); ``> f``
    empties the input before bagpipe starts. Both refused in one line, before anything is
    read or written; ``--input - < f >> f`` too. A real shell redirect, in a subprocess."""
    import shlex
    import subprocess
    import sys

    source = tmp_path / "t5.tsv"
    kept = model["t5"].read_bytes()
    bagpipe = f"{shlex.quote(sys.executable)} -m bagpipe predict --model {shlex.quote(str(model['export']))}"

    def shell(line: str) -> subprocess.CompletedProcess:
        source.write_bytes(kept)
        return subprocess.run(
            ["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
        )

    error = "bagpipe predict: error: standard output is "
    # --on-error skip is what grew the input forever: its case is the plain `>> f`; every
    # other redirect runs once, with fail (each a process start: ~1.4 s on 2 cores)
    redirects = (">> t5.tsv", "--out - >> t5.tsv", "--out /dev/stdout >> t5.tsv")
    for redirect in redirects[:1] if on_error == "skip" else redirects:
        done = shell(f"{bagpipe} --input t5.tsv --on-error {on_error} {redirect}")
        assert done.returncode == 2 and done.stderr == (
            f"{error}the input file t5.tsv (>> t5.tsv?): writing it would destroy an input; "
            "redirect the output to another file, or give --out\n"
        ), done.stderr
        assert source.read_bytes() == kept
    if on_error == "skip":
        return
    for stdin in ("-", "/dev/stdin"):  # not "the input file /dev/stdin (>> /dev/stdin?)" (round 16)
        done = shell(f"{bagpipe} --input {stdin} --on-error {on_error} < t5.tsv >> t5.tsv")
        assert done.returncode == 2 and done.stderr.startswith(f"{error}the file on standard input (>> FILE?)")
        assert source.read_bytes() == kept
    # > t5.tsv: the shell emptied it first; said so, no loop, nothing written
    done = shell(f"{bagpipe} --input t5.tsv --on-error {on_error} > t5.tsv")
    assert done.returncode == 2 and done.stderr == (
        f"{error}the input file t5.tsv (> t5.tsv?), which the shell emptied before bagpipe started: "
        "nothing is left to score; redirect the output to another file, or give --out\n"
    ), done.stderr
    assert source.read_bytes() == b""
    # another file on standard output is written as before
    done = shell(f"{bagpipe} --input t5.tsv --on-error {on_error} >> preds.txt")
    assert done.returncode == 0 and len((tmp_path / "preds.txt").read_text().splitlines()) == 5, done.stderr


def test_predict_out_replaces_its_own_earlier_output(run_cli, model, tmp_path):
    argv = ("predict", "--model", model["export"], "--input", model["t5"], "--out")
    preds = tmp_path / "t5.pred"
    rc, out, err = run_cli(*argv, preds)
    assert rc == 0 and out == f"scored 5 of 5 lines of {model['t5']}\n", err
    first = preds.read_bytes()
    assert len(first.splitlines()) == 5
    # the same command again, over its own file
    assert run_cli(*argv, preds)[0] == 0 and preds.read_bytes() == first
    # an empty file, and one of --on-error skip's nan lines, are predictions files too
    for earlier in (b"", b"nan\n0.25\nnan\n", b"1.00000001e-10\n0.999999881\n"):
        preds.write_bytes(earlier)
        assert run_cli(*argv, preds)[0] == 0 and preds.read_bytes() == first
    # a device is written directly, as before
    assert run_cli(*argv, os.devnull)[0] == 0 and Path(os.devnull).is_char_device()


def test_what_counts_as_an_earlier_output(tmp_path):
    from bagpipe.accel.profile import HotSet, is_hot_row_file
    from bagpipe.export.score import PREDICTIONS_PEEK, is_predictions_file

    def file(name: str, data: bytes) -> Path:
        (tmp_path / name).write_bytes(data)
        return tmp_path / name

    # predictions: only the whole lines of the first 64 KiB are read (a line cut there is not judged)
    line = b"0.123456791\n"
    big = line * (3 * PREDICTIONS_PEEK // len(line))
    assert is_predictions_file(file("big", big))
    assert is_predictions_file(file("big-then-notes", big + NOTES))  # beyond what is read
    assert not is_predictions_file(file("notes-then-big", NOTES + big))
    assert not is_predictions_file(file("one-long-line", b"0" * (PREDICTIONS_PEEK + 10) + b"\n"))
    assert is_predictions_file(file("ones-and-a-fraction", b"1\n0\n0.5\n"))
    assert not is_predictions_file(tmp_path / "nothing-there")
    # hot rows: told by the archive's members and the mark in its report, not by loading the rows
    HotSet(np.array([1, 5]), 10, {"table_sizes": [10]}).save(tmp_path / "h.npz")
    assert is_hot_row_file(tmp_path / "h.npz")
    np.savez(tmp_path / "two.npz", rows=np.arange(2), report=np.array("{}"), more=np.arange(2))
    assert not is_hot_row_file(tmp_path / "two.npz")
    # rows and report are generic names (finding 3 of newcomer round 14): the report must be the profiler's
    for i, report in enumerate(
        [np.array([1]), np.array("{}"), np.array('{"budget_mb": 1}'), np.array("not json"), np.array(b"{}")]
    ):
        np.savez(tmp_path / f"user{i}.npz", rows=np.arange(5), report=report)
        assert not is_hot_row_file(tmp_path / f"user{i}.npz"), report
    np.savez(tmp_path / "pickled.npz", rows=np.arange(5), report=np.array([{"format": "bagpipe hot rows"}]))
    assert not is_hot_row_file(tmp_path / "pickled.npz")  # never unpickled
    # a file written before the mark: told by the profiler's keys
    old = {
        "budget_mb": 1.0,
        "capacity_rows": 2,
        "hot_rows": 2,
        "hot_mib": 0.1,
        "sample_rate": 0.05,
        "table_sizes": [10],
    }
    np.savez(tmp_path / "old.npz", rows=np.array([1, 5]), report=np.array(json.dumps(old)))
    assert is_hot_row_file(tmp_path / "old.npz")
    # truncated (no central directory): rows.npy first, its header as far as it goes int64 rows of one axis
    whole = (tmp_path / "h.npz").read_bytes()
    for cut in (40, 70, 100, 140, 200):
        assert is_hot_row_file(file(f"cut{cut}", whole[:cut])), cut
    np.savez(tmp_path / "floats.npz", rows=np.ones(5), report=np.array(json.dumps(old)))
    assert not is_hot_row_file(file("floats-cut", (tmp_path / "floats.npz").read_bytes()[:200]))
    assert not is_hot_row_file(file("zip-magic-only", b"PK\x03\x04"))
    assert not is_hot_row_file(file("text", NOTES)) and not is_hot_row_file(tmp_path)
