"""``bagpipe check``: check every file of a data set against its meta.json."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Check a data set made by `bagpipe synth` or `bagpipe preprocess`: every shard file
exists and has the dtype, shape and length meta.json implies (a truncated copy is
found here), has the size and CRC-32 meta.json recorded when the data set was written
(a changed byte is found here; a data set written before there were sums is checked
by size only), every id lies inside its table, labels are 0 or 1 and dense values are
finite. Prints one line per shard and exits with 2 if anything is wrong.

Training checks the file headers when it opens a data set, a shard's sums the first
time it reads the shard, and each block's ids the first time it reads the block; this
command checks everything up front.

Example:
  bagpipe check data/criteo
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bagpipe.config.argtypes import path

    p.add_argument("data", type=path, help="data set directory")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from bagpipe.data.integrity import check_dataset
    from bagpipe.errors import DataError

    reports = check_dataset(args.data, progress=args.progress)
    shards = [r for r in reports if not r.files]  # the others: the vocabulary's files
    for r in reports:
        if r.problems:
            for p in r.problems:
                print(f"{r.shard}: {p}")
        else:
            print(f"{r.shard}: ok ({f'{r.files:,} files' if r.files else f'{r.samples:,} samples'})")
    bad = [r for r in shards if r.problems]
    vocab_bad = any(r.problems for r in reports if r.files)
    if bad or vocab_bad:
        what = " and ".join([f"{len(bad)} of {len(shards)} shards"] * bool(bad) + ["the vocabulary"] * vocab_bad)
        raise DataError(f"{args.data}: {what} {'has' if not bad else 'have'} problems (listed above)")
    vocab = " and the vocabulary" if len(reports) > len(shards) else ""
    print(f"{args.data}: all {len(shards)} shards{vocab} ok")
    return 0
