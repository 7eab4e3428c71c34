"""``bagpipe plot``."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Draw the curves of one or several runs into one picture: training loss, eval AUC and
eval log loss against the step, one line per run, read from each RUN/metrics.jsonl (so
a run still training can be plotted). Evaluations appear at every --eval-every step of
the run and at its end.

The picture's format is that of --out's suffix: .png, .jpg/.jpeg, .pdf, .svg, .tif/.tiff
or .webp (a name without a suffix gets a PNG); --out - writes a PNG to standard output
(redirect it: a terminal is refused).

Examples:
  bagpipe plot runs/a --out a.png
  bagpipe plot runs/adagrad runs/adam --labels adagrad adam --out optimizers.pdf
  bagpipe plot runs/*/ --title "lr sweep" --out sweep.svg
  bagpipe plot runs/a --out - | display
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bagpipe.config.argtypes import path

    p.add_argument("runs", nargs="+", type=path, metavar="RUN", help="run directories written by bagpipe train")
    p.add_argument(
        "--out",
        required=True,
        type=path,
        metavar="FILE",
        help="the picture to write (exactly this file; its format by its suffix, PNG without one; -: standard output)",
    )
    p.add_argument("--labels", nargs="+", metavar="NAME", help="one legend name per run (default: the folder names)")
    p.add_argument("--title", help="a title above the panels")


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from bagpipe.errors import DataError
    from bagpipe.files import standard_fd
    from bagpipe.train.plot import plot_runs, read_metrics

    for r in args.runs:  # an empty picture is not written for a run that has nothing to draw
        if (Path(r) / "metrics.jsonl").is_file() and read_metrics(r) == ([], []):
            empty = (Path(r) / "metrics.jsonl").stat().st_size == 0
            why = "metrics.jsonl empty" if empty else "metrics.jsonl has no training or eval record"
            raise DataError(f"{r} has no metrics to plot ({why}); plot it once it has trained a logged step")
    out = plot_runs(args.runs, args.out, labels=args.labels, title=args.title)
    if standard_fd(out) == 1:  # the picture's own stream gets only the picture (`--out - > f.png`)
        print(f"wrote the picture to standard output ({args.out})", file=sys.stderr)
    else:
        print(f"wrote {out}")
    return 0
