"""Outputs anywhere inside a data set or an export: refused in one line (exit 2), before
anything is written, naming the enclosing data set or export.

A newcomer found that ``train --out``/``--store-dir`` were refused only AT an export or a
data set folder (or inside ``--data``), so a run inside an export (``--out EXPORT/runx``),
a disk store in an export's ``vocab/``, a run among another data set's shard files
(``--out DATA2/eval/00000``) and a ``--summary-json`` written into ``--data`` itself were
accepted -- and a later ``export --overwrite`` / ``preprocess --overwrite`` of that folder
was then refused ("runx/ and 16 more is not part of the export"). Every such path is now
found by walking up from it (it need not exist) with one function,
:func:`bagpipe.files.enclosing_output`, which ``predict``/``profile --out`` (files) and
``synth``/``preprocess``/``export --out`` (whole folders) use too. ``train --out -``
made a folder named ``-`` (``predict --out -`` is standard output); it is refused, as is
``export --out -``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

COMMON = ("--steps", 3, "--batch-size", 16, "--no-progress", "--threads", 1, "--eval-samples", 64)


def contents(folder: str | Path) -> dict[str, bytes | None]:
    """Every file and folder under ``folder`` (hidden ones too), files with their bytes."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def one_line_error(result: tuple[int, str, str], command: str) -> str:
    """The text of the one ``bagpipe COMMAND: error:`` line of a refusal (exit 2, no traceback)."""
    rc, _, err = result
    assert rc == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"bagpipe {command}: error: "), err
    return lines[0].split(": error: ", 1)[1]


def inside_message(flag: str, given: Path, kind: str, folder: Path, what: str) -> str:
    return (
        f"{flag} {given} lies inside the {kind} {os.path.realpath(folder)}: {what} would be mixed with the "
        f"{kind}'s, and a later --overwrite of it would be refused; choose a {flag} outside it"
    )


@pytest.fixture(scope="module")
def made(tiny_data, tmp_path_factory) -> dict[str, Path]:
    """A run of 3 steps on ``tiny_data`` and its export (copied before each use)."""
    from bagpipe.cli import main

    where = tmp_path_factory.mktemp("inside")
    run, export = where / "run", where / "export"
    assert main(["train", "--data", tiny_data, "--out", str(run), *map(str, COMMON)]) == 0
    assert main(["export", "--run", str(run), "--out", str(export)]) == 0
    return {"run": run, "export": export}


@pytest.fixture
def export(made, tmp_path) -> Path:
    copy = tmp_path / "exc"
    shutil.copytree(made["export"], copy)
    return copy


@pytest.fixture
def other_data(tiny_data, tmp_path) -> Path:
    copy = tmp_path / "cr2"
    shutil.copytree(tiny_data, copy)
    return copy


@pytest.mark.integration
def test_a_run_inside_an_export_is_refused_and_the_export_can_still_be_replaced(made, export, tiny_data, run_cli):
    before = contents(export)
    out = export / "runx"
    said = one_line_error(run_cli("train", "--data", tiny_data, "--out", out, *COMMON), "train")
    assert said == inside_message("--out", out, "export", export, "the run's files")
    assert contents(export) == before and not out.exists()
    # what the newcomer's run made impossible: the export replaced as a whole
    assert run_cli("export", "--run", made["run"], "--out", export, "--overwrite")[0] == 0


@pytest.mark.integration
def test_a_store_in_an_exports_vocab_folder_is_refused(export, tiny_data, tmp_path, run_cli):
    before = contents(export)
    store, out = export / "vocab", tmp_path / "r3"
    args = ("--out", out, "--mode", "lookahead", "--store", "disk", "--store-dir", store)
    said = one_line_error(run_cli("train", "--data", tiny_data, *args, *COMMON), "train")
    assert said == inside_message("--store-dir", store, "export", export, "the run's files")
    assert contents(export) == before and not out.exists()


@pytest.mark.integration
def test_a_run_among_another_data_sets_shards_is_refused(other_data, tiny_data, tmp_path, run_cli):
    before = contents(other_data)
    out = other_data / "eval" / "00000"
    said = one_line_error(run_cli("train", "--data", tiny_data, "--out", out, *COMMON), "train")
    assert said == inside_message("--out", out, "data set", other_data, "the run's files")
    assert contents(other_data) == before


@pytest.mark.integration
def test_a_store_deep_inside_another_data_set_that_does_not_exist_yet_is_refused(
    other_data, tiny_data, tmp_path, run_cli
):
    before = contents(other_data)
    store = other_data / "a" / "b" / "store"
    args = ("--out", tmp_path / "r", "--mode", "lookahead", "--store", "disk", "--store-dir", store)
    said = one_line_error(run_cli("train", "--data", tiny_data, *args, *COMMON), "train")
    assert said == inside_message("--store-dir", store, "data set", other_data, "the run's files")
    assert contents(other_data) == before and not (tmp_path / "r").exists()


@pytest.mark.integration
@pytest.mark.parametrize("where", ["data", "export"])
def test_a_summary_json_inside_the_data_or_an_export_is_refused(where, export, tiny_data, tmp_path, run_cli):
    folder = Path(tiny_data) if where == "data" else export
    kind = "data set" if where == "data" else "export"
    before = contents(folder)
    summary, out = folder / "new.json", tmp_path / "rq"
    said = one_line_error(
        run_cli("train", "--data", tiny_data, "--out", out, "--summary-json", summary, *COMMON), "train"
    )
    assert said == inside_message("--summary-json", summary, kind, folder, "the summary")
    assert contents(folder) == before and not out.exists()


@pytest.mark.integration
def test_train_out_dash_is_refused_not_made_a_folder(tiny_data, tmp_path, run_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    said = one_line_error(run_cli("train", "--data", tiny_data, "--out", "-", *COMMON), "train")
    assert said == (
        "--out -: train writes a run folder (config.json, checkpoints/, summary.json), not standard output; "
        "give a folder, e.g. --out runs/a"
    )
    assert os.listdir(tmp_path) == []


@pytest.mark.integration
def test_export_out_dash_is_refused_not_made_a_folder(made, tmp_path, run_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    said = one_line_error(run_cli("export", "--run", made["run"], "--out", "-"), "export")
    assert said == "--out -: an export is written as a folder, not to standard output; give the folder to write"
    assert os.listdir(tmp_path) == []


@pytest.mark.integration
def test_the_other_commands_outputs_inside_an_export_or_data_set_are_refused_by_the_same_rule(
    made, export, other_data, tiny_data, tmp_path, run_cli
):
    """``export --out`` inside another export (it was refused only among the export's own
    files), ``predict --out`` and ``profile --out`` as new files inside an export or a data
    set that is not their input (refused before only when the file existed)."""
    raw = tmp_path / "raw.tsv"
    raw.write_text("0\t1\t2\n")
    before = {f: contents(f) for f in (export, other_data)}
    inner = export / "sub"
    said = one_line_error(run_cli("export", "--run", made["run"], "--out", inner), "export")
    assert said == (
        f"--out {inner} lies inside the export {os.path.realpath(export)}: an export is not written inside it; "
        "choose a --out outside it"
    )
    for command, argv, out, folder, kind in (
        ("predict", ["--model", made["export"], "--input", raw], export / "p.txt", export, "export"),
        ("profile", ["--data", tiny_data, "--hot-budget-mb", 0.01, "--no-progress"], other_data / "hot.npz",
         other_data, "data set"),
    ):  # fmt: skip
        said = one_line_error(run_cli(command, *argv, "--out", out), command)
        assert said == inside_message("--out", out, kind, folder, "the file")
    assert {f: contents(f) for f in (export, other_data)} == before
