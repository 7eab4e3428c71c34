"""The owner-based row exchange on a trainer (``--cache-sync owner``): the row strategy that
runs the rounds :mod:`bagpipe.distributed.exchange` plans.

A round has two halves, each two ``all_to_all_single`` calls on the trainers' group:

1. **reduce** -- every trainer sends the gradients (divided by N) of the rows it used but
   does not own to their owners; each owner sums, for each of its rows, its own and the
   received contributions in trainer order and applies the row-wise optimizer (a row
   with one user: its own gradient alone, no communication);
2. **deliver** -- every trainer sends the weights and optimizer state of the rows the
   plan names to the trainers that use them next and do not hold them fresh; they
   install them into the same slots.

The urgent half runs at once, after backward. The deferred half's gradients go out
asynchronously right after it and are summed, applied and followed by its deliveries
when the next step has run backward (:meth:`OwnerRowUpdate.finish`, at the start of the
next :meth:`~OwnerRowUpdate.apply`), or at a flush. Every trainer calls the same
collectives in the same order: whether a collective runs is decided by the plan's
``exchange_rows``, the same on every trainer, never by a trainer's own rows.

After a round a trainer's ``slot_rows`` marks exactly the rows it owns (it writes them
back); the copies it only used or received are not marked (they may go stale) but stay
readable for the steps that use them.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from bagpipe.cache.allreduce import _update
from bagpipe.cache.slots import SlotCache
from bagpipe.distributed.partition import TrainerPlan
from bagpipe.errors import BagpipeError
from bagpipe.optim.sparse import SparseOptimizer


def _half(values: np.ndarray, counts: np.ndarray, half: int, N: int) -> tuple[np.ndarray, list[int]]:
    """Half ``half`` (0 urgent, 1 deferred) of a list ordered like ``counts`` (2N,): (values, N counts)."""
    c = np.asarray(counts, dtype=np.int64)
    if len(c) == 0:
        return np.zeros(0, dtype=np.int64), [0] * N
    start = int(c[:N].sum()) if half else 0
    mine = c[half * N : (half + 1) * N]
    return np.asarray(values[start : start + int(mine.sum())], dtype=np.int64), [int(x) for x in mine]


class _Deferred:
    """A round's deferred half: its gradients in flight while the next step computes."""

    def __init__(self, plan: TrainerPlan, grad: torch.Tensor, slots_u: torch.Tensor, work, recv: torch.Tensor | None):
        self.plan, self.grad, self.slots_u, self.work, self.recv = plan, grad, slots_u, work, recv
        N = plan.num_trainers
        touched = [plan.slots[np.asarray(plan.own_pos[plan.own_urgent :], dtype=np.int64)]]
        touched.append(_half(plan.dlv_send_slots, plan.dlv_send_counts, 1, N)[0])
        touched.append(_half(plan.dlv_recv_slots, plan.dlv_recv_counts, 1, N)[0])
        self.slot_set = np.concatenate(touched)

    def touches(self, slots: np.ndarray) -> bool:
        return len(slots) > 0 and len(self.slot_set) > 0 and bool(np.isin(slots, self.slot_set).any())


class OwnerRowUpdate:
    """The row strategy of a trainer in the owner-based exchange (a
    :class:`~bagpipe.train.protocols.RowUpdate`). ``group``: the trainers' group (None with
    one trainer, where nothing is exchanged)."""

    def __init__(self, opt: SparseOptimizer, cache: SlotCache, rank: int, group=None):
        self.opt, self.cache, self.rank, self.group = opt, cache, rank, group
        gloo = group is not None and dist.get_backend(group) == "gloo"
        # gloo moves host tensors: a cache on a GPU exchanges through host copies
        self.comm_device = torch.device("cpu") if gloo else cache.device
        self.pending: _Deferred | None = None
        self.sync_wait_s = 0.0  # completing deferred halves
        # per step, what this trainer sent (gradients and rows; a deferred half counts with its step)
        self.bytes_sent: list[int] = []

    # ----------------------------------------------------------------- collectives
    def _all_to_all(
        self, send: torch.Tensor, send_counts: list[int], recv_counts: list[int], width: int, async_op=False
    ):
        recv = torch.empty(sum(recv_counts), width, dtype=send.dtype, device=self.comm_device)
        work = dist.all_to_all_single(
            recv, send.to(self.comm_device), recv_counts, send_counts, group=self.group, async_op=async_op
        )
        return recv, work

    def _reduce(self, plan: TrainerPlan, half: int, grad: torch.Tensor, async_op: bool):
        """Send the half's gradients to their owners; (received gradients or None, work or None)."""
        if int(plan.exchange_rows[half]) == 0:
            return None, None
        N = plan.num_trainers
        pos, send_counts = _half(plan.red_send_pos, plan.red_send_counts, half, N)
        _, recv_counts = _half(plan.red_recv_pos, plan.red_recv_counts, half, N)
        send = grad.index_select(0, self.cache.index(pos))
        self.bytes_sent[-1] += send.numel() * send.element_size()
        return self._all_to_all(send, send_counts, recv_counts, grad.shape[1], async_op)

    def _sum_and_update(self, plan: TrainerPlan, half: int, grad, slots_u, recv: torch.Tensor | None) -> None:
        """Sum the half's owned rows' gradients in trainer order and update them."""
        own = np.asarray(plan.own_pos, dtype=np.int64)
        own = own[: plan.own_urgent] if half == 0 else own[plan.own_urgent :]
        if len(own) == 0:
            return
        own_t = self.cache.index(own)
        mine = grad.index_select(0, own_t)
        if recv is None or recv.numel() == 0:
            acc = mine  # nobody else used these rows: this trainer's gradient alone (bitwise with N = 1)
        else:
            N = plan.num_trainers
            recv = recv.to(grad.device)
            pos, counts = _half(plan.red_recv_pos, plan.red_recv_counts, half, N)
            where = np.full(len(plan.rows), -1, dtype=np.int64)
            where[own] = np.arange(len(own))
            acc = torch.zeros_like(mine)
            start = 0
            for j in range(N):  # trainer order: every row's contributions are added 0, 1, ..., N-1
                if j == self.rank:
                    acc += mine
                    continue
                n = counts[j]
                if n:
                    acc.index_add_(0, self.cache.index(where[pos[start : start + n]]), recv[start : start + n])
                start += n
        slots = slots_u.index_select(0, own_t)
        _update(self.cache, self.opt, plan.step, slots, acc)
        self.cache.slot_rows[plan.slots[own]] = plan.rows[own]  # the owner writes these rows back

    def _deliver(self, plan: TrainerPlan, half: int) -> None:
        """Send the half's rows to the trainers that use them next; install what comes in."""
        if int(plan.exchange_rows[2 + half]) == 0:
            return
        N, D = plan.num_trainers, self.cache.weights.shape[1]
        slots, send_counts = _half(plan.dlv_send_slots, plan.dlv_send_counts, half, N)
        into, recv_counts = _half(plan.dlv_recv_slots, plan.dlv_recv_counts, half, N)
        idx = self.cache.index(slots)
        send = torch.cat([self.cache.weights.index_select(0, idx), self.cache.state.index_select(0, idx)], dim=1)
        self.bytes_sent[-1] += send.numel() * send.element_size()
        recv, _ = self._all_to_all(send, send_counts, recv_counts, send.shape[1])
        if len(into):
            recv = recv.to(self.cache.device)
            at = self.cache.index(into)
            # values only: the sender writes these rows back, not this trainer (slot_rows unchanged)
            self.cache.weights.index_copy_(0, at, recv[:, :D])
            self.cache.state.index_copy_(0, at, recv[:, D:])

    # --------------------------------------------------------------- the strategy
    @torch.no_grad()
    def apply(self, inp, rows_u: torch.Tensor, grad_u: torch.Tensor) -> None:
        plan: TrainerPlan = inp.plan
        self.finish()  # the previous round's deferred half has overlapped this step's compute
        self.bytes_sent.append(0)
        N = plan.num_trainers
        grad = grad_u / N if N > 1 else grad_u
        recv, work = self._reduce(plan, 0, grad, async_op=False)
        self._sum_and_update(plan, 0, grad, inp.index, recv)
        self._deliver(plan, 0)
        recv, work = self._reduce(plan, 1, grad, async_op=True)
        if work is not None or len(plan.own_pos) > plan.own_urgent or int(plan.exchange_rows[3]):
            self.pending = _Deferred(plan, grad, inp.index, work, recv)

    def before_evict(self, plan) -> None:
        if self.pending is not None and (
            self.pending.touches(plan.evict_before_slots) or self.pending.touches(plan.drop_before_slots)
        ):
            # the oracle makes every row that leaves before the next step urgent; finishing
            # here would call a collective the other trainers do not
            raise BagpipeError(f"bug: step {plan.step} frees a slot of step {self.pending.plan.step}'s deferred rows")

    @torch.no_grad()
    def finish(self) -> None:
        d, self.pending = self.pending, None
        if d is None:
            return
        t0 = time.perf_counter()
        if d.work is not None:
            d.work.wait()
        self._sum_and_update(d.plan, 1, d.grad, d.slots_u, d.recv)
        self._deliver(d.plan, 1)
        self.sync_wait_s += time.perf_counter() - t0

    def phase_seconds(self) -> dict:
        return {"sync_wait": self.sync_wait_s}

    def stats(self) -> dict:
        return {"sync_bytes_per_step": float(np.mean(self.bytes_sent)) if self.bytes_sent else 0.0}
