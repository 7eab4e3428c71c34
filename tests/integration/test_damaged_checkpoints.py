"""Damaged checkpoints: a truncated or changed file is refused in one line, never read.

On a small synthetic run with checkpoints at steps 20 (full), 40 and 60 (deltas on it):

* a truncated file and a file with one bit flipped -- a part of the latest checkpoint,
  or its dense.pt -- are refused by ``train --resume``, ``eval`` and ``export`` in one
  line that names the file and says what is wrong (the size or the CRC-32 the manifest
  recorded against what was found), with no traceback, and the run folder is byte for
  byte what it was (nothing repaired, removed or rewritten; no export left behind);
* ``train --resume`` offers the previous intact checkpoint (``--resume-from``), and
  resuming from it repeats the run exactly (the same digest as the undamaged run);
* a damaged base is named as such from every checkpoint that rests on it, and resume
  then says that no earlier checkpoint is intact;
* a checkpoint of format version 3 (before checksums) still evaluates, checked by size:
  a truncated version-3 file is refused naming it.

The damage is done in this process, right after training here: the checks' memory of
files this process wrote or checked (:mod:`bagpipe.checkpoint.verify`) is cleared first,
as a user's damage comes from another process.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from bagpipe.checkpoint import verify

pytestmark = pytest.mark.usefixtures("one_thread")

TRAIN = ("--steps", 60, "--batch-size", 64, "--checkpoint-every", 20, "--no-progress", "--eval-samples", 0)
LATEST_VALUES = Path("checkpoints/step-00000060/delta-0-of-1.npy")
BASE_VALUES = Path("checkpoints/step-00000020/full-0-of-1.npy")


@pytest.fixture(scope="module")
def trained_run(tiny_data, tmp_path_factory) -> Path:
    from bagpipe.cli import main

    run = tmp_path_factory.mktemp("damaged") / "run"
    assert main(["train", "--data", tiny_data, "--out", str(run), *map(str, TRAIN)]) == 0
    names = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    assert names == ["step-00000020", "step-00000040", "step-00000060"]
    return run


@pytest.fixture
def run(trained_run, tmp_path) -> Path:
    """A copy of the trained run, for this test to damage."""
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy)
    return copy


def truncate(path: Path) -> str:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    verify.forget()
    return f"expected {size:,} bytes, found {size - 100:,} (truncated)"


def flip(path: Path) -> str:
    """One bit of one value (past the .npy header) flipped: the file keeps its size."""
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size - 7)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    verify.forget()
    return "expected CRC-32 "


DAMAGE = {"truncated": truncate, "flipped": flip}


def tree_hash(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` and the sha256 of its bytes (but ``.lock``, which holds
    the pid of the last command that claimed the run folder)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def command(which: str, tiny_data: str, run: Path, tmp_path: Path) -> list:
    return {
        "resume": ["train", "--data", tiny_data, "--out", run, *TRAIN[:1], 80, *TRAIN[2:], "--resume"],
        "eval": ["eval", "--run", run, "--data", tiny_data],
        "export": ["export", "--run", run, "--out", tmp_path / "export"],
    }[which]


def one_line(result: tuple[int, str, str]) -> str:
    rc, _, err = result
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.integration
@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("which", ["resume", "eval", "export"])
def test_a_damaged_part_is_refused_in_one_line_naming_it(run, tiny_data, tmp_path, run_cli, which, damage):
    what = DAMAGE[damage](run / LATEST_VALUES)
    before = tree_hash(run)
    line = one_line(run_cli(*command(which, tiny_data, run, tmp_path)))
    assert f"{run / LATEST_VALUES}: damaged checkpoint file: {what}" in line, line
    if which == "resume":  # the previous checkpoint is whole: offered
        assert line.startswith(f"bagpipe train: error: cannot resume {run} from its latest checkpoint step-00000060: ")
        assert "the previous intact checkpoint is step 40: resume from it with --resume-from step-00000040" in line
    assert tree_hash(run) == before
    assert not (tmp_path / "export").exists()


@pytest.mark.integration
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_dense_file_is_refused_naming_it(run, tiny_data, tmp_path, run_cli, damage):
    dense = run / "checkpoints" / "step-00000060" / "dense.pt"
    what = DAMAGE[damage](dense)
    before = tree_hash(run)
    for which in ("eval", "export", "resume"):
        line = one_line(run_cli(*command(which, tiny_data, run, tmp_path)))
        assert f"{dense}: damaged checkpoint file: {what}" in line, (which, line)
    assert tree_hash(run) == before


@pytest.mark.integration
def test_a_damaged_base_is_named_from_every_checkpoint_on_it(run, tiny_data, tmp_path, run_cli):
    what = flip(run / BASE_VALUES)
    before = tree_hash(run)
    line = one_line(run_cli(*command("eval", tiny_data, run, tmp_path)))
    assert line.startswith("bagpipe eval: error: checkpoint step-00000060 rests on step-00000020, which is damaged: ")
    assert f"{run / BASE_VALUES}: damaged checkpoint file: {what}" in line
    line = one_line(run_cli(*command("resume", tiny_data, run, tmp_path)))
    assert f"{run / BASE_VALUES}: damaged checkpoint file: {what}" in line
    assert "no earlier checkpoint of the run is intact: start it again with another --out" in line  # 40 rests on 20
    assert tree_hash(run) == before


@pytest.mark.integration
def test_resume_from_the_previous_intact_checkpoint_repeats_the_run(run, trained_run, tiny_data, run_cli):
    flip(run / LATEST_VALUES)
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", run, *TRAIN, "--resume-from", "step-00000040")
    assert rc == 0, err
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step-00000060"  # rewritten by this run
    digest = json.loads((run / "summary.json").read_text())["params_sha256"]
    assert digest == json.loads((trained_run / "summary.json").read_text())["params_sha256"]
    assert run_cli("eval", "--run", run, "--data", tiny_data)[0] == 0  # the new step 60 is whole


@pytest.mark.integration
def test_resume_from_names_a_checkpoint_the_run_has(run, tiny_data, run_cli):
    before = tree_hash(run)
    line = one_line(run_cli("train", "--data", tiny_data, "--out", run, *TRAIN, "--resume-from", "30"))
    assert line.endswith(
        f"--resume-from 30: {run / 'checkpoints'} has no complete checkpoint step-00000030 "
        "(it has: step-00000020, step-00000040, step-00000060)"
    ), line
    flip(run / BASE_VALUES)
    before = tree_hash(run)
    line = one_line(run_cli("train", "--data", tiny_data, "--out", run, *TRAIN, "--resume-from", "step-00000040"))
    assert "checkpoint step-00000040 rests on step-00000020, which is damaged: " in line, line
    assert tree_hash(run) == before


def as_version_3(run: Path) -> None:
    """Rewrite every manifest as bagpipe wrote it before checksums (format version 3)."""
    for path in (run / "checkpoints").glob("step-*/MANIFEST.json"):
        m = json.loads(path.read_text())
        m["version"] = 3
        m.pop("dense_sum"), m.pop("manifest_crc32")
        for p in m["parts"]:
            p.pop("sums")
        path.write_text(json.dumps(m))


@pytest.mark.integration
def test_a_version_3_checkpoint_still_loads_checked_by_size(run, tiny_data, tmp_path, run_cli):
    rc, want, err = run_cli("eval", "--run", run, "--data", tiny_data, "--json")
    assert rc == 0, err
    as_version_3(run)
    rc, out, err = run_cli("eval", "--run", run, "--data", tiny_data, "--json")
    assert rc == 0 and json.loads(out) == json.loads(want), err
    path = run / LATEST_VALUES
    size = path.stat().st_size
    truncate(path)
    before = tree_hash(run)
    line = one_line(run_cli("eval", "--run", run, "--data", tiny_data))
    assert (
        line
        == f"bagpipe eval: error: {path}: damaged checkpoint file: expected {size:,} bytes (its header's shape), found {size - 100:,} (truncated)"
    )
    assert tree_hash(run) == before
