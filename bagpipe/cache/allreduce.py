"""End-of-iteration embedding synchronisation among data-parallel trainers.

After backward, each trainer holds the gradients of *its* unique rows, computed on its
1/N slice of the global batch (a mean over B/N samples). One process on the global
batch would see, for every row, the mean over B samples = the sum over trainers of
(trainer gradient / N). So: divide by N, sum the synchronised rows' gradients over the
trainers (one all-reduce of a (K, D) buffer in a row order every trainer shares; a
trainer that did not use a row adds zeros), and let every trainer apply the same
row-wise optimizer update to them; local rows (one user, expiring) are updated by
their only user with its own gradient, without any communication.

With N = 1 nothing is communicated and every row gets exactly the update the
reference trainer gives it (the row-wise optimizers act on each row alone), so the
result is bitwise that of ``--mode full``.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from bagpipe.cache.slots import SlotCache
from bagpipe.optim.sparse import SparseOptimizer


def _update(
    cache: SlotCache,
    opt: SparseOptimizer,
    step: int,
    slots: torch.Tensor,
    grad: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> None:
    w = cache.weights.index_select(0, slots) if weights is None else weights
    s = cache.state.index_select(0, slots)
    new_w, new_s = opt.update(w, s, grad, step)
    cache.weights.index_copy_(0, slots, new_w)
    cache.state.index_copy_(0, slots, new_s)


class PendingSync:
    """The second half of a step's synchronisation, in flight while the next step computes.

    Holds the all-reduce of the deferred rows' gradients; :meth:`finish` waits for it
    and applies their update. It must run before those rows are read, written back or
    their slots reused -- the trainer finishes it after the next step's backward, or
    earlier if the next plan evicts one of :attr:`slots`. The update is that of ``step``,
    the step whose gradients these are (its learning rate, Adam's t), whenever it runs.
    """

    def __init__(self, work, buf: torch.Tensor, slots: torch.Tensor, cache: SlotCache, opt: SparseOptimizer, step: int):
        self.work, self.buf, self.slots, self.cache, self.opt, self.step = work, buf, slots, cache, opt, step
        self.slot_set = slots.cpu().numpy()

    @torch.no_grad()
    def finish(self) -> None:
        self.work.wait()
        _update(self.cache, self.opt, self.step, self.slots, self.buf)

    def touches(self, slots: np.ndarray) -> bool:
        """Whether any of ``slots`` is one of the pending rows' slots."""
        return len(slots) > 0 and bool(np.isin(slots, self.slot_set).any())


@torch.no_grad()
def sync_and_update(
    cache: SlotCache,
    opt: SparseOptimizer,
    step: int,
    rows_u: torch.Tensor,
    grad_u: torch.Tensor,
    slots_u: torch.Tensor,
    sync_slots: torch.Tensor,
    sync_pos: torch.Tensor,
    num_trainers: int,
    group=None,
    urgent: int | None = None,
) -> tuple[int, PendingSync | None]:
    """Average the synchronised rows' gradients over the trainers and update every row.

    Args:
        step: the 0-based index of the step whose gradients these are.
        rows_u, grad_u: (U_i, D) this trainer's unique rows (values used in the step) and
            their gradients.
        slots_u: (U_i,) their cache slots.
        sync_slots: (K,) slots of the step's synchronised rows (same order on every trainer).
        sync_pos: (U_i,) index of each of this trainer's rows in ``sync_slots``, -1 if local.
        urgent: the first ``urgent`` of ``sync_slots`` are reduced and updated now; the
            rest in a :class:`PendingSync` returned to the caller (None: all now).
    Returns:
        (bytes this trainer contributed to the all-reduces (K * D * 4; 0 when N = 1),
        the pending second half or None).
    """
    N = int(num_trainers)
    grad = grad_u / N if N > 1 else grad_u
    in_sync = sync_pos >= 0
    K = int(sync_slots.numel())
    K1 = K if urgent is None or N == 1 else int(urgent)
    sent, pending = 0, None
    if K:
        buf = torch.zeros(K, grad.shape[1], dtype=grad.dtype, device=grad.device)
        buf.index_copy_(0, sync_pos[in_sync], grad[in_sync])
        if N > 1:
            sent = buf.numel() * buf.element_size()
            if K1:  # what the next step needs goes first, and is waited for
                dist.all_reduce(buf[:K1], op=dist.ReduceOp.SUM, group=group)
            if K1 < K:
                rest = buf[K1:]
                work = dist.all_reduce(rest, op=dist.ReduceOp.SUM, group=group, async_op=True)
                pending = PendingSync(work, rest, sync_slots[K1:], cache, opt, step)
        if K1:
            _update(cache, opt, step, sync_slots[:K1], buf[:K1])
    local = ~in_sync
    if bool(local.any()):
        _update(cache, opt, step, slots_u[local], grad[local], rows_u[local])
    return sent, pending


class SyncedRowUpdate:
    """The row strategy of a data-parallel trainer (see :class:`bagpipe.train.step.RowUpdate`).

    Each step averages the synchronised rows' gradients over the trainers and updates
    every row (:func:`sync_and_update`); the rows the next step does not need are
    synchronised while it computes, and that deferred half is finished after the next
    step's backward, or earlier when a plan is about to evict one of its rows
    (:meth:`before_evict`) or the run needs every row final (:meth:`finish`).
    """

    def __init__(self, opt: SparseOptimizer, cache: SlotCache, group=None):
        self.opt, self.cache, self.group = opt, cache, group
        self.pending: PendingSync | None = None
        self.sync_wait_s = 0.0  # time spent completing deferred synchronisations
        self.bytes_synced: list[int] = []  # per step, this trainer's all-reduce contribution

    def apply(self, inp, rows_u: torch.Tensor, grad_u: torch.Tensor) -> None:
        plan = inp.plan
        self.finish()  # the previous step's deferred half has overlapped this step's compute
        sent, self.pending = sync_and_update(
            self.cache,
            self.opt,
            inp.step,
            rows_u,
            grad_u,
            inp.index,
            self.cache.index(plan.sync_slots),
            self.cache.index(plan.sync_pos),
            plan.num_trainers,
            self.group,
            urgent=plan.sync_urgent,
        )
        self.bytes_synced.append(sent)

    def before_evict(self, plan) -> None:
        if self.pending is not None and (
            self.pending.touches(plan.evict_before_slots) or self.pending.touches(plan.drop_before_slots)
        ):
            self.finish()

    def finish(self) -> None:
        if self.pending is not None:
            t0 = time.perf_counter()
            self.pending.finish()
            self.pending = None
            self.sync_wait_s += time.perf_counter() - t0

    def phase_seconds(self) -> dict:
        return {"sync_wait": self.sync_wait_s}

    def stats(self) -> dict:
        return {"sync_bytes_per_step": float(np.mean(self.bytes_synced)) if self.bytes_synced else 0.0}
