"""Hotline's step (``--mode hotline``): a popular and a non-popular micro-batch in one step.

Hotline (arXiv 2204.05436) splits every mini-batch into its *popular* inputs (every
lookup a hot row) and the rest. Its accelerator computes the popular micro-batch from
the hot rows in fast memory while the rest's cold rows are gathered from slow memory,
then computes the rest, and the two micro-batches' gradients make one mini-batch update.

In software, around the same pieces as every mode: the step's cold rows are read by the
executor's reader thread (the ``deferred`` executor, :class:`bagpipe.cache.executor.DeferredReadExecutor`) while this step runs
the popular micro-batch's forward and backward on the hot rows alone; then
``inp.ready()`` installs the cold rows and the non-popular micro-batch runs on hot and
cold rows. Each micro-batch's loss is its summed log loss over B (the whole batch's
size), so the two backward passes add up to the mini-batch's mean-loss gradient; the
dense optimizer and the row strategy then step once, on the batch's unique rows in
ascending row order, as :func:`bagpipe.train.step.plain.train_step` does. The maths is the
mini-batch's; only the order of summation differs (each row's gradient is the sum of two
partial sums), so the result equals ``--mode full`` to within float rounding, not bitwise.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from bagpipe.accel.hot import HotPlan
from bagpipe.data.batch import select_samples
from bagpipe.models.embedding import gather_rows
from bagpipe.train.protocols import RowUpdate, StepInput
from bagpipe.train.step.plain import forward_logits


def _micro_batch(
    model, leaf: torch.Tensor, local: np.ndarray, inp: StepInput, samples: np.ndarray, times: dict
) -> float:
    """Forward and backward of ``samples`` of the batch, pooling from ``leaf`` (row u of the
    batch's unique rows at ``local[u]``); the loss is summed and divided by the batch's B."""
    t0 = time.perf_counter()
    sub, pos = select_samples(inp.batch, samples)
    inverse = torch.from_numpy(local[inp.inverse[torch.from_numpy(pos)].numpy()])
    logits = forward_logits(model, leaf, inverse, sub)
    loss = F.binary_cross_entropy_with_logits(logits, sub.labels, reduction="sum") / inp.batch.batch_size
    t1 = time.perf_counter()
    loss.backward()
    times["forward"] += t1 - t0
    times["backward"] += time.perf_counter() - t1
    return float(loss.detach())


def hotline_step(
    model: torch.nn.Module, dense_opt: torch.optim.Optimizer, rows: RowUpdate, inp: StepInput, times: dict
) -> float:
    """One step as two micro-batches (see the module docstring); returns the batch's mean
    loss. ``inp.plan`` is a :class:`HotPlan` (its ``hot`` rows and ``popular`` inputs)."""
    plan = inp.plan
    assert isinstance(plan, HotPlan), "Hotline's step runs on the plans of a hot tier"
    hot_u, cold_u = np.flatnonzero(plan.hot), np.flatnonzero(~plan.hot)
    local = np.empty(len(plan.hot), dtype=np.int64)  # each unique row's place in cat(hot leaf, cold leaf)
    local[hot_u] = np.arange(len(hot_u))
    local[cold_u] = len(hot_u) + np.arange(len(cold_u))
    popular, rest = np.flatnonzero(plan.popular), np.flatnonzero(~plan.popular)
    dense_opt.zero_grad(set_to_none=True)
    hot_leaf = gather_rows(inp.weights, inp.index[torch.from_numpy(hot_u)])
    loss = _micro_batch(model, hot_leaf, local, inp, popular, times) if len(popular) else 0.0
    inp.ready()  # the cold rows, read while the popular micro-batch ran
    cold_leaf = gather_rows(inp.weights, inp.index[torch.from_numpy(cold_u)])
    if len(rest):
        loss += _micro_batch(model, torch.cat([hot_leaf, cold_leaf]), local, inp, rest, times)
    t0 = time.perf_counter()
    dense_opt.step()
    rows_u = torch.empty(len(local), inp.weights.shape[1], dtype=inp.weights.dtype)
    grad_u = torch.zeros_like(rows_u)
    for idx, leaf in ((hot_u, hot_leaf), (cold_u, cold_leaf)):
        rows_u[idx] = leaf.detach()
        if leaf.grad is not None:
            grad_u[idx] = leaf.grad
    rows.apply(inp, rows_u, grad_u)
    times["optimizer"] += time.perf_counter() - t0
    return loss
