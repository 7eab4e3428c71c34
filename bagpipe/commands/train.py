"""``bagpipe train``."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Train a CTR model on a bagpipe dataset.

Modes (--mode) compute the same thing and differ only in where embedding rows live:
  full       every table in this process's memory: the reference every mode matches
  nocache    rows in a store; each step fetches its rows and writes them back
  lru        rows in a store; a cache of --cache-rows with least-recently-used eviction
  lookahead  rows in a store; the oracle reads --lookahead batches ahead and plans every
             fetch and eviction, prefetching in the background (the product)
All modes end with the same params_sha256 on one process.

Distributed (--trainers N --servers S): N data-parallel trainers (each on 1/N of every
global batch of --batch-size samples), S embedding servers holding the rows and their
optimizer state, and one oracle process, all started here on loopback; the result
matches --mode full within float tolerance. Logs per role go to RUN/logs/. Across
machines start the same roles with torchrun and `bagpipe worker` (docs/distributed.md).

Settings can come from a TOML file (--config, keys as the long options with
underscores, optionally under a [train] table); command-line options override it.

Examples:
  bagpipe train --data data/tiny --model dlrm --steps 300 --out runs/full
  bagpipe train --data data/tiny --model dlrm --steps 300 --out runs/la \\
      --mode lookahead --cache-rows 20000 --lookahead 8
  bagpipe train --data data/tiny --model dlrm --steps 300 --out runs/auto \\
      --mode lookahead --cache-budget-mb 0.5
  bagpipe train --data data/tiny --model dlrm --steps 300 --out runs/dist \
      --mode lookahead --trainers 2 --servers 2
  bagpipe train --config run.toml --resume
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bagpipe.models import MODEL_NAMES, RECIPE_SIZES
    from bagpipe.train.config import MODES, STORES

    p.add_argument("--config", help="TOML file with settings (command-line options win)")
    g = p.add_argument_group("data and output")
    g.add_argument("--data", help="dataset directory (from bagpipe synth / preprocess)")
    g.add_argument("--out", help="run directory for config, metrics.jsonl, checkpoints and summary.json")
    g.add_argument("--summary-json", help="also write the summary JSON here")
    g = p.add_argument_group("model and optimisation")
    g.add_argument("--model", choices=MODEL_NAMES, help="model (default dlrm)")
    g.add_argument("--recipe", choices=RECIPE_SIZES, help="model size: debug (default) or kaggle (DLRM's Criteo Kaggle sizes)")
    g.add_argument("--embedding-dim", type=int, help="D, overrides the recipe's embedding dimension")
    g.add_argument("--steps", type=int, help="training steps (default 1000)")
    g.add_argument("--batch-size", type=int, help="samples per step (default 2048)")
    g.add_argument("--optimizer", choices=("sgd", "adagrad"), help="row-wise sparse + dense optimizer (default adagrad)")
    g.add_argument("--lr", type=float, help="learning rate (default 0.05)")
    g.add_argument("--seed", type=int, help="seed of model init, embedding init and data order (default 0)")
    g = p.add_argument_group("embedding placement")
    g.add_argument("--mode", choices=MODES, help="full (default), nocache, lru or lookahead")
    g.add_argument("--store", choices=STORES, help="where non-full modes keep the tables (default memory)")
    g.add_argument("--store-dir", help="directory of the disk store (default RUN/store)")
    g.add_argument("--cache-rows", type=int, help="C, cache slots for lru/lookahead (default 5%% of all rows)")
    g.add_argument("--lookahead", type=int, help="L, batches the oracle looks ahead (default 8)")
    g.add_argument("--cache-budget-mb", type=float, metavar="MIB",
                   help="memory budget of the cache (lru, lookahead): picks --cache-rows from it and, for "
                   "lookahead, the largest L whose window fits (planned over the first batches); "
                   "excludes --cache-rows, overrides --lookahead")
    g = p.add_argument_group("distributed (one machine: every role a process on loopback)")
    g.add_argument("--trainers", type=int, help="N data-parallel trainers (default 1)")
    g.add_argument("--servers", type=int, help="S embedding server processes (default 0: the store is in the trainer)")
    g.add_argument("--cache-sync", choices=("partitioned", "replicated"),
                   help="partitioned (default): rows one trainer uses and then drops are not replicated or "
                   "synchronised; replicated: every trainer holds and synchronises every planned row")
    g.add_argument("--plans-in-flight", type=int, help="plans the oracle may send ahead of each trainer (default 4)")
    g = p.add_argument_group("evaluation, checkpoints, runtime")
    g.add_argument("--eval-every", type=int, help="evaluate every N steps (default: only at the end)")
    g.add_argument("--eval-samples", type=int, help="cap on eval samples (default: the whole eval split)")
    g.add_argument("--checkpoint-every", type=int, help="checkpoint every N steps (default: only at the end)")
    g.add_argument("--resume", action="store_true", default=None, help="continue from the run directory's latest checkpoint")
    g.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    g.add_argument("--no-progress", dest="progress", action="store_false", default=None, help="no progress bar")
    g.add_argument("--warmup-steps", type=int, help="steps left out of samples_per_s (benchmarks; default 0)")
    g.add_argument("--no-final-checkpoint", dest="save_final", action="store_false", default=None,
                   help="skip the checkpoint at the end (bagpipe eval then has nothing to read)")
    g.add_argument("--no-digest", dest="digest", action="store_false", default=None,
                   help="skip params_sha256 (it reads every embedding row once)")


def run(args: argparse.Namespace) -> int:
    from bagpipe.train.config import TrainConfig, load_config
    from bagpipe.train.loop import train

    overrides = {k: getattr(args, k, None) for k in TrainConfig.field_names()}
    cfg = load_config(args.config, overrides)
    if cfg.distributed:
        from bagpipe.distributed.launch import launch

        s = launch(cfg, echo=lambda line: print(line, flush=True))
    else:
        s = train(cfg, announce=lambda line: print(line, flush=True))
    if not cfg.distributed:  # the launcher already echoed trainer 0's line
        print(summary_line(s))
    print(f"run directory: {cfg.out}")
    return 0


def summary_line(s: dict) -> str:
    """The one line a finished run prints."""
    auc = "n/a" if s["eval_auc"] is None else f"{s['eval_auc']:.4f}"
    ll = "n/a" if s["eval_logloss"] is None else f"{s['eval_logloss']:.4f}"
    digest = "not computed (--no-digest)" if s["params_sha256"] is None else s["params_sha256"][:16] + "…"
    return (
        f"{s['mode']}: {s['steps']} steps, {s['samples_per_s']:,.0f} samples/s, "
        f"train logloss {s['train_logloss']:.4f}, eval logloss {ll}, eval AUC {auc}, "
        f"peak RSS {s['peak_rss_mb']:.0f} MiB, params_sha256 {digest}"
    )
