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
then a sleep to the forward's deadline; then the one-sample backward, spread over the
backward's share as a real backward is: a hook on every dense parameter's gradient sleeps
until that gradient would be ready, the backward taken as proportional to the elements of
the weights it has multiplied so far (matrix products dominate the dense model). So DDP
all-reduces each bucket of gradients while the rest of the emulated backward still runs,
as it does in a real step, and only what is left after the last gradient is waited for
(``dense_wait_ms_per_step`` in the report; ``--ddp-bucket-mb`` sets the buckets). Both
land in ``times["forward"|"backward"]`` as a real step's do.

The values do not change (zero gradients leave sgd/adagrad/adam rows and weights where
they are): the run's evaluation and digest are those of its initial parameters, so the
config asks for ``--no-digest`` and the summary's ``approximation`` names
``emulate-compute SPEC (did not train)`` (``exact`` false).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from bagpipe.config.compute import EmulatedCompute
from bagpipe.data.batch import select_samples
from bagpipe.train.protocols import RowUpdate, StepInput
from bagpipe.train.step.plain import forward_logits

FORWARD_SHARE = 1 / 3
"""The forward's part of the emulated compute (the backward has the rest)."""


@dataclass
class _Pace:
    """The emulated backward under way: it started at ``start`` and takes ``seconds`` for
    ``total`` elements of dense weights, of which ``done`` have their gradients."""

    total: float = 1.0
    start: float = 0.0
    seconds: float = 0.0
    done: float = 0.0
    active: bool = False

    def begin(self, start: float, seconds: float) -> None:
        self.start, self.seconds, self.done, self.active = start, seconds, 0.0, True

    def deadline(self, numel: int) -> float:
        """When the gradient of the next ``numel`` elements is ready."""
        self.done += numel
        return self.start + self.seconds * min(self.done / self.total, 1.0)


class EmulatedStep:
    """A :class:`~bagpipe.train.protocols.StepFn` that sleeps ``compute.seconds(B)`` (B: the
    step's batch on this trainer) instead of computing; ``clock`` and ``sleep`` are
    injectable (tests). The dense all-reduce's wait and DDP's all-reduces per step are
    averaged over the steps after the first ``warmup`` (``--warmup-steps``, as the summary's
    times are): DDP's first step all-reduces every gradient in one bucket before it builds
    its buckets. On a GPU the wait is read after a device synchronisation (NCCL's
    all-reduce only orders the stream)."""

    def __init__(
        self,
        compute: EmulatedCompute,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        warmup: int = 0,
    ):
        self.compute, self.clock, self.sleep, self.warmup = compute, clock, sleep, warmup
        self.steps = 0
        self.delay_s = 0.0
        self.dense_bytes = 0  # handed to DDP's all-reduce (counted by a comm hook)
        self.row_grad_bytes = 0  # the (U, D) gradients handed to the row strategy
        # per step: (the backward's end past its deadline -- the dense sync left over, seconds;
        # the all-reduces DDP ran)
        self.dense_steps: list[tuple[float, int]] = []
        self._buckets_this_step = 0
        self._hooked = False
        self._paced: torch.nn.Module | None = None  # the model whose gradients pace the backward
        self._pace = _Pace()
        self._pace_hooks: list = []  # their handles, removed when another model comes

    def _until(self, deadline: float) -> None:
        left = deadline - self.clock()
        if left > 0:
            self.sleep(left)

    def __call__(
        self, model: torch.nn.Module, dense_opt: torch.optim.Optimizer, rows: RowUpdate, inp: StepInput, times: dict
    ) -> float:
        inp.ready()
        self._count_allreduce(model)
        self._pace_backward(model)
        self._buckets_this_step = 0
        delay = self.compute.seconds(inp.batch.batch_size)
        t0 = self.clock()
        rows_u = inp.weights.index_select(0, inp.index)  # (U, D): the step's rows, as a real step reads them
        loss = self._one_sample(model, rows_u, inp)
        self._until(t0 + delay * FORWARD_SHARE)
        t1 = self.clock()
        dense_opt.zero_grad(set_to_none=True)
        backward_s = delay * (1 - FORWARD_SHARE)
        self._pace.begin(t1, backward_s)
        try:  # zero gradients of every dense parameter, ready at their times: DDP all-reduces them
            (loss * 0.0).backward()
        finally:
            self._pace.active = False  # a backward outside this step's does not sleep
        deadline = t1 + backward_s
        if rows_u.is_cuda:  # NCCL's all-reduce only makes the stream wait: wait for it here
            torch.cuda.synchronize(rows_u.device)
        self.dense_steps.append((max(self.clock() - deadline, 0.0), self._buckets_this_step))
        self._until(deadline)  # a parameter the backward did not reach still had its time
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
            self._buckets_this_step += 1
            return allreduce_hook(group, bucket)

        model.register_comm_hook(model.process_group, counted)
        self._hooked = True

    def _pace_backward(self, model: torch.nn.Module) -> None:
        """Once per model: a hook on each dense parameter's gradient that sleeps until the
        emulated backward has done the elements before it and its own (in the order the
        gradients arrive), so its gradient -- and DDP's bucket holding it -- is ready when a
        real backward would have it."""
        if self._paced is model:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        self._pace = pace = _Pace(total=float(sum(p.numel() for p in params)) or 1.0)

        def hook(numel: int) -> Callable[[torch.Tensor], None]:
            def ready(_grad: torch.Tensor) -> None:
                if pace.active:
                    self._until(pace.deadline(numel))

            return ready

        for h in self._pace_hooks:  # another model: the previous one's gradients pace nothing
            h.remove()
        self._pace_hooks = [p.register_hook(hook(p.numel())) for p in params]
        self._paced = model

    def report(self) -> dict:
        """The summary's ``approximation.emulated_compute``."""
        n = max(self.steps, 1)
        # DDP's all-reduces over the steps after the warm-up, as the summary's times count
        # them (every step where no more ran): DDP's first step is one bucket of everything
        measured = self.dense_steps[self.warmup :] if len(self.dense_steps) > self.warmup else self.dense_steps
        m = max(len(measured), 1)
        return {
            "spec": self.compute.spec,
            "trained": False,
            "steps": self.steps,
            "delay_ms_per_step": 1000 * self.delay_s / n,
            "dense_allreduce_bytes_per_step": self.dense_bytes / n,
            "dense_allreduce_buckets_per_step": sum(b for _, b in measured) / m,
            "row_grad_bytes_per_step": self.row_grad_bytes / n,
            "dense_wait_ms_per_step": 1000 * sum(w for w, _ in measured) / m,
        }

    @staticmethod
    def _one_sample(model: torch.nn.Module, rows_u: torch.Tensor, inp: StepInput) -> torch.Tensor:
        """The model's loss on the batch's first sample (its graph reaches every dense parameter)."""
        sub, pos = select_samples(inp.batch, np.zeros(1, dtype=np.int64))
        inverse = inp.inverse[torch.from_numpy(pos).to(inp.inverse.device)]
        logits = forward_logits(model, rows_u, inverse, sub)
        return F.binary_cross_entropy_with_logits(logits, sub.labels.to(logits.device))
