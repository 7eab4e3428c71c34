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
  peers   TorchRec's DLRM (FUSED kernel; needs `make peers`) beside bagpipe full and
          lookahead (cache 10% of rows, memory and disk stores) on the same data, model,
          batch and optimizer; --modes picks from full,lookahead,lookahead-disk,torchrec
          (the default) and torchrec-omp-default,torchrec-dense (docs/peers.md)
  sweep   lookahead mode over cache size (1-20% of rows) x L (1, 10, 50, 200):
          samples/s, hit rate, forced evictions; plus the --cache-budget-mb auto-tuner
          against the best measured point (criteo-kaggle x 0.01, batch 512)
  distributed
          1 trainer + 2 embedding-server processes vs the in-process store (the cost of
          disaggregation), and 2 trainers with the partitioned vs a fully replicated cache
          (bytes synchronised per iteration); --modes picks from in-process,1x2,
          2x2-partitioned,2x2-replicated
  convergence
          eval AUC / log loss per step, full vs lookahead (must be identical; exit 1
          otherwise), on generated data and the real Criteo sample in ../shared/data

--quick shrinks a scenario to under a minute (tables at 1% size, few steps).

Examples:
  bagpipe bench modes --out bench-out/modes
  bagpipe bench modes --stores disk --modes full,nocache,lru,lookahead
  bagpipe bench oracle --quick
  bagpipe bench sweep --cache-percents 1,5,20 --lookaheads 1,50
  bagpipe bench convergence --quick
"""


def _csv(kind):
    return lambda s: tuple(kind(x) for x in s.split(",") if x)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", choices=("modes", "oracle", "peers", "sweep", "convergence", "distributed"), help="what to benchmark")
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
    g = p.add_argument_group("sweep scenario (also --steps, --warmup, --batch-size, --lookaheads, --threads)")
    g.add_argument("--cache-percents", type=_csv(float), help="comma-separated cache sizes in %% of rows (default 1,2,5,10,20)")
    g.add_argument("--autotune-percent", type=float,
                   help="the auto-tuner's budget buys a cache of this %% of rows (default 5; 0 skips it)")
    g = p.add_argument_group("convergence scenario (also --steps, --batch-size, --cache-fraction, --lookahead, --threads)")
    g.add_argument("--eval-every", type=int, help="evaluate every N steps (generated data)")
    g.add_argument("--no-criteo", dest="criteo", action="store_false", default=None,
                   help="skip the real Criteo sample even if ../shared/data has it")
    g = p.add_argument_group("oracle scenario")
    g.add_argument("--batch-sizes", type=_csv(int), help="comma-separated batch sizes")
    g.add_argument("--lookaheads", type=_csv(int), help="comma-separated L values (oracle, sweep)")
    g.add_argument("--batches", type=int, help="batches planned per measurement")


def run(args: argparse.Namespace) -> int:
    if args.scenario == "modes":
        from bagpipe.bench.modes import ModesBench, run as run_modes

        keys = ("scale", "reps", "modes", "stores", "steps", "warmup", "batch_size", "cache_fraction", "lookahead", "threads")
        kw = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
        kw["out"] = args.out or "bench-out/modes"
        b = ModesBench.quick(**kw) if args.quick else ModesBench(**kw)
        payload = run_modes(b)
    elif args.scenario == "peers":
        from bagpipe.bench.peers import PeersBench, run as run_peers

        keys = ("scale", "reps", "steps", "warmup", "batch_size", "cache_fraction", "lookahead", "threads")
        kw = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
        if args.modes:
            kw["configs"] = args.modes
        kw["out"] = args.out or "bench-out/peers"
        b = PeersBench.quick(**kw) if args.quick else PeersBench(**kw)
        payload = run_peers(b)
    elif args.scenario == "distributed":
        from bagpipe.bench.distributed import DistributedBench, run as run_distributed

        keys = ("scale", "reps", "steps", "warmup", "batch_size", "cache_fraction", "lookahead")
        kw = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
        if args.modes:
            kw["configs"] = args.modes
        kw["out"] = args.out or "bench-out/distributed"
        b = DistributedBench.quick(**kw) if args.quick else DistributedBench(**kw)
        payload = run_distributed(b)
    elif args.scenario == "sweep":
        from bagpipe.bench.sweep import SweepBench, run as run_sweep

        keys = ("scale", "reps", "steps", "warmup", "batch_size", "cache_percents", "lookaheads", "autotune_percent", "threads")
        kw = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
        kw["out"] = args.out or "bench-out/sweep"
        b = SweepBench.quick(**kw) if args.quick else SweepBench(**kw)
        payload = run_sweep(b)
    elif args.scenario == "convergence":
        from bagpipe.bench.convergence import ConvergenceBench, run as run_convergence

        keys = ("steps", "batch_size", "eval_every", "cache_fraction", "lookahead", "threads", "criteo")
        kw = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
        kw["out"] = args.out or "bench-out/convergence"
        b = ConvergenceBench.quick(**kw) if args.quick else ConvergenceBench(**kw)
        payload = run_convergence(b)
        if not payload["identical"]:
            print(payload["table"])
            print("full and lookahead differ: exactness violated (see results.json)")
            return 1
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
