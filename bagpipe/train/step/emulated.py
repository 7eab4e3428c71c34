"""The emulated step (``--emulate-compute SPEC``, benchmarks only): a calibrated delay in
place of forward and backward, everything around it real. Not training.

What stays real: the step's rows are in place (``inp.ready()``: the fetches, the
oracle's plan), the row strategy gets the step's U rows and a (U, D) gradient (zeros) so
the row sync all-reduces the touched cached rows with their real sizes and the row-wise
optimizer runs on them, the dense optimizer steps, and the dense all-reduce runs through
DDP with every dense gradient at its real size: the model (DDP) runs forward and
backward on ONE sample of the batch with the loss multiplied by 0, so each parameter's
gradient is a zero tensor of its shape and DDP's buckets are all-reduced as in a real step.

Timing (seconds of :meth:`EmulatedCompute.seconds` over the trainer's batch, split
1 : 2 between forward and backward as a GPU's step roughly is): the one-sample forward,
then a sleep to the forward's deadline; then a sleep for the backward's share, then the
one-sample backward, whose DDP all-reduce therefore is NOT overlapped with the emulated
backward (an upper bound on the dense sync's cost: a real DDP overlaps all but its last
bucket with backward). Both land in ``times["forward"|"backward"]`` as a real step's do.

The values do not change (zero gradients leave sgd/adagrad/adam rows and weights where
they are): the run's evaluation and digest are those of its initial parameters, so the
config asks for ``--no-digest`` and the summary's ``approximation`` names
``emulate-compute SPEC (did not train)`` (``exact`` false).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from bagpipe.config.compute import EmulatedCompute
from bagpipe.data.batch import select_samples
from bagpipe.train.protocols import RowUpdate, StepInput
from bagpipe.train.step.plain import forward_logits

FORWARD_SHARE = 1 / 3
"""The forward's part of the emulated compute (the backward has the rest)."""


class EmulatedStep:
    """A :class:`~bagpipe.train.protocols.StepFn` that sleeps ``compute.seconds(B)`` (B: the
    step's batch on this trainer) instead of computing; ``clock`` and ``sleep`` are
    injectable (tests)."""

    def __init__(
        self,
        compute: EmulatedCompute,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.compute, self.clock, self.sleep = compute, clock, sleep
        self.steps = 0
        self.delay_s = 0.0
        self.dense_bytes = 0  # handed to DDP's all-reduce (counted by a comm hook)
        self.row_grad_bytes = 0  # the (U, D) gradients handed to the row strategy
        self._hooked = False

    def _until(self, deadline: float) -> None:
        left = deadline - self.clock()
        if left > 0:
            self.sleep(left)

    def __call__(
        self, model: torch.nn.Module, dense_opt: torch.optim.Optimizer, rows: RowUpdate, inp: StepInput, times: dict
    ) -> float:
        inp.ready()
        self._count_allreduce(model)
        delay = self.compute.seconds(inp.batch.batch_size)
        t0 = self.clock()
        rows_u = inp.weights.index_select(0, inp.index)  # (U, D): the step's rows, as a real step reads them
        loss = self._one_sample(model, rows_u, inp)
        self._until(t0 + delay * FORWARD_SHARE)
        t1 = self.clock()
        dense_opt.zero_grad(set_to_none=True)
        self._until(t1 + delay * (1 - FORWARD_SHARE))
        (loss * 0.0).backward()  # zero gradients of every dense parameter: DDP all-reduces them
        t2 = self.clock()
        dense_opt.step()
        grad_u = torch.zeros_like(rows_u)
        rows.apply(inp, rows_u, grad_u)
        t3 = self.clock()
        self.steps += 1
        self.delay_s += delay
        self.row_grad_bytes += grad_u.numel() * grad_u.element_size()
        times["forward"] += t1 - t0
        times["backward"] += t2 - t1
        times["optimizer"] += t3 - t2
        return float(loss.detach())

    def _count_allreduce(self, model: torch.nn.Module) -> None:
        """On a DDP model, once: count the bytes of every bucket DDP all-reduces (the hook
        all-reduces and averages as DDP's own does)."""
        if self._hooked or not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def counted(group, bucket):
            buf = bucket.buffer()
            self.dense_bytes += buf.numel() * buf.element_size()
            return allreduce_hook(group, bucket)

        model.register_comm_hook(model.process_group, counted)
        self._hooked = True

    def report(self) -> dict:
        """The summary's ``approximation.emulated_compute``."""
        n = max(self.steps, 1)
        return {
            "spec": self.compute.spec,
            "trained": False,
            "steps": self.steps,
            "delay_ms_per_step": 1000 * self.delay_s / n,
            "dense_allreduce_bytes_per_step": self.dense_bytes / n,
            "row_grad_bytes_per_step": self.row_grad_bytes / n,
        }

    @staticmethod
    def _one_sample(model: torch.nn.Module, rows_u: torch.Tensor, inp: StepInput) -> torch.Tensor:
        """The model's loss on the batch's first sample (its graph reaches every dense parameter)."""
        sub, pos = select_samples(inp.batch, np.zeros(1, dtype=np.int64))
        inverse = inp.inverse[torch.from_numpy(pos).to(inp.inverse.device)]
        logits = forward_logits(model, rows_u, inverse, sub)
        return F.binary_cross_entropy_with_logits(logits, sub.labels.to(logits.device))
