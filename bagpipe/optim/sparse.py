"""Row-wise sparse optimizers applied to the rows a batch touched.

The same code updates rows of the reference trainer's full tables and rows of a
trainer's cache, which is what makes cached training bitwise equal to the reference:
both paths hand :meth:`SparseOptimizer.update` the same (U, D) tensors in the same
order (unique global rows, ascending), so every float operation is the same.

Update order per step (documented because exactness depends on it):
1. the gradient of each unique row is the sum of its lookups' gradients, computed by
   autograd through ``embedding_bag`` over a gathered (U, D) leaf (deterministic on CPU);
2. dense parameters step (torch optimizer), then embedding rows step (this module);
   the two touch disjoint memory, so their order does not change any bit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from bagpipe.errors import ConfigError

OPTIMIZER_NAMES = ("sgd", "adagrad")


class SparseOptimizer(ABC):
    """Updates embedding rows given their gradients.

    ``state_dim`` (S) is the number of optimizer-state floats stored with each row.
    """

    state_dim: int = 0

    def __init__(self, lr: float):
        if not lr > 0:
            raise ConfigError(f"learning rate must be > 0, got {lr}")
        self.lr = float(lr)

    @abstractmethod
    def update(self, weights: torch.Tensor, state: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """weights (U, D), state (U, S), grad (U, D) -> new weights (U, D), new state (U, S)."""


class RowWiseSGD(SparseOptimizer):
    """w <- w - lr * g. No state."""

    state_dim = 0

    def update(self, weights, state, grad):
        return weights - self.lr * grad, state


class RowWiseAdagrad(SparseOptimizer):
    """Row-wise Adagrad (as DLRM / FBGEMM's rowwise_adagrad): one accumulator per row.

    s <- s + mean_d(g_d^2);  w <- w - lr * g / (sqrt(s) + eps)
    """

    state_dim = 1

    def __init__(self, lr: float, eps: float = 1e-8):
        super().__init__(lr)
        self.eps = float(eps)

    def update(self, weights, state, grad):
        new_state = state + (grad * grad).mean(dim=1, keepdim=True)
        return weights - self.lr * grad / (new_state.sqrt() + self.eps), new_state


def build_sparse_optimizer(name: str, lr: float) -> SparseOptimizer:
    if name == "sgd":
        return RowWiseSGD(lr)
    if name == "adagrad":
        return RowWiseAdagrad(lr)
    raise ConfigError(f"unknown optimizer {name!r} (choose from {', '.join(OPTIMIZER_NAMES)})")


def build_dense_optimizer(name: str, lr: float, params) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    raise ConfigError(f"unknown optimizer {name!r} (choose from {', '.join(OPTIMIZER_NAMES)})")
