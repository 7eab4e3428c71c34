"""``bagpipe predict``."""

from __future__ import annotations

import argparse
import os

DESCRIPTION = """\
Score raw log lines with an exported model (`bagpipe export`): one click probability
per input line, in input order, written to --out (default: standard output).

Lines are parsed, their dense values transformed and their categories mapped to ids by
the preprocessing code, with the vocabulary (or hashing) the training data was
preprocessed with: a category never seen in training gets row 0, as in preprocessing.
The input is the format the model was trained on (--format defaults to it), plain or
gzip, a file or a stream read once as it comes: --input - (standard input), /dev/stdin,
a named pipe or <(zcat day_23.gz). Bad lines stop the run naming FILE:LINE: problem (--on-error fail, the default)
or are skipped and counted, writing nan on their line (--on-error skip); the --out
file appears only once complete.

An existing --out file is replaced only when it is an earlier predictions file: empty,
or every line of its first 64 KiB a probability in [0, 1] as predict writes them (%.9g,
nan for a skipped line) -- not a column of only 0s and 1s (labels). Anything else (a log,
notes, the input under another name) is refused before anything is scored: choose another
--out. A device, a pipe and standard output (-, the default) are written as they are;
standard output that is the --input file itself (`>> FILE`, `> FILE`) is refused.

With --labelled the lines carry the label column (as training data does) and the
command also reports log loss, AUC, normalized entropy, calibration and accuracy over
them, the figures of `bagpipe eval`.

Examples:
  bagpipe predict --model exports/criteo --input test.txt --out test.pred
  bagpipe predict --model exports/criteo --input day_23.gz --labelled --out /dev/null
  bagpipe predict --model exports/avazu --format avazu --input test_1k.csv --on-error skip
  zcat day_23.gz | bagpipe predict --model exports/criteo --input - --out day_23.pred
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bagpipe.config.argtypes import count, given_once, path
    from bagpipe.preprocess.registry import FORMATS

    p.add_argument(
        "--model", required=True, type=path, metavar="DIR", help="export directory written by bagpipe export"
    )
    p.add_argument(
        "--input",
        required=True,
        type=path,
        metavar="FILE",
        action=given_once(
            "predict scores one input; run it once per file, or join them into one stream: cat A B | bagpipe "
            "predict ... --input -"
        ),
        help="raw log file (plain or gzip); - reads standard input",
    )
    p.add_argument(
        "--format", choices=list(FORMATS), help="raw format of --input (default: the model's training data's)"
    )
    p.add_argument(
        "--out",
        default="-",
        type=path,
        metavar="FILE",
        help="where the probabilities go, one per line (default: stdout); never the input or inside the model; "
        "an existing file is replaced only when it is an earlier predictions file (see above)",
    )
    p.add_argument(
        "--labelled",
        action="store_true",
        help="the lines start with a label column, as training lines do; also report the eval figures",
    )
    p.add_argument("--no-header", action="store_true", help="CSV formats: the first line is data, never a header")
    p.add_argument(
        "--on-error",
        choices=("fail", "skip"),
        default="fail",
        help="a bad line stops the run naming file and line (fail, default) or is skipped, writing nan (skip)",
    )
    p.add_argument(
        "--block-kb",
        type=count(1, 1 << 20),
        default=1024,
        metavar="KB",
        help="input read and scored per batch, in KiB of text (default: 1024); a line's probability is computed "
        "in its block's batch, so another size can change its last digits (float32 rounding)",
    )


def export_folder(given: str) -> str:
    """The export folder ``--model`` names: the folder itself, or its model.json (the
    folder is used); any other file is one line saying to give the folder."""
    from pathlib import Path

    from bagpipe.errors import ConfigError
    from bagpipe.export.write import MANIFEST

    p = Path(given)
    if not p.is_file():
        return given  # a folder, or nothing there: the export's own checks say what is wrong
    if p.name == MANIFEST:
        return str(p.parent)
    raise ConfigError(
        f"--model {given}: a file; give the folder `bagpipe export --out` wrote (the one that holds {MANIFEST})"
    )


def refuse_stdout_is_input(out: str, given: str) -> None:
    """Refuse, in one line and before anything is read, standard output (``--out -``, the
    default, /dev/stdout; or /dev/stderr) that is the ``--input`` file itself -- a shell's
    ``>> f`` or ``> f`` with ``--input f`` (or ``--input - < f``): the file would take the
    probabilities, and be read back as input lines (``--on-error skip`` then grows it
    forever). One regular file: the same device and inode (fd 0 for ``-``)."""
    import fcntl
    import stat

    from bagpipe.errors import ConfigError
    from bagpipe.files import standard_fd

    fd = 1 if out == "-" else standard_fd(out)
    if fd is None:
        return
    try:
        written = os.fstat(fd)
        read = os.fstat(0) if given == "-" else os.stat(given)
    except OSError:
        return  # no such stream or input: the input's own checks say what is wrong
    if not (stat.S_ISREG(written.st_mode) and stat.S_ISREG(read.st_mode)):
        return
    if (written.st_dev, written.st_ino) != (read.st_dev, read.st_ino):
        return
    on_stdin = given == "-" or os.path.abspath(given) in ("/dev/stdin", "/dev/fd/0", "/proc/self/fd/0")
    subject, shown = ("the file on standard input", "FILE") if on_stdin else (f"the input file {given}", given)
    stream = "standard output" if fd == 1 else "standard error"
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND:
        how = f" (>> {shown}?): writing it would destroy an input"
    elif written.st_size == 0:
        how = f" (> {shown}?), which the shell emptied before bagpipe started: nothing is left to score"
    else:
        how = ": writing it would destroy an input"
    raise ConfigError(f"{stream} is {subject}{how}; redirect the output to another file, or give --out")


def run(args: argparse.Namespace) -> int:
    import contextlib
    import sys

    from bagpipe.errors import ConfigError
    from bagpipe.export.model import load
    from bagpipe.export.score import is_predictions_file, predict_file
    from bagpipe.files import atomic_file, check_out_file

    args.model = export_folder(args.model)
    refuse_stdout_is_input(args.out, args.input)
    out = (
        None
        if args.out == "-"
        else check_out_file(
            args.out,
            "--out",
            {"--input": [args.input], "--model": [args.model]},
            own=("an earlier predictions file (one probability a line)", is_predictions_file),
        )
    )
    model = load(args.model)
    if args.format is not None and args.format != model.raw_format_name:
        raise ConfigError(f"{args.model} was trained on {model.raw_format_name} data, not {args.format}")
    # a file appears only complete: written under a temporary name, renamed at the end
    with contextlib.ExitStack() as stack:
        stream = sys.stdout if out is None else stack.enter_context(atomic_file(out))
        result = predict_file(
            model,
            args.input,
            stream,
            labelled=args.labelled,
            header="no" if args.no_header else "auto",
            on_error=args.on_error,
            block_bytes=args.block_kb << 10,
        )
    from bagpipe.files import is_standard_stream

    # the predictions' own stream gets only predictions (`--out /dev/stdout > preds.txt`)
    beside = out is None or is_standard_stream(out)
    print(result.line(args.input), file=sys.stderr if beside else sys.stdout)
    return 0
