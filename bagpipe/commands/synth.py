"""``bagpipe synth``: generate a skewed synthetic CTR dataset."""

from __future__ import annotations

import argparse
import time

import numpy as np

from bagpipe.data.profiles import PROFILE_DESCRIPTIONS, PROFILES
from bagpipe.data.shards import Dataset
from bagpipe.data.synthetic import SynthConfig, generate

DESCRIPTION = (
    """\
Generate a synthetic click-through-rate dataset with the shape and the access skew of a
real one, in bagpipe's shard format (train split, then the last --eval-fraction as eval).

Each profile fixes the dense features and the embedding tables: criteo-kaggle has the 26
tables of the DLRM Criteo Kaggle setup (33.8M rows), avazu 21 Avazu-like tables, tiny 8
small tables for tests. In every table of >= 10,000 rows ids follow a Zipf-like law in
which the hottest 1% of rows receive ~90% of the accesses, scattered over the table by a
seeded permutation; smaller tables are near uniform. Labels come from a hidden logistic
model (per-row weights, a dense linear term, noise) at a 20-25% click rate, so a model can
learn them. The same options always produce byte-identical files.

Profiles:
"""
    + "".join(f"  {name:14s}{desc}\n" for name, desc in PROFILE_DESCRIPTIONS.items())
    + """
Example:
  bagpipe synth --profile criteo-kaggle --samples 1000000 --scale 0.1 --seed 7 --out data/ck
  (1M samples over tables a tenth of Criteo's size, 900k train / 100k eval)
"""
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bagpipe.config.argtypes import path

    p.add_argument("--profile", required=True, choices=sorted(PROFILES), help="dataset shape to imitate")
    p.add_argument(
        "--samples", type=int, default=100_000, metavar="N",
        help="total samples over both splits (default: 100000)",
    )  # fmt: skip
    p.add_argument(
        "--scale", type=float, default=1.0, metavar="F",
        help="multiply every table's row count by F, at least 1 row each (default: 1.0)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, metavar="S", help="random seed; same seed, same bytes (default: 0)")
    p.add_argument(
        "--eval-fraction", type=float, default=0.1, metavar="F",
        help="the last fraction F of the samples form the eval split, in [0, 1) (default: 0.1)",
    )  # fmt: skip
    p.add_argument("--out", required=True, type=path, metavar="DIR", help="output dataset directory")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a dataset already in DIR (only if every file there is the dataset's)",
    )
    p.add_argument("--no-progress", action="store_true", help="do not show a progress bar")


def run(args: argparse.Namespace) -> int:
    cfg = SynthConfig(
        profile=args.profile,
        samples=args.samples,
        scale=args.scale,
        seed=args.seed,
        eval_fraction=args.eval_fraction,
    )
    t0 = time.perf_counter()
    meta = generate(cfg, args.out, overwrite=args.overwrite, progress=not args.no_progress)
    dt = time.perf_counter() - t0
    ctr = _click_rate(Dataset(args.out))
    splits = " + ".join(f"{meta.num_samples(s):,} {s}" for s in meta.splits)
    print(
        f"wrote {splits} samples, {meta.num_features} tables ({meta.total_rows:,} rows), "
        f"CTR {ctr:.3f}, to {args.out} in {dt:.1f}s"
    )
    return 0


def _click_rate(ds: Dataset) -> float:
    clicks, total = 0.0, 0
    for split in ds.meta.splits:
        for i in range(len(ds.shard_sizes(split))):
            labels = np.asarray(ds.shard(split, i).labels)
            clicks += float(labels.sum(dtype=np.float64))
            total += len(labels)
    return clicks / max(1, total)
