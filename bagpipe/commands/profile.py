"""``bagpipe profile``."""

from __future__ import annotations

import argparse
from typing import TextIO

DESCRIPTION = """\
Find a dataset's hot rows: count the row accesses over a seeded sample of the train
split, keep the most accessed rows that fit a memory budget (each row with its
optimizer state: 4 x (D + S) bytes), and report the share of lookups they serve and the
share of inputs whose lookups are all hot, per table and overall (FAE's profiling step).

The hot rows stay in the trainer for a whole run: pass the file to
`bagpipe train --hot-rows FILE` with --mode fae, hotline, lookahead, lru or nocache
(or give the run --hot-budget-mb M and it profiles at start-up, the same way).

The sample is a seeded choice of 1,024-input blocks, --sample-rate of each shard's
blocks (at least one); the same options give the same rows.

An existing --out file is replaced only when it is an earlier hot-row file (the .npz
archive of rows and report this command writes); anything else is refused before
anything is read: choose another --out.

Examples:
  bagpipe profile --data data/ck --hot-budget-mb 256
  bagpipe profile --data data/ck --hot-budget-mb 64 --sample-rate 1 --out runs/hot-64.npz
  bagpipe train --data data/ck --mode lookahead --hot-rows runs/hot-64.npz --out runs/la-hot
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bagpipe.config.argtypes import count, path, real
    from bagpipe.config.sections import MAX_DIM

    p.add_argument(
        "--data", required=True, type=path, metavar="DIR", help="dataset directory (its train split is profiled)"
    )
    p.add_argument(
        "--hot-budget-mb",
        required=True,
        type=real(0, lo_open=True),
        metavar="M",
        help="memory for the hot rows and their optimizer state, in MiB (required; FAE's paper used 256)",
    )
    p.add_argument(
        "--sample-rate",
        type=real(0, 1, lo_open=True),
        default=0.05,
        metavar="F",
        help="share of the train split to read, in (0, 1] (default: 0.05, FAE's)",
    )
    p.add_argument("--seed", type=count(0), default=0, help="seeds the choice of sampled blocks (default: 0)")
    p.add_argument(
        "--embedding-dim",
        type=count(1, MAX_DIM),  # train's bound: a profile for a larger D could never be used
        default=8,
        metavar="D",
        help="D of the run the rows are for (default: 8, that of train's default --recipe debug; kaggle has 16)",
    )
    from bagpipe.optim.names import OPTIMIZER_NAMES

    p.add_argument(
        "--optimizer",
        choices=OPTIMIZER_NAMES,
        default="adagrad",
        help="the run's optimizer: its per-row state (S: sgd 0, adagrad 1, adam 2D, "
        "partial_rowwise_adam D+1) counts against the budget",
    )
    p.add_argument(
        "--out",
        type=path,
        metavar="FILE",
        help="write the hot rows here (.npz) for `bagpipe train --hot-rows` (-: standard output; the report "
        "then goes to stderr); an existing file is replaced only when it is an earlier hot-row file",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument("--no-progress", action="store_true", help="do not show progress bars")


def check_out(args: argparse.Namespace) -> TextIO:
    """Refuse, in one line and before anything is read, an ``--out`` that cannot be written
    (:func:`bagpipe.files.check_out_file`), or an existing file that is not an earlier
    hot-row file (:func:`bagpipe.accel.profile.is_hot_row_file`: it is not replaced);
    ``-`` is standard output, as /dev/stdout is, refused where it is a terminal (the .npz
    is binary) or where ``--json`` prints there too. Returns where the report goes:
    stderr when the rows go to stdout."""
    import sys

    from bagpipe.accel.profile import is_hot_row_file
    from bagpipe.errors import ConfigError
    from bagpipe.files import check_out_file, dash_is_stdout, standard_fd

    if not args.out:
        return sys.stdout
    given, args.out = args.out, dash_is_stdout(args.out)
    if standard_fd(args.out) != 1:
        own = ("a hot-row file (an earlier `bagpipe profile --out`)", is_hot_row_file)
        check_out_file(args.out, "--out", {"--data": [args.data]}, own=own)
        return sys.stdout
    if args.json:
        raise ConfigError(
            f"--out {given} and --json both write to standard output; give --out a file name, or leave --json out "
            "(the report then goes to stderr)"
        )
    if sys.stdout.isatty():
        raise ConfigError(
            f"--out {given}: standard output is a terminal, and the hot rows are a binary .npz: redirect it "
            "(> hot.npz) or give a file name (e.g. --out hot.npz)"
        )
    return sys.stderr


def run(args: argparse.Namespace) -> int:
    from bagpipe.accel.profile import profile
    from bagpipe.data.shards import Dataset
    from bagpipe.jsonout import json_text
    from bagpipe.optim.names import row_state_dim

    given = args.out
    report = check_out(args)
    state_dim = row_state_dim(args.optimizer, args.embedding_dim)
    hot = profile(
        Dataset(args.data),
        args.hot_budget_mb,
        dim=args.embedding_dim,
        state_dim=state_dim,
        sample_rate=args.sample_rate,
        seed=args.seed,
        progress=not args.no_progress,
    )
    if args.out:
        hot.save(args.out)
    r = hot.report
    if args.json:
        print(json_text({k: v for k, v in r.items() if k != "table_sizes"}, indent=2))
    else:
        print(f"{'table':<12}{'rows':>12}{'hot rows':>12}{'lookups hot':>13}{'inputs hot':>12}", file=report)
        for t in r["tables"]:
            print(
                f"{t['table']:<12}{t['rows']:>12,}{t['hot_rows']:>12,}{t['lookup_share']:>13.1%}{t['input_share']:>12.1%}",
                file=report,
            )
        print(
            f"{'all':<12}{sum(t['rows'] for t in r['tables']):>12,}{len(hot):>12,}"
            f"{r['lookup_share']:>13.1%}{r['input_share']:>12.1%}  (inputs: all lookups hot)",
            file=report,
        )
        print(hot.line(), file=report)
    if args.out:
        print(f"hot rows written to {given if given == args.out else f'{given} (standard output)'}", file=report)
    return 0
