"""The plain training step, shared by every mode and every topology (Hotline's variant
is :mod:`bagpipe.train.step.hotline`).

The step gathers the batch's unique rows from whatever tensor holds them (the full
tables or the cache) into a (U, D) leaf, pools, runs the model, backpropagates, steps
the dense optimizer, then hands the rows and their gradients to a
:class:`~bagpipe.train.protocols.RowUpdate`,
the step's *strategy* for embedding rows: :class:`LocalRowUpdate` applies the row-wise
sparse optimizer on one process; a data-parallel trainer's strategy
(:class:`bagpipe.cache.allreduce.SyncedRowUpdate`) first averages the gradients of the rows
the trainers share. Given the same (U, D) values in the same order, every mode
performs exactly the same float operations.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from bagpipe.data.batch import Batch
from bagpipe.models.embedding import gather_rows, pool
from bagpipe.optim.sparse import SparseOptimizer
from bagpipe.oracle.plan import Plan
from bagpipe.train.protocols import RowUpdate, StepInput


class LocalRowUpdate:
    """One process: the row-wise optimizer applied to the U rows in place."""

    def __init__(self, opt: SparseOptimizer):
        self.opt = opt

    @torch.no_grad()
    def apply(self, inp: StepInput, rows_u: torch.Tensor, grad_u: torch.Tensor) -> None:
        state_u = inp.state.index_select(0, inp.index)
        new_w, new_s = self.opt.update(rows_u, state_u, grad_u, inp.step)
        inp.weights.index_copy_(0, inp.index, new_w)
        inp.state.index_copy_(0, inp.index, new_s)

    def before_evict(self, plan: Plan) -> None:
        pass

    def finish(self) -> None:
        pass

    def phase_seconds(self) -> dict:
        return {}

    def stats(self) -> dict:
        return {}


def forward_logits(model: torch.nn.Module, rows_u: torch.Tensor, inverse: torch.Tensor, batch: Batch) -> torch.Tensor:
    """(B,) logits of ``batch`` given the values (U, D) of its unique rows; computed on
    ``rows_u``'s device (the batch, which lives on the host, is copied there)."""
    dev = rows_u.device
    pooled = pool(rows_u, inverse, batch.offsets.to(dev), batch.batch_size, batch.num_features)
    return model(batch.dense.to(dev), pooled)


def train_step(
    model: torch.nn.Module,
    dense_opt: torch.optim.Optimizer,
    rows: RowUpdate,
    inp: StepInput,
    times: dict,
) -> float:
    """Run one step; adds seconds to times["forward"|"backward"|"optimizer"]; returns the loss.

    ``model`` may be wrapped (DDP averages the dense gradients during ``backward``).
    """
    inp.ready()
    t0 = time.perf_counter()
    rows_u = gather_rows(inp.weights, inp.index)
    logits = forward_logits(model, rows_u, inp.inverse, inp.batch)
    loss = F.binary_cross_entropy_with_logits(logits, inp.batch.labels.to(logits.device))
    t1 = time.perf_counter()
    dense_opt.zero_grad(set_to_none=True)
    loss.backward()
    t2 = time.perf_counter()
    dense_opt.step()
    rows.apply(inp, rows_u.detach(), rows_u.grad)
    t3 = time.perf_counter()
    times["forward"] += t1 - t0
    times["backward"] += t2 - t1
    times["optimizer"] += t3 - t2
    return float(loss.detach())
