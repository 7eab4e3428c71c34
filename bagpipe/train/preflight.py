"""Before a run changes anything: the checks the loop and the launcher share.

:func:`preflight` is what a run checks before its folder changes and before a row is
trained: the data set opens (its files checked); a resumed run continues what its folder
holds (nothing to resume, a finished run, a changed setting: one line), a new run does
not overwrite another's; the run's checkpoints fit on their disk. It also measures the
run's shape once (:func:`bagpipe.budget.shape.run_shape`, a throwaway model and a few
batches): the checkpoint estimate, the device estimate and the memory plan all read it.

The loop calls it on every trainer (trainer 0 checks; the others take the checkpoint
trainer 0 checked); the local launcher calls it once before any role starts, so that a
refusal is said in one line by the launcher rather than by a role.
"""

from __future__ import annotations

from dataclasses import dataclass

from bagpipe.budget.estimate import RunShape
from bagpipe.budget.shape import run_shape
from bagpipe.checkpoint import Checkpoint, CheckpointFolder
from bagpipe.config.train import TrainConfig
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream, train_stream
from bagpipe.train.resume import elastic_restart, refuse_overwrite, resume_point
from bagpipe.train.rundir import RunDir
from bagpipe.train.space import check_checkpoint_space


@dataclass(frozen=True)
class Preflight:
    """What the checks found, for the run to use rather than find again."""

    dataset: Dataset
    stream: BatchStream
    """The run's train stream."""
    shape: RunShape
    """The run's shape, measured once (a data-parallel trainer's: its share of the batch)."""
    share: int | None
    """A data-parallel trainer's share of the batch; None: the whole batch."""
    ckpt: Checkpoint | None
    """The checkpoint the run continues; None: it starts at step 0."""


def preflight(cfg: TrainConfig, run: RunDir, *, checks: bool = True) -> Preflight:
    """Check the run ``cfg`` in the folder ``run`` (claimed by the caller) before anything
    in it changes; raises a one-line error. ``checks=False``: a data-parallel trainer
    other than trainer 0, which only finds the checkpoint trainer 0 checked."""
    rc = cfg.run
    dataset = Dataset(cfg.data.data)
    # a role restarted by torchrun --max-restarts continues from the latest checkpoint, if any
    resuming = rc.resume or elastic_restart()
    if not checks:
        ckpt = CheckpointFolder(run.path).latest() if resuming else None
    elif resuming:
        ckpt = resume_point(run, cfg, dataset, required=rc.resume, complete_ok=elastic_restart())
    else:
        refuse_overwrite(run)
        ckpt = None
    stream = train_stream(dataset, cfg.data, rc.seed)
    share = stream.batch_size // cfg.dist.trainers if cfg.dist.distributed else None
    shape = run_shape(cfg, dataset, stream, share)
    if checks:
        check_checkpoint_space(cfg, dataset, shape)  # before anything is trained: refuse what could not be saved
    return Preflight(dataset=dataset, stream=stream, shape=shape, share=share, ckpt=ckpt)
