"""Two runs' final parameters compared tensor by tensor (``tools/compare_runs.py``, the
GPU check's data-parallel step): the largest difference relative to the tensor's scale."""

from __future__ import annotations

import os

import numpy as np

from bagpipe.checkpoint.folder import latest
from bagpipe.errors import CheckpointError


def checkpoint_tensors(run: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every dense parameter (``dense/NAME``), every embedding row's weights and optimizer
    state of the run's newest checkpoint; CheckpointError when it has none."""
    ck = latest(run)
    if ck is None:
        raise CheckpointError(f"{run}: no checkpoint")
    out = {f"dense/{k}": v.numpy() for k, v in ck.dense["model"].items()}
    out["embedding weights"], out["embedding optimizer state"] = ck.reader().arrays()
    return out


def worst_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> tuple[float, str]:
    """The largest max |a - b| over ``b``'s tensors relative to that tensor's scale (max |b|),
    and its name ("-" when every tensor is empty)."""
    worst, name = 0.0, "-"
    for k in b:
        if b[k].size == 0:
            continue
        rel = float(np.abs(np.asarray(a[k], np.float64) - b[k]).max() / max(float(np.abs(b[k]).max()), 1e-30))
        if rel > worst:
            worst, name = rel, k
    return worst, name
