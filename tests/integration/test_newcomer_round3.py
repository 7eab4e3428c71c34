"""The third newcomer round (issue 32: no traceback, no silently wrong result, no data
loss): what a new user tried that still went wrong, each now one line (exit 2, no
traceback) with nothing of the user's changed.

* A checkpoint's MANIFEST.json edited but still valid JSON (``"step": 50`` become 51)
  was read as written: eval reported step 51, a resume trained the wrong number of
  steps. It is a damaged checkpoint file now (its own CRC-32, format 5) for ``eval``,
  ``export`` and ``train --resume`` -- which offers the previous intact checkpoint --
  and the run folder is left as it was.
* A data set's meta.json with a table's ``num_rows`` grown passed ``bagpipe check`` and
  trained a larger table silently; ``check`` and ``train`` refuse it now, naming
  meta.json.
* A checkpoint file replaced by a folder was called "truncated"; it is said to be a
  folder where a file is expected (a part, dense.pt, MANIFEST.json), and a LATEST that
  is a folder is one line (it was an IsADirectoryError traceback).
* ``bagpipe predict --model EXPORT/model.json`` said "no model.json": the model.json
  path names its export folder; any other file is one line saying to give the folder.
* ``bagpipe train --out EXPORT`` (or ``--store-dir``) at an export folder wrote the
  run's files among the export's; it is refused like a data set folder.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

COMMON = ("--batch-size", 16, "--no-progress", "--threads", 1, "--eval-samples", 64)


def snapshot(folder: str | Path) -> dict[str, str]:
    """Every file and folder under ``folder``, files with the sha256 of their bytes (a run's
    .lock records who last held it, not the user's data)."""
    folder = Path(folder)
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
        for p in sorted(folder.rglob("*"))
        if p.name != ".lock"
    }


def one_line_error(result: tuple[int, str, str], command: str) -> str:
    """The text of the one ``bagpipe COMMAND: error:`` line of a refusal (exit 2, no traceback)."""
    rc, _, err = result
    assert rc == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"bagpipe {command}: error: ")]
    assert len(lines) == 1 and len(err.strip().splitlines()) == 1, err
    return lines[0].split(": error: ", 1)[1]


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory) -> Path:
    """A run of 50 steps with checkpoints at steps 25 and 50 (copied before each use)."""
    from bagpipe.cli import main

    run = tmp_path_factory.mktemp("round3") / "run"
    args = ["train", "--data", tiny_data, "--out", run, "--steps", 50, "--checkpoint-every", 25, *COMMON]
    assert main([str(a) for a in args]) == 0
    return run


@pytest.fixture
def run(trained, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


# -- a checkpoint's MANIFEST.json, a data set's meta.json, edited ---------------------------


@pytest.mark.integration
def test_a_manifest_whose_step_was_edited_is_refused_where_the_checkpoint_is_opened(run, tiny_data, tmp_path, run_cli):
    manifest = run / "checkpoints" / "step-00000050" / "MANIFEST.json"
    text = manifest.read_text()
    written = json.loads(text)["manifest_crc32"]
    assert '"step": 50,' in text
    manifest.write_text(text.replace('"step": 50,', '"step": 51,'))
    before = snapshot(run)
    damaged = (
        f"{manifest}: damaged checkpoint file: its content does not match the CRC-32 it was written with "
        f"(manifest_crc32 {written}, the content's "
    )
    said = one_line_error(run_cli("eval", "--run", run, "--data", tiny_data), "eval")
    assert said.startswith(damaged) and said.endswith("): it was edited or damaged since it was written"), said
    said = one_line_error(run_cli("export", "--run", run, "--data", tiny_data, "--out", tmp_path / "e"), "export")
    assert said.startswith(damaged), said
    assert not (tmp_path / "e").exists()
    said = one_line_error(
        run_cli("train", "--data", tiny_data, "--out", run, "--steps", 80, "--resume", *COMMON), "train"
    )
    assert said.startswith(f"cannot resume {run} from its latest checkpoint step-00000050: {damaged}"), said
    assert said.endswith(
        "the previous intact checkpoint is step 25: resume from it with --resume-from step-00000025 "
        "(nothing in the run folder was changed)"
    ), said
    assert snapshot(run) == before


@pytest.mark.integration
def test_a_meta_json_with_a_grown_table_is_refused_by_check_and_train(tiny_data, tmp_path, run_cli):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    meta = data / "meta.json"
    d = json.loads(meta.read_text())
    written = d["meta_crc32"]
    d["features"][0]["num_rows"] += 10_000
    meta.write_text(json.dumps(d, indent=2, sort_keys=True))
    before = snapshot(data)
    want = (
        f"{meta}: damaged data set file: its content does not match the CRC-32 it was written with "
        f"(meta_crc32 {written}, the content's "
    )
    assert one_line_error(run_cli("check", data, "--no-progress"), "check").startswith(want)
    out = tmp_path / "r"
    assert one_line_error(run_cli("train", "--data", data, "--out", out, "--steps", 3, *COMMON), "train").startswith(
        want
    )
    assert not out.exists() and snapshot(data) == before


# -- a checkpoint file that is a folder -------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("name", ["delta-0-of-1.npy", "dense.pt", "MANIFEST.json"])
def test_a_checkpoint_file_replaced_by_a_folder_is_said_to_be_one(run, tiny_data, run_cli, name):
    path = run / "checkpoints" / "step-00000050" / name
    path.unlink()
    path.mkdir()
    before = snapshot(run)
    said = one_line_error(run_cli("eval", "--run", run, "--data", tiny_data), "eval")
    assert said == f"{path}: damaged checkpoint file: a folder where a file is expected", said
    said = one_line_error(
        run_cli("train", "--data", tiny_data, "--out", run, "--steps", 80, "--resume", *COMMON), "train"
    )
    assert f"{path}: damaged checkpoint file: a folder where a file is expected; the previous intact " in said, said
    assert snapshot(run) == before


@pytest.mark.integration
def test_a_latest_that_is_a_folder_is_one_line(run, tiny_data, run_cli):
    latest = run / "checkpoints" / "LATEST"
    latest.unlink()
    latest.mkdir()
    before = snapshot(run)
    want = (
        f"{latest} is a folder where a file is expected (a damaged run folder); the newest intact checkpoint is "
        "step-00000050 (step 50): move the folder LATEST away, then `bagpipe train ... --resume --resume-from "
        "step-00000050` continues from it and makes LATEST name it (nothing in the run folder was changed)"
    )
    assert one_line_error(run_cli("eval", "--run", run, "--data", tiny_data), "eval") == want
    resume = ("train", "--data", tiny_data, "--out", run, "--steps", 80, "--resume", *COMMON)
    assert one_line_error(run_cli(*resume), "train") == want
    assert snapshot(run) == before
    latest.rmdir()  # what the line says to do
    rc, out, err = run_cli(*resume[: -len(COMMON)], "--resume-from", "step-00000050", *COMMON)
    assert rc == 0 and "resumed from step 50" in out, err


# -- predict --model EXPORT/model.json; train --out EXPORT -------------------------------------


@pytest.fixture(scope="module")
def export(trained, tiny_data, tmp_path_factory) -> Path:
    from bagpipe.cli import main

    out = tmp_path_factory.mktemp("round3-export") / "export"
    assert main(["export", "--run", str(trained), "--data", tiny_data, "--out", str(out)]) == 0
    return out


@pytest.mark.integration
def test_predict_takes_the_exports_model_json_for_its_folder(export, tmp_path, run_cli):
    raw = tmp_path / "in.txt"
    raw.write_text("0\t1\t2\n")
    # a synthetic run's export scores no raw lines: the same answer for the folder and its model.json
    by_folder = one_line_error(run_cli("predict", "--model", export, "--input", raw), "predict")
    assert by_folder.startswith(f"{export}: trained on data without a raw format"), by_folder
    assert one_line_error(run_cli("predict", "--model", export / "model.json", "--input", raw), "predict") == by_folder
    other = export / "dense.safetensors"
    assert one_line_error(run_cli("predict", "--model", other, "--input", raw), "predict") == (
        f"--model {other}: a file; give the folder `bagpipe export --out` wrote (the one that holds model.json)"
    )


@pytest.mark.integration
@pytest.mark.parametrize("flag", ["--out", "--store-dir"])
def test_train_out_at_an_export_is_refused_and_the_export_kept(export, tiny_data, tmp_path, run_cli, flag):
    before = snapshot(export)
    args = ["--out", export] if flag == "--out" else ["--out", tmp_path / "r", "--mode", "lookahead"]
    args += ["--store", "disk", "--store-dir", export] if flag == "--store-dir" else []
    said = one_line_error(run_cli("train", "--data", tiny_data, *args, "--steps", 3, *COMMON), "train")
    assert said == (
        f"{flag} {export} holds an export (model.json): the run would write its files among the export's; "
        f"choose another {flag}"
    )
    assert snapshot(export) == before and not (tmp_path / "r").exists()
