"""Helpers of the tests that train: what a one-process run returns and leaves, typed as
the test knows it (``train`` returns None only on a data-parallel trainer that does not
report; ``latest`` None only where a run has no checkpoint yet)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bagpipe.checkpoint import Checkpoint
    from bagpipe.config.train import TrainConfig


def trained(cfg: TrainConfig) -> dict:
    """``train(cfg)`` in this process: the run's summary (one process always reports)."""
    from bagpipe.train.loop import train

    summary = train(cfg)
    assert summary is not None, "a one-process run returns its summary"
    return summary


def last_checkpoint(run_dir: str | os.PathLike) -> Checkpoint:
    """The newest complete checkpoint of the run in ``run_dir``, which the test knows it has."""
    from bagpipe.checkpoint import latest

    ck = latest(run_dir)
    assert ck is not None, f"{run_dir}: no complete checkpoint"
    return ck
