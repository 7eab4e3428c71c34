"""Curves of finished (or running) runs from their metrics.jsonl, drawn to a PNG: ``bagpipe plot``.

Three panels against the step, one line per run: the training loss (the mean of the
last logged steps, as metrics.jsonl records it), the eval AUC and the eval log loss at
every evaluation (``--eval-every``; at least the final one). Also the matplotlib
helpers the benchmark reports use (file-only Agg backend).
"""

from __future__ import annotations

import json
from pathlib import Path

from bagpipe.errors import DataError
from bagpipe.files import is_standard_stream


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
    which appears only complete."""
    from bagpipe.files import atomic_file

    fig.tight_layout()
    try:
        with atomic_file(path, "wb") as f:
            fig.savefig(f, dpi=110, format="png")
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
        elif rec.get("eval_auc") is not None:
            evals.append(rec)
    return train, evals


def is_png(path: Path) -> bool:
    """Whether ``path`` starts with the PNG signature (a picture an earlier plot wrote)."""
    try:
        with open(path, "rb") as f:
            return f.read(8) == b"\x89PNG\r\n\x1a\n"
    except OSError:
        return False


def plot_runs(
    runs: list[str | Path], out: str | Path, labels: list[str] | None = None, title: str | None = None
) -> Path:
    """Draw the curves of ``runs`` (labelled by ``labels``, default their folder names) into PNG ``out``."""
    labels = labels or [Path(r).name or str(r) for r in runs]
    if len(labels) != len(runs):
        raise DataError(f"{len(labels)} labels for {len(runs)} runs")
    if str(out) == "-":  # standard output elsewhere (predict); a PNG is written to a file
        raise DataError(
            "--out -: plot writes a PNG file, not to standard output; give a file name (e.g. --out curves.png)"
        )
    out = Path(out)
    if out.is_dir():
        raise DataError(f"--out {out}: is a directory; give the PNG file to write (e.g. {out / 'curves.png'})")
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise DataError(f"--out {out}: {above} is a file, not a folder; choose another --out")
    if out.is_file() and not is_png(out) and not is_standard_stream(out):  # `--out /dev/stdout > f.png`: f.png
        # a run's summary.json, a data file...: replacing it with a picture loses it
        raise DataError(
            f"--out {out}: the file exists and is not a PNG image (an earlier plot); it is not replaced: "
            "choose another --out"
        )
    data = [read_metrics(r) for r in runs]
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for label, (train, evals) in zip(labels, data):
        axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], label=label)
        axes[1].plot([r["step"] for r in evals], [r["eval_auc"] for r in evals], marker="o", label=label)
        axes[2].plot([r["step"] for r in evals], [r["eval_logloss"] for r in evals], marker="o", label=label)
    for ax, name in zip(axes, ("training log loss", "eval AUC", "eval log loss")):
        ax.set_xlabel("step")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        legend(ax, fontsize=8)
    if title:
        fig.suptitle(title)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        save_png(fig, out)
    except OSError as e:
        raise DataError(f"--out {out}: cannot write it ({e.strerror or e}); choose another --out") from None
    return out
