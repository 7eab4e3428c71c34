"""``bagpipe bench``."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Run a benchmark scenario; every compared configuration runs in the same invocation,
interleaved over repetitions, and the results land in OUT as results.json,
results.md (a table with ratios) and PNG plots.

Scenarios:
  modes   full / nocache / lru / lookahead on generated Criteo-Kaggle-sized data
          (33.8M rows, DLRM Kaggle recipe, batch 2048, Adagrad), memory and disk stores
  oracle  the oracle's planning throughput alone vs batch size and lookahead

--quick shrinks a scenario to under a minute (tables at 1% size, few steps).

Examples:
  bagpipe bench modes --out bench-out/modes
  bagpipe bench modes --stores disk --modes full,nocache,lru,lookahead
  bagpipe bench oracle --quick
"""


def _csv(kind):
    return lambda s: tuple(kind(x) for x in s.split(",") if x)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", choices=("modes", "oracle"), help="what to benchmark")
    p.add_argument("--out", help="output folder (default bench-out/SCENARIO)")
    p.add_argument("--quick", action="store_true", help="a small size that runs in under a minute")
    p.add_argument("--scale", type=float, help="table cardinality factor (1.0: full Criteo Kaggle, 33.8M rows)")
    p.add_argument("--reps", type=int, help="repetitions per configuration")
    g = p.add_argument_group("modes scenario")
    g.add_argument("--modes", type=_csv(str), help="comma-separated subset of full,nocache,lru,lookahead")
    g.add_argument("--stores", type=_csv(str), help="comma-separated subset of memory,disk")
    g.add_argument("--steps", type=int, help="steps per run (including warm-up)")
    g.add_argument("--warmup", type=int, help="warm-up steps left out of the throughput")
    g.add_argument("--batch-size", type=int, help="samples per step")
    g.add_argument("--cache-fraction", type=float, help="cache slots as a fraction of all rows (default 0.05)")
    g.add_argument("--lookahead", type=int, help="L for the lookahead mode")
    g.add_argument("--threads", type=int, help="torch threads per training process")
    g = p.add_argument_group("oracle scenario")
    g.add_argument("--batch-sizes", type=_csv(int), help="comma-separated batch sizes")
    g.add_argument("--lookaheads", type=_csv(int), help="comma-separated L values")
    g.add_argument("--batches", type=int, help="batches planned per measurement")


def run(args: argparse.Namespace) -> int:
    if args.scenario == "modes":
        from bagpipe.bench.modes import ModesBench, run as run_modes

        keys = ("scale", "reps", "modes", "stores", "steps", "warmup", "batch_size", "cache_fraction", "lookahead", "threads")
        kw = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
        kw["out"] = args.out or "bench-out/modes"
        b = ModesBench.quick(**kw) if args.quick else ModesBench(**kw)
        payload = run_modes(b)
    else:
        from bagpipe.bench.oracle import OracleBench, run as run_oracle

        keys = ("scale", "reps", "batch_sizes", "lookaheads", "batches")
        kw = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
        kw["out"] = args.out or "bench-out/oracle"
        b = OracleBench.quick(**kw) if args.quick else OracleBench(**kw)
        payload = run_oracle(b)
    print(payload["table"])
    print(f"results in {kw['out']}/results.json, results.md and PNG plots")
    return 0
