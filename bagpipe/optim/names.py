"""The optimizers' and schedules' names (no torch here: config checks and ``--help`` import this)."""

from __future__ import annotations

from typing import Literal, get_args

from bagpipe.errors import ConfigError

OptimizerName = Literal["sgd", "adagrad", "adam", "partial_rowwise_adam"]
ScheduleName = Literal["constant", "warmup-poly", "step"]
OPTIMIZER_NAMES: tuple[str, ...] = get_args(OptimizerName)
ADAM_FAMILY = ("adam", "partial_rowwise_adam")


def row_state_dim(name: str, dim: int) -> int:
    """S, the optimizer-state floats stored with each row of D = ``dim`` by row optimizer ``name``."""
    if name not in OPTIMIZER_NAMES:
        raise ConfigError(f"unknown optimizer {name!r} (choose from {', '.join(OPTIMIZER_NAMES)})")
    return {"sgd": 0, "adagrad": 1, "adam": 2 * dim, "partial_rowwise_adam": dim + 1}[name]
