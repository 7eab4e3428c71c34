"""Memory the run is given, and no more.

* :mod:`bagpipe.budget.cgroup` -- the memory cgroup this process runs in, its limit, its figures;
* :mod:`bagpipe.budget.estimate` -- what a run needs, part by part (``bagpipe plan`` prints it);
* :mod:`bagpipe.budget.shape` -- what of a run its memory depends on, read from its config,
  data and model;
* :mod:`bagpipe.budget.sizing` -- the budget (``--memory-budget-mb`` or the cgroup's limit)
  and the sizes that fit it, or a one-line refusal naming the smallest budget that works.

:func:`bagpipe.cache.setup.set_up_cache` applies a :class:`MemoryPlan`; an embedding
server applies its own (:func:`server_fit`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bagpipe.budget.estimate import Estimate, RunShape, Sizes, estimate, estimate_server
from bagpipe.budget.sizing import Budget, BudgetError, Fit, Wanted, fit
from bagpipe.store.diskio import DiskIO

__all__ = [
    "Budget",
    "BudgetError",
    "DiskIO",
    "Estimate",
    "Fit",
    "MemoryPlan",
    "RunShape",
    "Sizes",
    "Wanted",
    "estimate",
    "estimate_server",
    "fit",
    "memory_plan",
    "server_fit",
]


@dataclass(frozen=True)
class MemoryPlan:
    """What :func:`~bagpipe.cache.setup.set_up_cache` needs to fit a run to its budget."""

    budget: Budget
    shape: RunShape
    io: DiskIO = DiskIO()
    role: str = "trainer"


def memory_plan(cfg, dataset, stream, role: str = "trainer", shape: RunShape | None = None) -> MemoryPlan:
    """The memory plan of the run ``cfg`` (a :class:`~bagpipe.config.train.TrainConfig`)
    over ``dataset``'s train ``stream``: its budget and its shape (``shape``: as the run
    measured it already; None: measured here). ``role`` ``remote-trainer``: the trainers
    of a distributed job (the oracle role sizes their cache for them), each on 1/N of the batch."""
    remote = role == "remote-trainer"
    if shape is None:
        from bagpipe.budget.shape import run_shape

        share = stream.batch_size // cfg.dist.trainers if remote else None
        shape = run_shape(cfg, dataset, stream, share)
    if remote:  # its plan receiver holds up to --plans-in-flight plans
        shape = replace(shape, plans_received=cfg.dist.plans_in_flight, trainers=cfg.dist.trainers)
    return MemoryPlan(Budget.of(cfg.memory.memory_budget_mb), shape, role=role)


def server_fit(
    budget: Budget, num_rows: int, dim: int, state_dim: int, store: str, request_rows: int
) -> tuple[DiskIO, Estimate]:
    """An embedding server's disk I/O bounds for its ``budget`` and its estimate; raises
    :class:`BudgetError` when even the smallest bounds do not fit."""
    from bagpipe.budget.estimate import MIB
    from bagpipe.budget.sizing import io_for, need_mib

    io = io_for(budget)
    est = estimate_server(num_rows, dim, state_dim, store, io, request_rows)
    usable = budget.usable
    if usable is not None and est.total > usable:
        big = sorted(est.parts, key=lambda p: -p.bytes)[:3]
        raise BudgetError(
            f"embedding server: memory budget {budget.mib:,.0f} MiB ({budget.source}) is too small: its shard of "
            f"{num_rows:,} rows needs {est.mib:,.0f} MiB (" + ", ".join(f"{p.name} {p.mib:,.0f}" for p in big) + "); "
            f"the smallest budget that works is {need_mib(est.total):,} MiB: raise "
            "--server-memory-budget-mb, use more servers, or use --store disk"
        )
    if store == "disk" and usable is not None and not budget.enforced:
        import dataclasses

        left = usable - est.total + est.part("store page cache")
        io = dataclasses.replace(io, page_cache_bytes=max(16 * MIB, left))
    return io, est
