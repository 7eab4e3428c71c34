"""What a resumed run may continue, checked before anything in the run folder changes.

A run continues from its latest checkpoint only if it would compute what the run
computed: the same data set (its fingerprint), batch size, block size, seed, model,
recipe, embedding dimension, optimizer and learning rate. Everything else may change
on resume (:data:`MAY_CHANGE`): how long to train, how often to evaluate or
checkpoint, threads and progress, and where the rows live (any mode, store or cache
size resumes any other's checkpoint, since checkpoints hold rows in global order).
"""

from __future__ import annotations

from bagpipe.config import to_flat
from bagpipe.data.shards import Dataset
from bagpipe.errors import CheckpointError, ConfigError
from bagpipe.train.checkpoint import Checkpoint, load_latest
from bagpipe.train.config import TrainConfig
from bagpipe.train.rundir import RunDir

#: Settings a resumed run may give other values than the run had.
MAY_CHANGE = (
    "data", "out", "steps", "eval_every", "eval_samples", "checkpoint_every", "resume", "summary_json",
    "threads", "progress", "warmup_steps", "final_checkpoint", "digest", "tensorboard",
    "mode", "store", "store_dir", "cache_rows", "lookahead", "cache_budget_mb", "init_from_store",
    "trainers", "servers", "cache_sync", "plans_in_flight", "rendezvous_timeout",
)


def resume_point(run: RunDir, cfg: TrainConfig, dataset: Dataset) -> Checkpoint:
    """The checkpoint ``cfg`` continues, after checking it may; raises a one-line error
    (nothing to resume, a finished run, a setting or the data set changed)."""
    ckpt = load_latest(run.path)
    if ckpt is None:
        raise CheckpointError(f"{run.path}: --resume given but the run has no checkpoint")
    if ckpt.step >= cfg.run.steps:
        raise ConfigError(
            f"{run.path} is complete: its checkpoint is at step {ckpt.step} and --steps is {cfg.run.steps}; "
            f"give a larger --steps to train further"
        )
    if not run.config_file.exists():
        raise CheckpointError(f"{run.path}: has a checkpoint but no config.json to check the resumed run against")
    before = run.read_config()
    old = to_flat(TrainConfig.from_json(before["train"], source=str(run.config_file)))
    new = to_flat(cfg)
    for key in sorted(new):
        if key not in MAY_CHANGE and old.get(key) != new[key]:
            raise ConfigError(
                f"cannot resume {run.path}: {key} was {old.get(key)!r}, now {new[key]!r} "
                f"(a resumed run keeps every setting that changes what is computed; see docs/runs.md)"
            )
    was = before.get("dataset", {}).get("fingerprint")
    now = dataset.fingerprint()
    if was is not None and was != now:
        raise ConfigError(
            f"cannot resume {run.path}: the data set differs from the one it was trained on "
            f"(fingerprint {was[:12]}, now {now[:12]} for {dataset.dir})"
        )
    return ckpt


def refuse_overwrite(run: RunDir) -> None:
    """A new run (no --resume) refuses a folder that holds another run's checkpoints."""
    if (run.path / "checkpoints" / "LATEST").exists():
        raise ConfigError(f"{run.path} already holds a run with checkpoints; pass --resume to continue it or choose another --out")
