"""Messages a newcomer round found misleading (issue 32), each now saying what is wrong and
what to do, in one line (exit 2, no traceback), with nothing of the user's changed.

* ``preprocess`` of a one-line input with a fractional --split blamed the vocabulary: a
  line not in the format is named (FILE:LINE and the fields expected), a valid one is
  said to be too few lines to split;
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest


def snapshot(folder: str | Path) -> dict[str, str]:
    """Every file under ``folder`` and the sha256 of its bytes."""
    folder = Path(folder)
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def one_line_error(rc: int, err: str, command: str) -> str:
    """The one ``bagpipe COMMAND: error:`` line of a refusal (exit 2, no traceback), less its prefix."""
    assert rc == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"bagpipe {command}: error: ")]
    assert len(lines) == 1, err
    return lines[0].split(": error: ", 1)[1]


def criteo_line() -> str:
    return "\t".join(["1"] + ["3"] * 13 + ["68fd1e64"] * 26) + "\n"


# -- 1. preprocess of one line --------------------------------------------------------------


@pytest.mark.integration
def test_preprocess_of_one_line_says_what_is_wrong_with_the_input(run_cli, tmp_path):
    garbage, one = tmp_path / "g.txt", tmp_path / "one.tsv"
    garbage.write_text("hello garbage\n")
    one.write_text(criteo_line())
    out = tmp_path / "data"
    before = snapshot(tmp_path)
    rc, _, err = run_cli("preprocess", "criteo", "--input", garbage, "--out", out, "--no-progress")
    assert one_line_error(rc, err, "preprocess") == f"{garbage}:1: expected 40 tab-separated fields, got 1"
    rc, _, err = run_cli("preprocess", "criteo", "--input", one, "--out", out, "--no-progress")
    assert one_line_error(rc, err, "preprocess") == (
        f"--input {one}: 1 data line, too few to split: --split 0.9 sends none of them to train, where the "
        "vocabulary comes from; give more lines, --split 1, --vocab-from DIR or --max-rows-per-table N"
    )
    assert snapshot(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["g.txt", "one.tsv"]
