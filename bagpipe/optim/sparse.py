"""Row-wise sparse optimizers applied to the rows a batch touched: the interface, SGD and Adagrad.

The same code updates rows of the reference trainer's full tables and rows of a
trainer's cache, which is what makes cached training bitwise equal to the reference:
both paths hand :meth:`SparseOptimizer.update` the same (U, D) tensors in the same
order (unique global rows, ascending), so every float operation is the same.

Update order per step (documented because exactness depends on it):
1. the gradient of each unique row is the sum of its lookups' gradients, computed by
   autograd through ``embedding_bag`` over a gathered (U, D) leaf (deterministic on CPU);
2. dense parameters step (torch optimizer), then embedding rows step (this module);
   the two touch disjoint memory, so their order does not change any bit.

Every update is told the 0-based index of the training step whose gradients it
applies (``step``): the learning-rate schedule's position and, for the Adam family
(:mod:`bagpipe.optim.adam`), the global iteration ``t = step + 1`` of the bias
correction, as FBGEMM's ``iter``. The step is the data position (batch k is step k),
so every mode, every topology and a resumed run use the same t for the same update.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from bagpipe.errors import ConfigError
from bagpipe.optim.schedule import LRSchedule


class SparseOptimizer(ABC):
    """Updates embedding rows given their gradients.

    ``state_dim`` (S) is the number of optimizer-state floats stored with each row;
    ``schedule`` scales the base rate ``lr`` by the step (constant by default).
    """

    state_dim: int = 0

    def __init__(self, lr: float, schedule: LRSchedule | None = None):
        if not lr > 0:
            raise ConfigError(f"learning rate must be > 0, got {lr}")
        self.lr = float(lr)
        self.schedule = schedule if schedule is not None else LRSchedule()

    def lr_at(self, step: int) -> float:
        """The learning rate of 0-based step ``step``."""
        return self.schedule.lr(self.lr, step)

    @abstractmethod
    def update(
        self, weights: torch.Tensor, state: torch.Tensor, grad: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """weights (U, D), state (U, S), grad (U, D) of 0-based step ``step`` -> new weights (U, D), new state (U, S)."""


class RowWiseSGD(SparseOptimizer):
    """w <- w - lr * g. No state."""

    state_dim = 0

    def update(self, weights, state, grad, step):
        return weights - self.lr_at(step) * grad, state


class RowWiseAdagrad(SparseOptimizer):
    """Row-wise Adagrad (as DLRM / FBGEMM's rowwise_adagrad): one accumulator per row.

    s <- s + mean_d(g_d^2);  w <- w - lr * g / (sqrt(s) + eps)
    """

    state_dim = 1

    def __init__(self, lr: float, eps: float = 1e-8, schedule: LRSchedule | None = None):
        super().__init__(lr, schedule)
        self.eps = float(eps)

    def update(self, weights, state, grad, step):
        new_state = state + (grad * grad).mean(dim=1, keepdim=True)
        return weights - self.lr_at(step) * grad / (new_state.sqrt() + self.eps), new_state
