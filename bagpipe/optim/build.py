"""Choosing optimizers by name: the row-wise one for embedding rows, torch's for dense parameters.

``sgd`` and ``adagrad`` (:mod:`bagpipe.optim.sparse`), ``adam`` and
``partial_rowwise_adam`` (:mod:`bagpipe.optim.adam`); the dense parameters of the two
Adam variants step with torch's Adam (dense parameters have no rows).
"""

from __future__ import annotations

import torch

from bagpipe.optim.adam import PartialRowWiseAdam, RowWiseAdam
from bagpipe.optim.names import row_state_dim
from bagpipe.optim.schedule import LRSchedule
from bagpipe.optim.sparse import RowWiseAdagrad, RowWiseSGD, SparseOptimizer


def _known(name: str) -> str:
    row_state_dim(name, 1)  # raises for an unknown name
    return name


def build_sparse_optimizer(
    name: str,
    lr: float,
    dim: int,
    *,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    schedule: LRSchedule | None = None,
) -> SparseOptimizer:
    """The row-wise optimizer ``name`` for rows of D = ``dim`` (``betas``, ``eps`` and
    ``weight_decay`` are the Adam family's; row-wise Adagrad keeps eps = 1e-8)."""
    _known(name)
    if name == "sgd":
        return RowWiseSGD(lr, schedule)
    if name == "adagrad":
        return RowWiseAdagrad(lr, schedule=schedule)
    cls = RowWiseAdam if name == "adam" else PartialRowWiseAdam
    return cls(lr, dim, betas=betas, eps=eps, weight_decay=weight_decay, schedule=schedule)


def build_dense_optimizer(
    name: str,
    lr: float,
    params,
    *,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    """torch's optimizer for the dense parameters: SGD, Adagrad, or Adam for both Adam
    variants (dense parameters have no rows; decoupled weight decay, as FBGEMM's row Adam)."""
    _known(name)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, decoupled_weight_decay=True)
