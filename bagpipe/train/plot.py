"""Curves of finished (or running) runs from their metrics.jsonl, drawn to a picture: ``bagpipe plot``.

Three panels against the step, one line per run: the training loss (the mean of the
last logged steps, as metrics.jsonl records it), the eval AUC and the eval log loss at
every evaluation (``--eval-every``; at least the final one). Also the matplotlib
helpers the benchmark reports use (file-only Agg backend).
"""

from __future__ import annotations

import json
from pathlib import Path

from bagpipe.errors import DataError
from bagpipe.files import (
    bagpipe_folder,
    dash_is_stdout,
    is_standard_stream,
    refuse_inside_output,
    refuse_unnamable,
    standard_fd,
)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def legend(ax, **kwargs) -> None:
    """``ax.legend(**kwargs)`` when ``ax`` has a labelled artist to list; nothing otherwise
    (matplotlib would draw an empty box and warn "No artists with labels found")."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def save_png(fig, path: Path) -> None:
    """Lay out, write and close a figure: a PNG at exactly ``path`` (no suffix added),
    which appears only complete; an existing file there is replaced only when bagpipe
    wrote it (:func:`save_figure`)."""
    save_figure(fig, path, "png")


def save_figure(fig, path: Path, fmt: str) -> None:
    """Lay out, write and close a figure: a picture of ``fmt`` (matplotlib's name: png,
    jpeg, pdf, svg, ...) at exactly ``path``, which appears only complete and carries
    :data:`MARK`. Every picture bagpipe saves goes through here: an existing file at
    ``path`` that bagpipe did not write (:func:`foreign_picture`) is a one-line DataError
    and kept (the commands refuse it before anything runs; this is the last guard)."""
    from bagpipe.files import atomic_file

    try:
        why = foreign_picture(path, fmt)
        if why is not None:
            raise DataError(f"{path}: {refusal(why)}")
        if fig.get_layout_engine() is None:  # a figure laid out as it is drawn (constrained) keeps its own
            fig.tight_layout()
        with atomic_file(path, "wb") as f:
            fig.savefig(f, dpi=110, format=fmt, **mark_options(fmt))
    finally:
        pyplot().close(fig)


def read_metrics(run: str | Path) -> tuple[list[dict], list[dict]]:
    """(training records, evaluation records) of ``run``'s metrics.jsonl; a line that is
    not JSON is a DataError naming file and line (the last line may be cut off by a
    run that is still writing it: that one is dropped)."""
    path = Path(run) / "metrics.jsonl"
    if not path.exists():
        raise DataError(f"{run}: no metrics.jsonl (not a bagpipe run directory, or it has not started)")
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()  # a crash may leave any bytes
    train, evals = [], []
    for i, text in enumerate(lines, 1):
        try:
            rec = json.loads(text)
        except json.JSONDecodeError:
            if i == len(lines):
                break
            raise DataError(f"{path}:{i}: not a JSON record") from None
        if not isinstance(rec, dict):
            raise DataError(f"{path}:{i}: not a record (a JSON {type(rec).__name__}, not an object)")
        if "loss" in rec:
            train.append(rec)
        elif rec.get("eval_auc") is not None or rec.get("eval_logloss") is not None:
            evals.append(rec)  # a figure that was not finite is null (bagpipe.jsonout): a gap in its curve
    return train, evals


#: The picture formats ``bagpipe plot --out`` writes, by the suffix of the file (matplotlib's
#: names); a name without a suffix, and standard output, get a PNG.
PICTURE_FORMATS = {
    ".png": "png",
    ".jpg": "jpeg",
    ".jpeg": "jpeg",
    ".pdf": "pdf",
    ".svg": "svg",
    ".tif": "tiff",
    ".tiff": "tiff",
    ".webp": "webp",
}
#: The formats matplotlib writes through pillow.
PILLOW_FORMATS = frozenset({"jpeg", "tiff", "webp"})
#: How a file of each format begins.
SIGNATURES = {
    "png": (b"\x89PNG\r\n\x1a\n",),
    "jpeg": (b"\xff\xd8\xff",),
    "pdf": (b"%PDF-",),
    "svg": (b"<?xml", b"<svg"),
    "tiff": (b"II*\x00", b"MM\x00*"),
    "webp": (b"RIFF",),
}
#: What a format is called in a message.
FORMAT_NAMES = {
    "png": "a PNG image",
    "jpeg": "a JPEG image",
    "pdf": "a PDF document",
    "svg": "an SVG image",
    "tiff": "a TIFF image",
    "webp": "a WebP image",
}
#: The mark every picture bagpipe writes carries, which tells its own earlier picture from
#: a user's file of the same format (a photo, a thesis PDF): a PNG's ``Software`` text, a
#: PDF's and an SVG's ``Creator``, the EXIF ``Software`` tag of a JPEG, TIFF or WebP.
MARK = "bagpipe"
#: The EXIF tag ``Software``.
EXIF_SOFTWARE = 0x0131


def mark_options(fmt: str) -> dict:
    """The ``savefig`` options that write :data:`MARK` into a picture of ``fmt``."""
    if fmt == "png":
        return {"metadata": {"Software": MARK}}
    if fmt in ("pdf", "svg"):
        return {"metadata": {"Creator": MARK}}
    if fmt in PILLOW_FORMATS:
        from PIL import Image

        exif = Image.Exif()
        exif[EXIF_SOFTWARE] = MARK
        return {"pil_kwargs": {"exif": exif.tobytes()}}
    return {}


def is_picture(path: Path, fmt: str = "png") -> bool:
    """Whether ``path`` begins as a ``fmt`` picture does (whoever wrote it)."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return False
    return head.startswith(SIGNATURES[fmt]) and (fmt != "webp" or head[8:12] == b"WEBP")


def has_mark(path: Path, fmt: str) -> bool:
    """Whether the ``fmt`` picture ``path`` carries :data:`MARK` (:func:`mark_options`): it
    is one bagpipe wrote. Reads its header (PNG, JPEG, TIFF, WebP: through pillow, which
    matplotlib requires), its first 64 KiB (SVG: the metadata leads) or its last MiB (PDF:
    the info dictionary trails)."""
    import re

    try:
        if fmt == "svg":
            with open(path, "rb") as f:
                head = f.read(1 << 16)
            return (
                re.search(rb"<dc:creator>\s*<cc:Agent>\s*<dc:title>" + MARK.encode() + b"</dc:title>", head) is not None
            )
        if fmt == "pdf":
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - (1 << 20)))
                tail = f.read()
            return b"/Creator (" + MARK.encode() + b")" in tail
        import warnings

        from PIL import Image

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a large photo: pillow's decompression bomb warning
            with Image.open(path) as im:
                if fmt == "png":
                    return im.info.get("Software") == MARK
                return im.getexif().get(EXIF_SOFTWARE) == MARK
    except Exception:  # noqa: BLE001 - a file pillow cannot read (cut off, not an image) is no picture of ours
        return False


def foreign_picture(path: Path, fmt: str) -> str | None:
    """What stands at ``path`` that a ``fmt`` picture may not replace -- "it is not a PDF
    document", "it is a PNG image without bagpipe's mark" -- or None: nothing there,
    an empty file, standard output or another device (written directly), or a picture
    bagpipe wrote (:func:`has_mark`)."""
    path = Path(path)
    if not path.is_file() or is_standard_stream(path):  # `--out - > f.png`: f.png is the shell's
        return None
    try:
        if path.stat().st_size == 0:
            return None  # `touch curves.png`: nothing to lose
    except OSError:
        return None
    name = FORMAT_NAMES[fmt]
    if not is_picture(path, fmt):
        return f"it is not {name}"
    if not has_mark(path, fmt):
        return f"it is {name} without bagpipe's mark"
    return None


def refusal(why: str) -> str:
    """The words of a refusal to replace a file :func:`foreign_picture` found foreign."""
    return f"the file exists and is not a picture bagpipe wrote ({why}); it is not replaced"


def picture_format(out: Path, given: str) -> str:
    """The format ``bagpipe plot`` writes to ``out`` (``given``: the --out the user typed):
    that of its suffix, PNG without one or on standard output; a one-line DataError for
    a suffix of no picture format, or one that needs pillow where it is not installed."""
    if is_standard_stream(out) or not out.suffix:
        return "png"
    fmt = PICTURE_FORMATS.get(out.suffix.lower())
    if fmt is None:
        names = ", ".join(sorted(PICTURE_FORMATS))
        raise DataError(
            f"--out {given}: {out.suffix} is not a picture format plot writes ({names}); "
            f"give a file name with one of them (e.g. --out {out.with_suffix('.png')})"
        )
    if fmt in PILLOW_FORMATS:
        import importlib.util

        if importlib.util.find_spec("PIL") is None:
            raise DataError(
                f"--out {given}: matplotlib writes {fmt.upper()} through the pillow package, which is not "
                f"installed: pip install pillow, or give a .png, .pdf or .svg name"
            )
    return fmt


def plot_target(given: str | Path) -> tuple[Path, str]:
    """The file ``bagpipe plot --out GIVEN`` writes and its format, after every refusal
    (one line each): ``-`` is standard output (unless it is a terminal: a picture is
    binary), as /dev/stdout is; a folder, a path under a file, an existing file that is
    not a picture of the format bagpipe wrote (:func:`foreign_picture`: it is not
    replaced), a path in a data set, an export or among a run's own files (its
    checkpoints: :func:`bagpipe.files.bagpipe_folder`), a suffix of no picture format."""
    import sys

    out = Path(dash_is_stdout(str(given)))
    if standard_fd(out) == 1 and sys.stdout.isatty():
        raise DataError(
            f"--out {given}: standard output is a terminal, and a picture is binary: redirect it "
            "(> curves.png) or give a file name (e.g. --out curves.png)"
        )
    if out.is_dir():
        raise DataError(f"--out {given}: is a directory; give the picture file to write (e.g. {out / 'curves.png'})")
    refuse_unnamable(out, "--out")
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise DataError(f"--out {given}: {above} is a file, not a folder; choose another --out")
    known = PICTURE_FORMATS.get(out.suffix.lower(), "png")
    why = foreign_picture(out, known)
    if why is not None:  # a run's summary.json, a user's photo or thesis: replacing it loses it
        raise DataError(f"--out {given}: {refusal(why)}: choose another --out, or move the file away first")
    if not is_standard_stream(out):
        refuse_inside_output(out, "--out", "the picture")
        owner = bagpipe_folder(out)
        if owner is not None:  # RUN/checkpoints/..., RUN/store/...: beside the run's own files is fine
            raise DataError(
                f"--out {given} lies among the own files of {owner} (its checkpoints, store, logs...): the picture "
                "would be mixed with them; choose an --out outside them"
            )
    return out, picture_format(out, str(given))


#: Line styles a run's colour is combined with: tab10's ten colours x these four tell 40 runs apart.
LINE_STYLES = ("-", "--", ":", "-.")


def run_style(i: int) -> dict:
    """The colour and line style of the ``i``-th run of a plot: no two of the first 40 alike."""
    return {"color": f"C{i % 10}", "linestyle": LINE_STYLES[(i // 10) % len(LINE_STYLES)]}


def plot_runs(
    runs: list[str | Path], out: str | Path, labels: list[str] | None = None, title: str | None = None
) -> Path:
    """Draw the curves of ``runs`` (labelled by ``labels``, default their folder names) into
    the picture ``out`` (its format by its suffix, PNG without one; ``-``: a PNG on
    standard output); returns the path written (/dev/stdout for ``-``)."""
    labels = labels or [Path(r).name or str(r) for r in runs]
    if len(labels) != len(runs):
        raise DataError(f"{len(labels)} labels for {len(runs)} runs")
    given = out
    out, fmt = plot_target(out)
    data = [read_metrics(r) for r in runs]
    plt = pyplot()
    columns = min(len(runs), 4)
    rows = -(-len(runs) // columns) if runs else 0
    # one legend below the panels, as tall as its rows (one in each panel hid the curves
    # past ten runs, and was cut off at forty: newcomer round 22)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2 + 0.2 * rows), layout="constrained")
    for i, (label, (train, evals)) in enumerate(zip(labels, data)):
        style = run_style(i)
        axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], label=label, **style)
        axes[1].plot([r["step"] for r in evals], [r["eval_auc"] for r in evals], marker="o", **style)
        axes[2].plot([r["step"] for r in evals], [r["eval_logloss"] for r in evals], marker="o", **style)
    for ax, name in zip(axes, ("training log loss", "eval AUC", "eval log loss")):
        ax.set_xlabel("step")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    if runs:
        fig.legend(loc="outside lower center", ncols=columns, fontsize=8)
    if title:
        fig.suptitle(title)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        save_figure(fig, out, fmt)
    except OSError as e:
        raise DataError(f"--out {given}: cannot write it ({e.strerror or e}); choose another --out") from None
    return out
