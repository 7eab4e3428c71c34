"""cDLRM's periodic averaging (``--cache-sync periodic:K``): an opt-in approximation.

cDLRM (Balasubramanian et al., RecSys 2021) lets each data-parallel trainer update the
rows in its own cache without per-step synchronisation and averages the trainers' copies
only every K iterations. Here, on the partitioned cache's plans
(:mod:`bagpipe.distributed.partition`), the row strategy of a trainer is:

* **A shared row** -- synchronised in the exact cache (used by several trainers this
  step, or staying cached), or still holding un-averaged copies -- is held by every
  trainer. Each trainer updates its own copy with its *own* gradient (the mean over its
  B/N samples), only if it used the row this step; nothing is communicated.
* **A local row** (one user, leaving the cache after the step, no un-averaged copies)
  has one copy: its user updates it exactly as the partitioned cache does (its gradient
  divided by N), as the average of N copies of which the others are unchanged would be
  under SGD.
* **Averaging**: every K steps, every shared row's copies are averaged (weights and
  optimizer state, one all-reduce of a (n, D + S) buffer); between two such steps, the
  shared rows leaving the cache after a step, or forced out before the next one, are
  averaged first, so a row is written back only once its copies agree; and every row
  is averaged before the run needs every row final (an evaluation, a checkpoint, the
  end). Which rows are shared is decided from the plans' lists that are the same on
  every trainer, so every trainer takes part in the same all-reduces in the same order.

With SGD and K = 1 the average of the trainers' copies, ``w - lr * mean_i(g_i)``, is the
exact cache's update (within float rounding); with row-wise Adagrad or Adam the average
of the trainers' updates is not the update of the averaged gradient -- that, and the
stale copies between averagings, is the approximation. The bytes all-reduced per step
are reported beside the exact caches' (``sync_bytes_per_step``).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from bagpipe.cache.allreduce import _update
from bagpipe.cache.slots import SlotCache
from bagpipe.optim.sparse import SparseOptimizer


class PeriodicRowUpdate:
    """The row strategy of a trainer under ``--cache-sync periodic:K`` (see the module
    docstring and :class:`bagpipe.train.step.RowUpdate`)."""

    def __init__(self, opt: SparseOptimizer, cache: SlotCache, period: int, num_trainers: int, group=None):
        self.opt, self.cache, self.K, self.N, self.group = opt, cache, int(period), int(num_trainers), group
        self.dirty = np.zeros(cache.weights.shape[0], dtype=bool)  # slots whose copies may differ between trainers
        self.bytes_synced: list[int] = []  # per step, this trainer's all-reduce contribution
        self._pending_bytes = 0  # averaged before the step's plan (forced evictions), counted with the step
        self.averages = 0
        self.average_s = 0.0

    @torch.no_grad()
    def _average(self, slots: np.ndarray) -> None:
        """Average the copies of ``slots`` (the same slots, in the same order, on every trainer)."""
        if len(slots) == 0:
            return
        t0 = time.perf_counter()
        idx = self.cache.index(slots)
        w, s = self.cache.weights.index_select(0, idx), self.cache.state.index_select(0, idx)
        buf = torch.cat([w, s], dim=1)
        if self.N > 1:
            dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group)
            buf /= self.N
        D = w.shape[1]
        self.cache.weights.index_copy_(0, idx, buf[:, :D])
        self.cache.state.index_copy_(0, idx, buf[:, D:])
        self.dirty[slots] = False
        self._pending_bytes += buf.numel() * buf.element_size() if self.N > 1 else 0
        self.averages += 1
        self.average_s += time.perf_counter() - t0

    @torch.no_grad()
    def apply(self, inp, rows_u: torch.Tensor, grad_u: torch.Tensor) -> None:
        plan = inp.plan
        slots_u = inp.index
        shared_now = np.zeros_like(self.dirty)
        shared_now[plan.sync_slots] = True
        shared_now |= self.dirty
        mine_shared = torch.from_numpy(shared_now[plan.slots]).to(slots_u.device)  # plan.slots: inp.index on the host
        if bool(mine_shared.any()):  # its own copy, its own gradient
            _update(self.cache, self.opt, inp.step, slots_u[mine_shared], grad_u[mine_shared], rows_u[mine_shared])
        local = ~mine_shared
        if bool(local.any()):  # one copy: the exact partitioned cache's update
            _update(self.cache, self.opt, inp.step, slots_u[local], grad_u[local] / self.N, rows_u[local])
        if (inp.step + 1) % self.K == 0:
            self._average(np.flatnonzero(shared_now))
        else:
            leaving = np.zeros_like(self.dirty)
            leaving[plan.evict_after_slots] = True
            leaving[plan.drop_after_slots] = True
            self._average(np.flatnonzero(shared_now & leaving))
            self.dirty = shared_now & ~leaving
        self.bytes_synced.append(self._pending_bytes)
        self._pending_bytes = 0

    def before_evict(self, plan) -> None:
        """Rows forced out before ``plan`` (written back by one trainer, dropped by the others) are averaged first."""
        out = np.zeros_like(self.dirty)
        out[plan.evict_before_slots] = True
        out[plan.drop_before_slots] = True
        self._average(np.flatnonzero(out & self.dirty))

    def finish(self) -> None:
        """Every row final: every un-averaged row is averaged now."""
        self._average(np.flatnonzero(self.dirty))

    def phase_seconds(self) -> dict:
        return {"sync_wait": self.average_s}

    def stats(self) -> dict:
        mean = float(np.mean(self.bytes_synced)) if self.bytes_synced else 0.0
        return {
            "sync_bytes_per_step": mean,
            "periodic": {"period": self.K, "averagings": self.averages, "sync_bytes_per_step": mean},
        }
