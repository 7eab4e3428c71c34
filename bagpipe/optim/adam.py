"""Row-wise Adam and partial row-wise Adam, as FBGEMM's ``EmbOptimType.ADAM`` and
``PARTIAL_ROWWISE_ADAM`` compute them.

With g the (U, D) gradient of the step's unique rows, t = step + 1 the global iteration
(FBGEMM's ``iter``: the same t for every row of a step, whether or not the row was
used in earlier steps) and ``lr`` the scheduled rate of that step:

* ``adam`` (S = 2D, state ``[m (D) | v (D)]``, FBGEMM's optimizer-state layout)::

      m <- b1 m + (1 - b1) g
      v <- b2 v + (1 - b2) g^2
      w <- w - lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * w )

* ``partial_rowwise_adam`` (S = D + 1, state ``[v (1) | m (D)]``, FBGEMM's offloaded
  layout: the row's second moment first)::

      v <- b2 v + (1 - b2) mean_d(g_d^2)          (one value per row)
      m <- b1 m + (1 - b1) g
      w <- w - lr * ( (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * w )

The weight decay is FBGEMM's: ``wd * w`` of the weights before the update, added to the
step (decoupled, i.e. AdamW; torch's dense ``Adam(decoupled_weight_decay=True)`` is the
same rule). Rows a step does not use keep their moments unchanged (lazy, as FBGEMM).
Bias corrections are computed in float64 on the host and applied as scalars.
"""

from __future__ import annotations

import torch

from bagpipe.errors import ConfigError
from bagpipe.optim.schedule import LRSchedule
from bagpipe.optim.sparse import SparseOptimizer


class _AdamBase(SparseOptimizer):
    def __init__(
        self,
        lr: float,
        dim: int,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        schedule: LRSchedule | None = None,
    ):
        super().__init__(lr, schedule)
        b1, b2 = (float(b) for b in betas)
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ConfigError(f"Adam betas must be in [0, 1), got ({b1}, {b2})")
        if not eps > 0 or weight_decay < 0:
            raise ConfigError(f"Adam needs eps > 0 and weight decay >= 0, got {eps} and {weight_decay}")
        self.dim = int(dim)
        self.b1, self.b2, self.eps, self.weight_decay = b1, b2, float(eps), float(weight_decay)

    def _step(self, weights, m, v, step: int) -> torch.Tensor:
        """The new weights from the updated moments m (U, D) and v (U, D or 1)."""
        t = step + 1
        bc1 = 1.0 - self.b1**t
        bc2 = 1.0 - self.b2**t
        upd = (m / bc1) / ((v / bc2).sqrt() + self.eps)
        if self.weight_decay:
            upd = upd + self.weight_decay * weights
        return weights - self.lr_at(step) * upd


class RowWiseAdam(_AdamBase):
    """FBGEMM's row-wise embedding Adam: per-element first and second moments (S = 2D)."""

    def __init__(self, lr: float, dim: int, **kw):
        super().__init__(lr, dim, **kw)
        self.state_dim = 2 * self.dim

    def update(self, weights, state, grad, step):
        D = self.dim
        m = self.b1 * state[:, :D] + (1.0 - self.b1) * grad
        v = self.b2 * state[:, D:] + (1.0 - self.b2) * (grad * grad)
        return self._step(weights, m, v, step), torch.cat([m, v], dim=1)


class PartialRowWiseAdam(_AdamBase):
    """FBGEMM's partial row-wise Adam: per-element first moment, one second moment per row (S = D + 1)."""

    def __init__(self, lr: float, dim: int, **kw):
        super().__init__(lr, dim, **kw)
        self.state_dim = self.dim + 1

    def update(self, weights, state, grad, step):
        v = self.b2 * state[:, :1] + (1.0 - self.b2) * (grad * grad).mean(dim=1, keepdim=True)
        m = self.b1 * state[:, 1:] + (1.0 - self.b1) * grad
        return self._step(weights, m, v, step), torch.cat([v, m], dim=1)
