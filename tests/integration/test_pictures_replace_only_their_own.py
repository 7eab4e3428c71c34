"""The pictures bagpipe writes replace only pictures bagpipe wrote, and go nowhere a data set's, an export's or a run's own files are.

* ``plot --out`` (and ``bench``'s NAME.png in its ``--out``) replaced any existing file
  that began with its format's header bytes -- a user's photo, a thesis PDF, a figure
  of their own -- and the refusal of any other file called it "an earlier plot". Every
  picture bagpipe writes now carries a mark (a PNG's Software text, a PDF's and an SVG's
  Creator, the EXIF Software tag of a JPEG, TIFF or WebP), and an existing file is
  replaced only when it carries it (or is empty); anything else is refused in one line
  saying what was found, its bytes kept. ``bench`` refuses before anything runs; the one
  helper every picture is saved through (:func:`bagpipe.train.plot.save_figure`) refuses
  too.
* ``plot --out`` wrote into a data set, an export or a run's checkpoint folder, which every
  other output refuses (a later ``synth --overwrite`` or ``export --overwrite`` was then
  blocked by the stray picture): refused in one line, nothing written.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TRAIN = ("--steps", 8, "--batch-size", 64, "--no-progress", "--threads", 1, "--eval-samples", 256)
FORMATS = {"png": "png", "jpg": "jpeg", "pdf": "pdf", "svg": "svg", "tiff": "tiff", "webp": "webp"}
NAMES = {"png": "a PNG image", "jpeg": "a JPEG image", "pdf": "a PDF document", "svg": "an SVG image"}
NAMES |= {"tiff": "a TIFF image", "webp": "a WebP image"}


def one_line_error(rc: int, err: str, command: str) -> str:
    """The one ``bagpipe COMMAND: error:`` line of a refusal (exit 2, no traceback), less its prefix."""
    assert rc == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"bagpipe {command}: error: ")]
    assert len(lines) == 1, err
    return lines[0].split(": error: ", 1)[1]


def a_figure_of_the_users(path: Path, fmt: str) -> None:
    """A picture of ``fmt`` the user made with matplotlib (its own stamp, not bagpipe's)."""
    from bagpipe.train.plot import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([1, 3, 2])
    fig.savefig(path, format=fmt)
    plt.close(fig)


def a_photo(path: Path, fmt: str) -> None:
    """A picture of ``fmt`` another program (pillow) wrote, with an EXIF Software tag of its own."""
    from PIL import Image

    exif = Image.Exif()
    exif[0x0131] = "my camera"
    Image.new("RGB", (8, 8), (200, 30, 30)).save(path, format=fmt, exif=exif.tobytes())


@pytest.fixture(scope="module")
def a_run(tiny_data, tmp_path_factory) -> Path:
    from bagpipe.cli import main

    run = tmp_path_factory.mktemp("pictures") / "run"
    assert main(["train", "--data", tiny_data, "--out", str(run), "--checkpoint-every", "4", *map(str, TRAIN)]) == 0
    return run


@pytest.mark.parametrize("suffix", list(FORMATS))
def test_plot_refuses_a_picture_it_did_not_write_and_replaces_its_own(run_cli, a_run, tmp_path, suffix):
    from bagpipe.train.plot import has_mark

    fmt = FORMATS[suffix]
    users = tmp_path / f"mine.{suffix}"
    a_figure_of_the_users(users, fmt)
    before = users.read_bytes()
    rc, _, err = run_cli("plot", a_run, "--out", users)
    assert one_line_error(rc, err, "plot") == (
        f"--out {users}: the file exists and is not a picture bagpipe wrote (it is {NAMES[fmt]} without "
        "bagpipe's mark); it is not replaced: choose another --out, or move the file away first"
    )
    assert users.read_bytes() == before
    ours = tmp_path / f"curves.{suffix}"
    for _ in range(2):  # the rerun replaces the earlier plot
        rc, stdout, err = run_cli("plot", a_run, "--out", ours)
        assert rc == 0 and stdout == f"wrote {ours}\n", err
        assert has_mark(ours, fmt)
    assert not has_mark(users, fmt)


@pytest.mark.parametrize("suffix", ["jpg", "tiff", "webp", "png"])
def test_plot_refuses_a_photo(run_cli, a_run, tmp_path, suffix):
    fmt = FORMATS[suffix]
    photo = tmp_path / f"holiday.{suffix}"
    a_photo(photo, fmt)
    before = photo.read_bytes()
    rc, _, err = run_cli("plot", a_run, "--out", photo)
    assert f"(it is {NAMES[fmt]} without bagpipe's mark); it is not replaced" in one_line_error(rc, err, "plot")
    assert photo.read_bytes() == before


def test_plot_refuses_a_hand_written_pdf_and_svg_and_replaces_an_empty_file(run_cli, a_run, tmp_path):
    thesis = tmp_path / "thesis.pdf"
    thesis.write_bytes(b"%PDF-1.4\n% my thesis draft\n1 0 obj <<>> endobj\ntrailer << /Creator (me) >>\n%%EOF\n")
    drawing = tmp_path / "drawing.svg"
    drawing.write_bytes(
        b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"><title>bagpipe</title></svg>\n'
    )
    for path in (thesis, drawing):
        before = path.read_bytes()
        rc, _, err = run_cli("plot", a_run, "--out", path)
        assert "without bagpipe's mark); it is not replaced" in one_line_error(rc, err, "plot")
        assert path.read_bytes() == before
    empty = tmp_path / "touched.png"
    empty.touch()  # nothing to lose
    assert run_cli("plot", a_run, "--out", empty)[0] == 0
    assert empty.read_bytes().startswith(b"\x89PNG")
    notes = tmp_path / "notes.png"
    notes.write_text("not a picture\n")
    rc, _, err = run_cli("plot", a_run, "--out", notes)
    assert "is not a picture bagpipe wrote (it is not a PNG image); it is not replaced" in one_line_error(
        rc, err, "plot"
    )
    assert notes.read_text() == "not a picture\n"


def test_plot_refuses_a_data_set_an_export_and_a_runs_own_folders(run_cli, a_run, tiny_data, tmp_path):
    data = Path(tiny_data)
    before = sorted(p.name for p in data.iterdir())
    rc, _, err = run_cli("plot", a_run, "--out", data / "x.png")
    assert one_line_error(rc, err, "plot") == (
        f"--out {data / 'x.png'} lies inside the data set {data.resolve()}: the picture would be mixed with the data "
        "set's, and a later --overwrite of it would be refused; choose a --out outside it"
    )
    assert sorted(p.name for p in data.iterdir()) == before
    export = tmp_path / "exports" / "ck"
    export.mkdir(parents=True)
    (export / "model.json").write_text("{}")  # what tells an export
    rc, _, err = run_cli("plot", a_run, "--out", export / "curves.png")
    assert f"lies inside the export {export.resolve()}" in one_line_error(rc, err, "plot")
    checkpoint = next(p for p in (a_run / "checkpoints").iterdir() if p.name.startswith("step-"))
    rc, _, err = run_cli("plot", a_run, "--out", checkpoint / "c.png")  # a checkpoint is a whole output (round 20)
    assert one_line_error(rc, err, "plot") == (
        f"--out {checkpoint / 'c.png'} lies inside the checkpoint {checkpoint.resolve()}: the picture would be mixed "
        "with the checkpoint's, and its run removes whatever lies in a checkpoint it prunes; choose a --out outside it"
    )
    for inside in (a_run / "checkpoints" / "c.png", a_run / "logs" / "new" / "c.png"):
        rc, _, err = run_cli("plot", a_run, "--out", inside)
        assert one_line_error(rc, err, "plot") == (
            f"--out {inside} lies among the own files of the run {a_run.resolve()} (its checkpoints, store, "
            "logs...): the picture would be mixed with them; choose an --out outside them"
        )
        assert not inside.exists()
    assert not (a_run / "logs" / "new").exists()
    assert list(export.iterdir()) == [export / "model.json"]
    rc, stdout, err = run_cli("plot", a_run, "--out", a_run / "curves.png")  # beside the run's files: its own
    assert rc == 0 and stdout == f"wrote {a_run / 'curves.png'}\n", err


def test_bench_refuses_a_png_it_did_not_write_before_anything_runs(run_cli, tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    photo = proj / "oracle.png"
    a_figure_of_the_users(photo, "png")
    before = photo.read_bytes()
    rc, stdout, err = run_cli("bench", "oracle", "--quick", "--out", proj)
    assert one_line_error(rc, err, "bench") == (
        f"--out {proj}: {photo}: the file exists and is not a picture bagpipe wrote (it is a PNG image without "
        "bagpipe's mark); it is not replaced: choose another --out"
    )
    assert "[rep" not in stdout and sorted(proj.iterdir()) == [photo] and photo.read_bytes() == before


def test_save_png_is_the_last_guard_and_replaces_its_own(tmp_path):
    from bagpipe.commands.bench import check_out, mark_out
    from bagpipe.errors import DataError
    from bagpipe.train.plot import has_mark, pyplot, save_png

    plt = pyplot()
    photo = tmp_path / "oracle.png"
    a_figure_of_the_users(photo, "png")
    before = photo.read_bytes()
    with pytest.raises(DataError, match=re.escape(f"{photo}: the file exists and is not a picture bagpipe wrote")):
        save_png(plt.subplots()[0], photo)
    assert photo.read_bytes() == before
    ours = tmp_path / "bench" / "sweep.png"
    for _ in range(2):  # a rerun of a bench into its own --out
        check_out(ours.parent, "sweep.png")
        mark_out(ours.parent)
        save_png(plt.subplots()[0], ours)
        assert has_mark(ours, "png")
    assert plt.get_fignums() == []  # every figure closed, the refused one too


def test_every_scenario_plots_to_its_own_name():
    """``bench`` checks OUT/SCENARIO.png before it runs: the name each scenario saves its plot as."""
    import bagpipe.bench.scenarios as scenarios
    from bagpipe.bench.registry import SCENARIOS

    root = Path(scenarios.__file__).parent
    saved = {m for p in root.rglob("*.py") for m in re.findall(r'save_png\(fig, out / "([^"]+)"\)', p.read_text())}
    assert saved == {f"{name}.png" for name in SCENARIOS}
