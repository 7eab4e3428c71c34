"""What the commands write where, as a newcomer round found it and as it is now.

* ``-`` is standard output for an option that writes a file: ``profile --out -`` (the
  .npz), ``plot --out -`` (a PNG) and ``train --summary-json -`` (the JSON) used to write
  a regular file named ``-`` (plot refused it); now the file's bytes go to stdout alone
  and the command's own lines to stderr, as for ``/dev/stdout``, whose writers put the
  report lines into the same stream (``plot --out /dev/stdout > f.png`` ended with
  ``wrote /dev/stdout``; ``profile --out /dev/stdout`` with its table). A terminal as
  stdout for a binary picture or .npz is refused, and so is ``profile --out - --json``
  (two things on one stream). An option that writes a folder refuses ``-`` in one line
  (``bench --out``, ``train --tensorboard``, ``serve --store-dir``).
* ``plot --out p.jpg`` wrote PNG bytes into p.jpg. The picture's format is now its
  suffix's (.png, .jpg/.jpeg, .pdf, .svg, .tif/.tiff, .webp; PNG without a suffix); any
  other suffix is refused in one line, as is a pillow format without pillow; an existing
  file is replaced only by a picture of its own format.
* ``bench sweep --quick --profile tiny`` exited 0 having measured nothing (every point
  "too small"), with matplotlib's empty-legend warning twice: refused in one line, exit 2.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TRAIN = ("--steps", 12, "--batch-size", 64, "--no-progress", "--threads", 1, "--eval-samples", 256, "--eval-every", 6)


def one_line_error(rc: int, err: str, command: str) -> str:
    """The one ``bagpipe COMMAND: error:`` line of a refusal (exit 2, no traceback), less its prefix."""
    assert rc == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"bagpipe {command}: error: ")]
    assert len(lines) == 1, err
    return lines[0].split(": error: ", 1)[1]


def strict_json(text: str):
    """``text`` parsed as JSON as other tools parse it: a bare NaN or Infinity is an error."""

    def bare(word: str):
        raise AssertionError(f"{word} is not JSON")

    return json.loads(text, parse_constant=bare)


def bagpipe(args: list, cwd: Path, stdout_file: Path) -> subprocess.CompletedProcess:
    """``bagpipe ARGS > stdout_file`` in ``cwd``, as a shell runs it; stderr captured."""
    with open(stdout_file, "wb") as out:
        return subprocess.run(
            [sys.executable, "-m", "bagpipe", *map(str, args)],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=240,
        )


@pytest.fixture(scope="module")
def a_run(tiny_data, tmp_path_factory) -> Path:
    from bagpipe.cli import main

    run = tmp_path_factory.mktemp("conventions") / "run"
    assert main(["train", "--data", tiny_data, "--out", str(run), *map(str, TRAIN)]) == 0
    return run


# -- '-' is standard output -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["-", "/dev/stdout"])
def test_plot_to_standard_output_writes_the_png_alone(a_run, tmp_path, name):
    r = bagpipe(["plot", a_run, "--out", name], tmp_path, tmp_path / "f.png")
    assert r.returncode == 0, r.stderr
    picture = (tmp_path / "f.png").read_bytes()
    assert picture.startswith(b"\x89PNG\r\n\x1a\n") and picture.endswith(b"IEND\xaeB`\x82")  # nothing after it
    assert f"wrote the picture to standard output ({name})" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.png"]  # no file named -


@pytest.mark.parametrize("name", ["-", "/dev/stdout"])
def test_profile_to_standard_output_writes_the_npz_alone(tiny_data, tmp_path, name):
    args = ["profile", "--data", tiny_data, "--hot-budget-mb", 0.01, "--no-progress", "--out", name]
    r = bagpipe(args, tmp_path, tmp_path / "hot.npz")
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "hot.npz") as f:  # the archive alone: the report went to stderr
        assert len(f["rows"]) > 0
    assert "hot rows written to" in r.stderr and "lookups hot" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hot.npz"]
    # and train takes the file
    from bagpipe.accel.profile import HotSet
    from bagpipe.data.schema import DatasetMeta

    HotSet.load(tmp_path / "hot.npz", DatasetMeta.load(tiny_data).table_sizes)


def test_train_summary_json_dash_is_the_json_alone_on_stdout(tiny_data, tmp_path):
    args = ["train", "--data", tiny_data, "--out", "run", *TRAIN, "--summary-json", "-"]
    r = bagpipe(args, tmp_path, tmp_path / "s.json")
    assert r.returncode == 0, r.stderr
    summary = strict_json((tmp_path / "s.json").read_text())
    assert summary == strict_json((tmp_path / "run" / "summary.json").read_text())
    assert "run directory: run" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "s.json"]


def test_binary_output_to_a_terminal_and_two_things_on_stdout_are_refused(run_cli, a_run, tiny_data, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    rc, _, err = run_cli("plot", a_run, "--out", "-")
    assert one_line_error(rc, err, "plot") == (
        "--out -: standard output is a terminal, and a picture is binary: redirect it (> curves.png) or give a "
        "file name (e.g. --out curves.png)"
    )
    rc, _, err = run_cli("profile", "--data", tiny_data, "--hot-budget-mb", "0.01", "--out", "-")
    assert one_line_error(rc, err, "profile") == (
        "--out -: standard output is a terminal, and the hot rows are a binary .npz: redirect it (> hot.npz) "
        "or give a file name (e.g. --out hot.npz)"
    )
    monkeypatch.undo()
    rc, _, err = run_cli("profile", "--data", tiny_data, "--hot-budget-mb", "0.01", "--out", "-", "--json")
    assert one_line_error(rc, err, "profile") == (
        "--out - and --json both write to standard output; give --out a file name, or leave --json out "
        "(the report then goes to stderr)"
    )


def test_a_folder_output_refuses_dash(run_cli, tiny_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli("bench", "sweep", "--quick", "--out", "-")
    assert one_line_error(rc, err, "bench").startswith("--out -: a bench writes a folder")
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", "run", *TRAIN, "--tensorboard", "-")
    assert one_line_error(rc, err, "train").startswith("--tensorboard -: TensorBoard writes a folder")
    rc, _, err = run_cli("serve", "--store", "disk", "--store-dir", "-", "--trainers", 1, "--servers", 1, "--rank", 2)
    assert one_line_error(rc, err, "serve") == (
        "--store-dir -: the disk store is a folder, not standard output; give a folder"
    )
    assert list(tmp_path.iterdir()) == []


# -- plot's format is its suffix's --------------------------------------------------------------


@pytest.mark.parametrize(
    "name, head",
    [
        ("c.png", b"\x89PNG"),
        ("c.jpg", b"\xff\xd8\xff"),
        ("c.JPEG", b"\xff\xd8\xff"),
        ("c.pdf", b"%PDF-"),
        ("c.svg", b"<?xml"),
        ("c.tiff", b"II*\x00"),
        ("curves", b"\x89PNG"),  # no suffix: a PNG, as before
    ],
)
def test_plot_writes_the_format_of_its_suffix(run_cli, a_run, tmp_path, name, head):
    out = tmp_path / name
    rc, stdout, err = run_cli("plot", a_run, "--out", out)
    assert rc == 0 and stdout == f"wrote {out}\n", err
    assert out.read_bytes().startswith(head)
    rc, _, err = run_cli("plot", a_run, "--out", out)  # an earlier plot of the format is replaced
    assert rc == 0, err


def test_plot_refuses_a_suffix_of_no_picture_format_and_a_file_of_another_format(run_cli, a_run, tmp_path):
    rc, _, err = run_cli("plot", a_run, "--out", tmp_path / "c.gif")
    assert one_line_error(rc, err, "plot") == (
        f"--out {tmp_path / 'c.gif'}: .gif is not a picture format plot writes (.jpeg, .jpg, .pdf, .png, .svg, "
        f".tif, .tiff, .webp); give a file name with one of them (e.g. --out {tmp_path / 'c.png'})"
    )
    assert list(tmp_path.iterdir()) == []
    png_named_jpg = tmp_path / "c.jpg"
    assert run_cli("plot", a_run, "--out", tmp_path / "c.png")[0] == 0
    png_named_jpg.write_bytes((tmp_path / "c.png").read_bytes())
    rc, _, err = run_cli("plot", a_run, "--out", png_named_jpg)
    assert one_line_error(rc, err, "plot") == (
        f"--out {png_named_jpg}: the file exists and is not a picture bagpipe wrote (it is not a JPEG image); it is "
        "not replaced: choose another --out, or move the file away first"
    )
    assert png_named_jpg.read_bytes().startswith(b"\x89PNG")


def test_plot_to_a_pillow_format_without_pillow_says_so(run_cli, a_run, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "PIL" else real(name, *a))
    rc, _, err = run_cli("plot", a_run, "--out", tmp_path / "c.webp")
    assert one_line_error(rc, err, "plot") == (
        f"--out {tmp_path / 'c.webp'}: matplotlib writes WEBP through the pillow package, which is not installed: "
        "pip install pillow, or give a .png, .pdf or .svg name"
    )
    assert run_cli("plot", a_run, "--out", tmp_path / "c.pdf")[0] == 0


# -- bench sweep with nothing to measure ---------------------------------------------------------


def test_bench_sweep_with_nothing_measurable_is_refused_without_a_warning(run_cli, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rc, _, err = run_cli("bench", "sweep", "--quick", "--profile", "tiny", "--out", tmp_path / "sweep")
    assert one_line_error(rc, err, "bench") == (
        "bench sweep: nothing measurable at this size: the largest cache of --cache-percents (20% of 266 rows = 53) "
        "is smaller than the 217 unique rows a batch of 256 has, as is the auto-tuner's budget (2%); "
        "raise --scale or drop --profile tiny, or give --cache-percents of at least 82"
    )
    assert not [w for w in caught if "legend" in str(w.message)]
    assert not (tmp_path / "sweep" / "results.json").exists()
