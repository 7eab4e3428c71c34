"""``bagpipe export``."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Export a run's latest checkpoint as a portable model (docs/export.md): the dense model
and every embedding table in safetensors files, the table configs, and the
preprocessing vocabulary (or hashing) of the dataset the run was trained on, so that
`bagpipe predict` and `bagpipe.load(DIR)` can score raw log lines.

Names follow TorchRec's state_dict where TorchRec has the same module: every table is
sparse_arch.embedding_bag_collection.embedding_bags.<feature>.weight; DLRM's dense
layers are dense_arch.* / over_arch.* (the dot-interaction columns reordered to
TorchRec's); the other models keep bagpipe's names. Tables are packed whole into files
of at most --shard-mb (a larger table gets its own file) and stream from the
checkpoint chunk by chunk, so a table larger than memory exports too. The optimizer
state is not exported: resume training from the run itself.

Examples:
  bagpipe export --run runs/criteo --out exports/criteo
  bagpipe export --run runs/big --out exports/big --shard-mb 4096
  bagpipe export --run runs/moved --data data/criteo --out exports/moved --overwrite
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bagpipe.config.argtypes import path

    p.add_argument(
        "--run",
        required=True,
        type=path,
        metavar="DIR",
        help="run directory written by bagpipe train (its latest checkpoint)",
    )
    p.add_argument("--out", required=True, type=path, metavar="DIR", help="export directory (must be new or empty)")
    p.add_argument(
        "--data", type=path, metavar="DIR", help="the dataset the run trained on (default: the one in RUN/config.json)"
    )
    p.add_argument(
        "--shard-mb",
        type=float,
        default=2048.0,
        metavar="MB",
        help="largest embedding file in MiB; whole tables are packed up to it (default: 2048)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier export in --out (built beside it and swapped in when complete; "
        "only if every file there is the export's)",
    )


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from bagpipe.commands.eval import trained_further
    from bagpipe.errors import ConfigError
    from bagpipe.export.write import export_run

    if not (args.shard_mb > 0 and args.shard_mb <= 1 << 30):  # NaN fails too
        raise ConfigError(f"--shard-mb must be > 0 and at most 2^30 (a number of MiB), got {args.shard_mb}")
    result = export_run(
        args.run, args.out, data=args.data, shard_bytes=int(args.shard_mb * (1 << 20)), overwrite=args.overwrite
    )
    print(result.line())
    note = trained_further(Path(args.run), result.step, "the export is")
    if note:
        print(note, file=sys.stderr)
    return 0
