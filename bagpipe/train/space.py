"""Before training: will the run's checkpoints fit on their disk?

A run that will checkpoint (``--checkpoint-every`` or the final checkpoint) estimates the
largest checkpoint it can write and refuses to start, in one line, when the disk that
holds the run folder cannot hold it -- rather than failing after its training is done.

Checkpoints hold the rows written since initialisation (:mod:`bagpipe.checkpoint.format`),
so the largest one holds at most the rows of the checkpoint it resumes from plus, for
every step still to train, the unique rows of a batch -- the most of the first few
batches, with a margin of :data:`MARGIN` for batches that reach further -- and never
more than the tables: rows x (8-byte id + 4 (D + S) bytes), plus the dense state (the
parameters and up to two optimizer values each: Adam's moments).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bagpipe.budget.estimate import RunShape
from bagpipe.checkpoint import CheckpointFolder
from bagpipe.config.train import TrainConfig
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import train_stream
from bagpipe.errors import ConfigError

PROBE_BATCHES = 3  # batches whose unique rows are counted
MARGIN = 1.25
ID_BYTES = 8


@dataclass(frozen=True)
class CheckpointEstimate:
    """The largest checkpoint a run can write."""

    rows: int
    """Rows it holds at most."""
    row_bytes: int
    """Bytes a stored row takes (its id and its D + S values)."""
    dense_bytes: int
    """Bytes of the dense state, at most."""

    @property
    def bytes(self) -> int:
        return self.rows * self.row_bytes + self.dense_bytes


def estimate(
    cfg: TrainConfig, dataset: Dataset, dense_params: int, state_dim: int, resumed_rows: int = 0
) -> CheckpointEstimate:
    """The largest checkpoint of ``cfg``'s run (``dense_params``: the model's parameter count;
    ``resumed_rows``: rows the checkpoint it resumes from holds, at most)."""
    stream = train_stream(dataset, cfg.data, cfg.run.seed)
    start = 0
    ckpt = CheckpointFolder(cfg.run.out).latest_name() if cfg.run.resume else None
    if ckpt is not None:
        from bagpipe.checkpoint import Manifest

        start = Manifest.load(Path(cfg.run.out) / "checkpoints" / ckpt).step
    steps = max(0, cfg.run.steps - start)
    probe = range(start, start + min(PROBE_BATCHES, steps))
    per_batch = max((len(np.unique(stream.batch(i).rows.numpy())) for i in probe), default=0)
    rows = min(dataset.meta.total_rows, resumed_rows + int(np.ceil(steps * per_batch * MARGIN)))
    dim = cfg.arch.model_config().embedding_dim
    return CheckpointEstimate(rows=rows, row_bytes=ID_BYTES + 4 * (dim + state_dim), dense_bytes=dense_params * 4 * 3)


def size(n: int) -> str:
    """Bytes for a person: 712 KiB, 3.4 MiB, 1.25 GiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n / 2**10:,.0f} KiB"


def free_bytes(path: Path) -> tuple[Path, int]:
    """(the nearest existing folder of ``path``, the bytes free on its disk)."""
    where = Path(path).absolute()
    while not where.exists():
        where = where.parent
    return where, shutil.disk_usage(where).free


def check_checkpoint_space(cfg: TrainConfig, dataset: Dataset, shape: RunShape) -> CheckpointEstimate | None:
    """Refuse (ConfigError, one line) a run whose largest checkpoint does not fit on the
    disk of its run folder; None when the run writes no checkpoint. ``shape``: the run's,
    as :func:`bagpipe.train.preflight.preflight` measured it (its dense parameters and
    the rows' optimizer values)."""
    rc = cfg.run
    if not (rc.final_checkpoint or rc.checkpoint_every):
        return None
    resumed = 0
    if rc.resume:
        latest = CheckpointFolder(rc.out).latest()
        if latest is not None:
            resumed = sum(man.rows if man.version >= 3 else man.num_rows for _, man in latest.reader().chain)
    est = estimate(cfg, dataset, shape.dense_params, shape.state_dim, resumed)
    where, free = free_bytes(Path(rc.out) / "checkpoints")
    if est.bytes > free:
        raise ConfigError(
            f"{rc.out}: this run's checkpoints need up to {size(est.bytes)} ({est.rows:,} rows trained "
            f"at most x {est.row_bytes} bytes, and the dense state) but {where} has {size(free)} free; "
            "free some space, choose another --out, or checkpoint less (--checkpoint-every 0 --no-final-checkpoint)"
        )
    return est
