"""One training step, shared by every mode.

The step gathers the batch's unique rows from whatever tensor holds them (the full
tables or the cache) into a (U, D) leaf, pools, runs the model, backpropagates, steps
the dense optimizer, then applies the row-wise sparse optimizer to the U rows and
scatters them back. Given the same (U, D) values in the same order, every mode
performs exactly the same float operations.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from bagpipe.models.embedding import gather_rows, pool
from bagpipe.optim.sparse import SparseOptimizer
from bagpipe.train.backends import StepInput


def forward_logits(model: torch.nn.Module, rows_u: torch.Tensor, inverse: torch.Tensor, batch) -> torch.Tensor:
    pooled = pool(rows_u, inverse, batch.offsets, batch.batch_size, batch.num_features)
    return model(batch.dense, pooled)


def train_step(
    model: torch.nn.Module,
    dense_opt: torch.optim.Optimizer,
    sparse_opt: SparseOptimizer,
    inp: StepInput,
    times: dict,
) -> float:
    """Run one step; adds seconds to times["forward"|"backward"|"optimizer"]; returns the loss."""
    t0 = time.perf_counter()
    rows_u = gather_rows(inp.weights, inp.index)
    logits = forward_logits(model, rows_u, inp.inverse, inp.batch)
    loss = F.binary_cross_entropy_with_logits(logits, inp.batch.labels)
    t1 = time.perf_counter()
    dense_opt.zero_grad(set_to_none=True)
    loss.backward()
    t2 = time.perf_counter()
    dense_opt.step()
    with torch.no_grad():
        state_u = inp.state.index_select(0, inp.index)
        new_w, new_s = sparse_opt.update(rows_u.detach(), state_u, rows_u.grad)
        inp.weights.index_copy_(0, inp.index, new_w)
        inp.state.index_copy_(0, inp.index, new_s)
    t3 = time.perf_counter()
    times["forward"] += t1 - t0
    times["backward"] += t2 - t1
    times["optimizer"] += t3 - t2
    return float(loss.detach())
