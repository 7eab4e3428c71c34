"""The fourth newcomer round (issue 32: no traceback, no silently wrong result, no data
loss): each finding is now one line (exit 2, no traceback) with nothing of the user's changed.

* A damaged export was scored without complaint (overwritten embedding bytes: every
  prediction nan; one flipped bit of dense.safetensors: other predictions; a flipped
  byte of a vocabulary file). model.json (version 2) records every file's size and
  CRC-32 and its own content's; ``predict`` checks them before scoring and names the
  file. An export of version 1 (no sums) still scores.
* ``export --data`` took a data set with the same table sizes but another vocabulary;
  export compares its fingerprint with the one the run recorded.
* A truncated or bit-flipped ``--hot-rows`` file was a zipfile traceback in ``train``
  and ``plan``.
* SIGTERM of ``predict`` left its ``.OUT.tmp-PID``; ``predict --out`` at a symbolic
  link replaced the link; ``plot`` of a run without metrics wrote an empty picture;
  ``synth`` drew its progress bar into a pipe.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TRAIN = ("--steps", 10, "--batch-size", 64, "--no-progress", "--threads", 1, "--eval-samples", 0)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the sha256 of its bytes (a lock file left out)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


def one_line_error(result: tuple[int, str, str], command: str) -> str:
    rc, _, err = result
    assert rc == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"bagpipe {command}: error: "), err
    return err.strip().split(": error: ", 1)[1]


def criteo_lines(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        "\t".join(
            [str(rng.integers(0, 2))]
            + [str(v) for v in rng.integers(0, 50, 13)]
            + [format(int(v), "x") for v in rng.integers(0, 300, 26)]
        )
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """A raw Criteo file, its data set, a run of 10 steps on it, and the run's export."""
    from bagpipe.cli import main

    root = tmp_path_factory.mktemp("round4")
    raw = root / "day.tsv"
    lines = criteo_lines(600, 4)
    raw.write_text("\n".join(lines) + "\n")
    data, run, export = root / "data", root / "run", root / "export"
    assert main(["preprocess", "criteo", "--input", str(raw), "--out", str(data), "--no-progress"]) == 0
    assert main(["train", "--data", str(data), "--out", str(run), *map(str, TRAIN)]) == 0
    assert main(["export", "--run", str(run), "--out", str(export)]) == 0
    # the same lines with every category key v renamed 12b - v: the same tables, another vocabulary
    renamed = root / "renamed.tsv"
    renamed.write_text(
        "\n".join(
            "\t".join(f[:14] + [format(0x12B - int(k, 16), "x") for k in f[14:]])
            for f in (x.split("\t") for x in lines)
        )
        + "\n"
    )
    return {"root": root, "raw": raw, "data": data, "run": run, "export": export, "renamed": renamed}


def damage(path: Path, offset: int, data: bytes) -> None:
    b = bytearray(path.read_bytes())
    b[offset : offset + len(data)] = bytes(x ^ y for x, y in zip(b[offset : offset + len(data)], data))
    path.write_bytes(bytes(b))


@pytest.mark.parametrize(
    "name, offset, data",
    [
        ("embeddings-00000-of-00001.safetensors", 4096, b"\xff" * 64),  # overwritten bytes: every prediction nan
        ("dense.safetensors", 3000, b"\x01"),  # one flipped bit: other predictions
        ("vocab/C3.keys.npy", 200, b"\x04"),  # a flipped byte of a vocabulary file
    ],
)
def test_a_damaged_export_file_is_refused_before_scoring(made, tmp_path, run_cli, name, offset, data):
    from bagpipe.filesums import crc_hex, file_crc

    export = tmp_path / "export"
    shutil.copytree(made["export"], export)
    recorded = json.loads((export / "model.json").read_text())["files"][name]
    damage(export / name, offset, data)
    before = snapshot(export)
    out = tmp_path / "p.txt"
    said = one_line_error(run_cli("predict", "--model", export, "--input", made["raw"], "--out", out), "predict")
    assert said == (
        f"{export / name}: damaged export file: model.json records CRC-32 {recorded['crc32']}, "
        f"found {crc_hex(file_crc(export / name))} (its bytes changed since it was exported); export the run again"
    )
    assert snapshot(export) == before and not out.exists() and sorted(os.listdir(tmp_path)) == ["export"]


def test_a_truncated_export_file_and_an_edited_model_json_are_refused(made, tmp_path, run_cli):
    export = tmp_path / "export"
    shutil.copytree(made["export"], export)
    emb = export / "embeddings-00000-of-00001.safetensors"
    size = emb.stat().st_size
    os.truncate(emb, 1000)
    said = one_line_error(run_cli("predict", "--model", export, "--input", made["raw"]), "predict")
    assert said == (
        f"{emb}: damaged export file: model.json records {size:,} bytes, found 1,000 (truncated); export the run again"
    )
    shutil.rmtree(export)
    shutil.copytree(made["export"], export)
    m = export / "model.json"
    m.write_text(m.read_text().replace('"step": 10', '"step": 11'))
    said = one_line_error(run_cli("predict", "--model", export, "--input", made["raw"]), "predict")
    assert said.startswith(
        f"{m}: damaged export file: its content does not match the CRC-32 it was written with (manifest_crc32 "
    ), said
    assert said.endswith("it was edited or damaged since it was written; export the run again"), said


def test_an_export_of_version_1_without_sums_still_scores(made, tmp_path, run_cli):
    export = tmp_path / "export"
    shutil.copytree(made["export"], export)
    m = json.loads((export / "model.json").read_text())
    assert m["version"] == 2 and "manifest_crc32" in m and "dense.safetensors" in m["files"]
    m["version"] = 1
    del m["files"], m["manifest_crc32"]
    (export / "model.json").write_text(json.dumps(m))
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    assert run_cli("predict", "--model", made["export"], "--input", made["raw"], "--labelled", "--out", a)[0] == 0
    assert run_cli("predict", "--model", export, "--input", made["raw"], "--labelled", "--out", b)[0] == 0
    assert a.read_text() == b.read_text() and "nan" not in a.read_text()


def test_export_refuses_a_data_set_with_another_vocabulary(made, tmp_path, run_cli):
    from bagpipe.data.integrity import fingerprint
    from bagpipe.data.schema import DatasetMeta

    other = tmp_path / "other"
    assert run_cli("preprocess", "criteo", "--input", made["renamed"], "--out", other, "--no-progress")[0] == 0
    assert DatasetMeta.load(other).table_sizes == DatasetMeta.load(made["data"]).table_sizes
    assert snapshot(other / "vocab") != snapshot(made["data"] / "vocab")
    before = snapshot(other)
    was = json.loads((made["run"] / "config.json").read_text())["dataset"]["fingerprint"]
    now = fingerprint(other, DatasetMeta.load(other))
    said = one_line_error(run_cli("export", "--run", made["run"], "--data", other, "--out", tmp_path / "e"), "export")
    assert said == (
        f"{other}: not the data set {made['run']} was trained on (fingerprint {was[:12]}, this one's {now[:12]}); "
        "its vocabulary would map lines to rows the run did not learn for them: give --data the run's data set"
    )
    assert snapshot(other) == before and not (tmp_path / "e").exists()


@pytest.fixture(scope="module")
def hot(made) -> Path:
    from bagpipe.cli import main

    path = made["root"] / "hot.npz"
    assert main(["profile", "--data", str(made["data"]), "--hot-budget-mb", "0.05", "--out", str(path)]) == 0
    return path


@pytest.mark.parametrize("how", ["truncated", "bit-flipped"])
@pytest.mark.parametrize("command", ["train", "plan"])
def test_a_damaged_hot_row_file_is_one_line(made, hot, tmp_path, run_cli, how, command):
    path = tmp_path / "HOT.npz"
    shutil.copy(hot, path)
    if how == "truncated":
        os.truncate(path, 300)
        why = "BadZipFile: File is not a zip file"
    else:
        damage(path, 200, b"\x01")  # inside rows.npy's bytes: the archive's own CRC-32 finds it
        why = "BadZipFile: Bad CRC-32 for file 'rows.npy'"
    before = path.read_bytes()
    args = ["--data", made["data"], "--mode", "lookahead", "--batch-size", 64, "--hot-rows", path]
    if command == "train":
        args += ["--out", tmp_path / "run", *TRAIN[2:]]
    said = one_line_error(run_cli(command, *args), command)
    assert said == f"{path}: damaged hot-row file ({why}): profile again with `bagpipe profile --out {path}`"
    assert path.read_bytes() == before and not (tmp_path / "run").exists()


def test_sigterm_of_predict_leaves_no_temporary_file(made, tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    out = tmp_path / "p.txt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bagpipe", "predict", "--model", str(made["export"]), "--input", str(fifo)]
        + ["--labelled", "--out", str(out), "--block-kb", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with open(fifo, "w") as w:  # lines come, and then the writer waits: predict is mid-output
        w.write(made["raw"].read_text())
        w.flush()
        t0 = time.monotonic()
        while not list(tmp_path.glob(".p.txt.tmp-*")):
            assert proc.poll() is None and time.monotonic() - t0 < 120, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err.strip()) == (143, "bagpipe predict: stopped by SIGTERM")
    assert sorted(os.listdir(tmp_path)) == ["in.fifo"]


def test_predict_out_at_a_symbolic_link_writes_through_it(made, tmp_path, run_cli):
    target = tmp_path / "target.txt"
    target.write_text("0.5\n")  # an earlier predictions file: the only kind predict --out replaces
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    assert run_cli("predict", "--model", made["export"], "--input", made["raw"], "--labelled", "--out", link)[0] == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert len(target.read_text().splitlines()) == 600


def test_plot_of_a_run_without_metrics_is_refused(made, tmp_path, run_cli):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(made["run"] / "config.json", run)
    (run / "metrics.jsonl").write_text("")
    before = snapshot(run)
    said = one_line_error(run_cli("plot", run, "--out", tmp_path / "x.png"), "plot")
    assert said == f"{run} has no metrics to plot (metrics.jsonl empty); plot it once it has trained a logged step"
    assert snapshot(run) == before and not (tmp_path / "x.png").exists()


def test_synth_draws_no_progress_bar_into_a_pipe(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "bagpipe",
            "synth",
            "--profile",
            "tiny",
            "--samples",
            "5000",
            "--out",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stderr == "" and "\r" not in r.stdout, (r.stdout, r.stderr)
