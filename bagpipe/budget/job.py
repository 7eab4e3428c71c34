"""A local job's roles budgeted together.

``bagpipe train --trainers N --servers S`` starts every role on this machine, in the
memory cgroup the launcher runs in: the launcher, N trainers, S embedding servers and
the oracle share that one limit. Each role is sized to its own budget (its estimate,
:mod:`bagpipe.budget.estimate`); :func:`check_job` then holds the sum of the roles'
estimates, the launcher's own included, against the budget they share, and refuses in
one line naming each role's share. That budget (:func:`shared_budget`) is the cgroup's
limit, or an explicit ``--memory-budget-mb M`` where M is smaller: on a local job M is
what the whole job may use (each trainer is still sized to M alone; the roles together
are held to it). A role started by hand or by torchrun is not a local job: there M is
that process's own. ``bagpipe plan --trainers N --servers S`` makes the same check
(:func:`bagpipe.train.preflight.memory_checks`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from bagpipe.budget.estimate import MIB, Estimate, Part
from bagpipe.budget.sizing import MARGIN, Budget, BudgetError, need_mib

log = logging.getLogger(__name__)

#: The local launcher's own memory: Python, torch and bagpipe loaded, the pre-flight's
#: throwaway model and sampled batches, the threads pumping the roles' output. Measured
#: with torch 2.13 (CPU) on Linux x86-64: a peak RSS of 244 MiB for a 1 + 1 job on the tiny
#: synthetic data set (docs/beyond-memory.md#a-local-jobs-roles-share-one-budget).
BASE_LAUNCHER = 245 * MIB


@dataclass(frozen=True)
class RoleShare:
    """One kind of role of a job: its name, how many of it, one's estimate."""

    name: str
    count: int
    estimate: Estimate

    @property
    def total(self) -> int:
        return self.count * self.estimate.total


def server_request_rows(batch_size: int, servers: int) -> int:
    """Rows one request of a trainer carries to an embedding server at most: ~32 lookups a
    sample (what :meth:`bagpipe.distributed.roles.ServerConfig.of` gives each server)."""
    return max(1, batch_size * 32 // servers)


def launcher_estimate() -> Estimate:
    """The local launcher's estimate (a constant: it holds no rows)."""
    return Estimate("launcher", (Part("interpreter and torch", BASE_LAUNCHER, "measured constant"),))


def job_total(roles: tuple[RoleShare, ...]) -> int:
    """Bytes of every role of a local job together, the launcher's included."""
    return launcher_estimate().total + sum(r.total for r in roles)


def shared_budget(mb: float | None = None) -> Budget:
    """The budget every role of a local job shares: the launcher's memory cgroup's limit,
    or ``mb`` MiB (an explicit ``--memory-budget-mb``) where that is smaller; ``mb`` None
    or 0 (no budget): the cgroup's limit alone. The rule of a one-process run's budget too
    (:meth:`Budget.of`)."""
    return Budget.of(mb) if mb else Budget.of(None)


def job_overflow(roles: tuple[RoleShare, ...], budget: Budget) -> str:
    """The warning of a job with no budget (``--memory-budget-mb 0``) whose roles together
    may not fit the limit of the cgroup they share (``budget``)."""
    return (
        f"no budget (--memory-budget-mb 0), but the roles of this local job may not fit "
        f"{budget.source}, {budget.mib:,.0f} MiB: they are estimated at {job_total(roles) / MIB:,.0f} MiB "
        f"together (the smallest limit that holds them is {need_mib(job_total(roles)):,} MiB); the kernel may "
        "kill a role"
    )


def smallest_job_budget(total: int, budget: Budget, at: Callable[[Budget], tuple[RoleShare, ...] | None]) -> int:
    """The smallest budget in MiB (of ``budget``'s kind) that holds the job, each role sized
    at it as it would be (``at``: the roles at a budget, None where a role alone does not
    fit): a role's estimate grows with its budget (the disk I/O bounds, the default cache
    given back), so the sum at the refused budget named one that was refused in turn
    (newcomer round 21: 1,436, then 1,489, then 1,490 MiB)."""
    mib = need_mib(total)
    for _ in range(16):
        trial = dataclasses.replace(budget, bytes=mib * MIB, note=None)
        roles = at(trial)
        need = None if roles is None else job_total(roles)
        if need is not None and trial.usable is not None and need <= trial.usable:
            return mib
        mib = max(mib + 1, need_mib(need) if need is not None else math.ceil(mib * 1.02))
    return mib


def check_job(
    roles: tuple[RoleShare, ...],
    budget: Budget,
    *,
    off: bool = False,
    at: Callable[[Budget], tuple[RoleShare, ...] | None] | None = None,
) -> None:
    """Refuse, in one line naming each role's share, a local job whose roles together
    (the launcher's own memory included) do not fit the ``budget`` they share
    (:func:`shared_budget`: the memory cgroup's limit or an explicit
    ``--memory-budget-mb``, whichever is smaller). ``off`` (``--memory-budget-mb 0``: the
    user turned budgets off): never refuse, but warn in one line that the roles may not
    fit the cgroup's limit. ``at``: the roles sized at another budget, for the smallest
    budget the refusal names (:func:`smallest_job_budget`; without it, the sum here)."""
    usable = budget.usable
    total = job_total(roles)
    if usable is None or total <= usable:
        return
    if off:
        log.warning(job_overflow(roles, budget))
        return
    named = need_mib(total) if at is None else smallest_job_budget(total, budget, at)
    shares = [f"launcher {launcher_estimate().mib:,.0f}"] + [
        f"{r.name} {r.estimate.mib:,.0f}" + (f" x {r.count}" if r.count > 1 else "") for r in roles
    ]
    raise BudgetError(
        f"memory budget {budget.mib:,.0f} MiB ({budget.source}) is shared by every role of this local job and "
        f"does not hold them: {' + '.join(shares)} = {total / MIB:,.0f} MiB, so the smallest budget that works is "
        f"{named:,} MiB ({MARGIN:.0%} kept free, each role sized to it); {budget.more()}, use fewer trainers or servers, "
        "or start the roles on machines of their own (torchrun and `bagpipe worker`, docs/distributed.md)"
    )
