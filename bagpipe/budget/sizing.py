"""A run's memory budget, and the sizes that fit it.

The budget (:class:`Budget`) is ``--memory-budget-mb`` when given, else the limit of the
memory cgroup the process runs in (:mod:`bagpipe.budget.cgroup`), else none. A run is
sized to fit the budget less :data:`MARGIN` (:func:`fit`):

1. the disk store's I/O bounds scale with it (pages in flight and dirty pages: 1/32 of
   the budget each, within [4, 64] and [8, 32] MiB; a digest's chunk 1/64 of it), and
   where no cgroup enforces the budget the store also bounds its own page cache to what
   the rest leaves;
2. what the user set is kept (``--cache-rows``, ``--cache-budget-mb``, ``--lookahead``,
   ``--hot-budget-mb``, ``--hot-rows``), what is a default gives way, in this order:
   plans read ahead (down to 2, then 1), the I/O bounds (down to their smallest), the
   default hot tier of fae and hotline (down to none), the default cache of 5% of the
   rows (down to one batch's lookups);
3. if even the smallest working configuration (a cache of one batch, one plan read
   ahead, no default hot tier, the smallest I/O bounds) does not fit, the run stops
   before it starts with one line: its estimate and the smallest budget that works;
   if what the user set does not fit, the line names the setting and the most it may be.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import bagpipe.budget.cgroup as _cgroup
from bagpipe.budget.cgroup import own_limit
from bagpipe.budget.estimate import MIB, Estimate, RunShape, Sizes, estimate
from bagpipe.errors import ConfigError
from bagpipe.store.diskio import DiskIO

#: Share of the budget kept free: the estimate's error, the allocator's slack, the
#: kernel's page-cache reclaim running behind. Measured, not guessed: the peak of a run in a
#: fresh cgroup against its estimate (docs/beyond-memory.md#the-smallest-budget-that-works):
#: ``--mode full`` 236 MiB for 226 on the tiny data, 277 for 251 on a Criteo-Kaggle profile
#: at 0.004 (26 tables), 428-433 for 384 in issue 32's report: up to 12.8% over the
#: estimate, so 10% kept free named budgets the run was OOM-killed in. With 15% the
#: smallest budget named (estimate / 0.85) holds the largest error seen and ~2% more.
MARGIN = 0.15


class BudgetError(ConfigError):
    """The run does not fit its memory budget (one line: the estimate and what to do);
    ``estimate``: the smallest configuration's, part by part (``bagpipe plan`` prints it)."""

    def __init__(self, message: str, estimate: Estimate | None = None):
        super().__init__(message)
        self.estimate = estimate


@dataclass(frozen=True)
class Budget:
    """Bytes a process may use, page cache included (None: no budget), and where that came from."""

    bytes: int | None
    source: str
    enforced: bool = False
    """Whether a cgroup limit enforces it (then the kernel bounds the page cache)."""
    machine_bytes: int | None = field(default=None, compare=False)
    """With no budget: this machine's memory in bytes, which the run is still held to
    (:func:`fit`); None: not known (or not asked, as a test's budget). Plain fields (not a
    tuple): a Budget travels from the oracle to the trainers inside the cache's plan."""
    machine_source: str = field(default="", compare=False)
    """Where :attr:`machine_bytes` was read."""

    @property
    def machine(self) -> tuple[int, str] | None:
        """(machine_bytes, machine_source), or None when the machine's memory is not known."""
        return None if self.machine_bytes is None else (self.machine_bytes, self.machine_source)

    note: str | None = field(default=None, compare=False)
    """A warning for the run to say once (an option above the cgroup's limit)."""

    @classmethod
    def of(cls, mb: float | None, option: str = "--memory-budget-mb") -> Budget:
        """``mb`` MiB from ``option``, or the cgroup's limit where that is smaller (the
        kernel holds the process to it: the rule of a local job's shared budget too,
        :func:`bagpipe.budget.job.shared_budget`); None: this process's cgroup limit; 0: no
        budget. With no budget the machine's memory is recorded (:attr:`machine`)."""
        limit, where = own_limit()
        cgroup = f"the memory cgroup's limit ({where})"
        if mb is None:
            if limit is None:  # why there is none: "cgroup v1 /x has no limit", "no memory cgroup"
                return cls(None, where, *_machine())
            return cls(limit, cgroup, enforced=True)
        if mb == 0:
            return cls(None, f"{option} 0", *_machine())
        b = int(mb * MIB)
        if limit is not None and limit <= b:  # the cgroup's where equal: the kernel enforces it
            note = None
            if limit < b:
                who = "each embedding server is" if option == "--server-memory-budget-mb" else "the run is"
                note = (
                    f"{option} {mb:g} is more than the memory cgroup's limit, {limit / MIB:,.0f} MiB ({where}): "
                    f"{who} sized to the cgroup's limit"
                )
            return cls(limit, cgroup, enforced=True, note=note)
        return cls(b, f"{option} {mb:g}")

    def more(self, mib: int | None = None) -> str:
        """What gives the run more memory (``mib``: at least that many MiB): the option the
        budget came from, the memory cgroup's limit, or another machine."""
        if self.source.startswith("--"):
            return f"raise {self.source.split(' ', 1)[0]}" + (f" to at least {mib:,}" if mib is not None else "")
        at = f" to at least {mib:,} MiB" if mib is not None else ""
        if self.source.startswith(MACHINE):
            return "run on a machine with more memory" + (f" (at least {mib:,} MiB)" if mib is not None else "")
        return f"raise the memory cgroup's limit{at}"

    @property
    def mib(self) -> float | None:
        return None if self.bytes is None else self.bytes / MIB

    @property
    def usable(self) -> int | None:
        """What the run may plan for: the budget less the margin."""
        return None if self.bytes is None else int(self.bytes * (1 - MARGIN))


#: How the budget of a run with none but the machine's memory is named.
MACHINE = "the machine's memory"


def _machine() -> tuple[bool, int | None, str]:
    """(enforced, machine_bytes, machine_source) of a budget with none but the machine's memory."""
    total, where = _cgroup.machine_memory()
    return False, total, (where if total is not None else "")


@dataclass(frozen=True)
class Wanted:
    """The sizes a run would use without a budget, and which of them the user set."""

    sizes: Sizes
    cache_fixed: bool
    hot_fixed: bool
    minimum_cache: int
    """The smallest cache that can run (one batch's lookups)."""


@dataclass(frozen=True)
class Fit:
    """The sizes chosen for a budget, their estimate, and what the budget changed."""

    budget: Budget
    sizes: Sizes
    estimate: Estimate
    changes: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        u = self.budget.usable
        return u is None or self.estimate.total <= u

    def line(self) -> str:
        """``memory budget M MiB (source): estimate E MiB; changes``."""
        if self.budget.bytes is None:
            return f"memory: estimate {self.estimate.mib:,.0f} MiB, no budget ({self.budget.source})"
        head = (
            f"memory budget {self.budget.mib:,.0f} MiB ({self.budget.source}): estimate "
            f"{self.estimate.mib:,.0f} MiB with a {MARGIN:.0%} margin kept free"
        )
        return head + ("; " + "; ".join(self.changes) if self.changes else "")

    def as_dict(self) -> dict:
        return {
            "budget_mb": self.budget.mib,
            "budget_source": self.budget.source,
            "margin": MARGIN,
            "fits": self.fits,
            "changes": list(self.changes),
            "sizes": self.sizes.as_dict(),
            "estimate": self.estimate.as_dict(),
        }


def io_for(budget: Budget, threads: int = DiskIO.threads) -> DiskIO:
    """The disk store's I/O bounds for a budget. Without one the dirty pages are left to the
    kernel (no write-behind: nothing asks for the rows to reach the device before ``flush``)."""
    if budget.bytes is None:
        return DiskIO(threads=threads, dirty_bytes=None)
    u = budget.usable or 0
    return DiskIO(
        threads=threads,
        hint_bytes=int(min(64 * MIB, max(4 * MIB, u // 32))),
        dirty_bytes=int(min(32 * MIB, max(8 * MIB, u // 32))),
    )


def need_mib(total: int) -> int:
    """The smallest whole budget in MiB whose usable part holds ``total`` bytes."""
    return math.ceil(total / (1 - MARGIN) / MIB)


def smallest_io(io: DiskIO) -> DiskIO:
    """The smallest I/O bounds a run is given: 4 MiB of pages in flight, 8 MiB of dirty
    pages, chunks of 4,096 rows."""
    return dataclasses.replace(io, hint_bytes=4 * MIB, dirty_bytes=8 * MIB, chunk_rows=1 << 12)


def _smallest(shape: RunShape, wanted: Wanted, io: DiskIO) -> Sizes:
    s = wanted.sizes
    return dataclasses.replace(
        s,
        cache_rows=s.cache_rows if wanted.cache_fixed else min(s.cache_rows, wanted.minimum_cache),
        hot_rows=s.hot_rows if wanted.hot_fixed else 0,
        staged=min(s.staged, 1),
        io=smallest_io(io),
    )


def _most(shape: RunShape, sizes: Sizes, usable: int, field: str, role: str = "trainer") -> int:
    """The most rows of ``field`` (``cache_rows``, ``hot_rows``) at which the whole estimate,
    every other part at that size too, fits ``usable``; 0 when none does. By bisection:
    the parts that grow with the cache (the oracle's retained slots, the staging) made the
    rest-of-the-estimate answer depend on the size asked for (newcomer round 21: "at most"
    0 to 835,425 rows for one budget, where 800,000 fit)."""

    def fits(n: int) -> bool:
        at = (
            dataclasses.replace(sizes, cache_rows=n)
            if field == "cache_rows"
            else dataclasses.replace(sizes, hot_rows=n)
        )
        return estimate(shape, at, role).total <= usable

    lo, hi = 0, getattr(sizes, field)
    if fits(hi):
        return hi
    while lo < hi:  # fits(lo) or lo == 0; not fits(hi + 1)
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo if fits(lo) else 0


def fit(budget: Budget, shape: RunShape, wanted: Wanted, role: str = "trainer") -> Fit:
    """The sizes of ``wanted`` made to fit ``budget`` (see the module); raises BudgetError."""
    io = io_for(budget, wanted.sizes.io.threads)
    if budget.usable is not None:  # a digest's or checkpoint's chunk: 1/64 of the budget, 4Ki..64Ki rows
        io = dataclasses.replace(io, chunk_rows=int(min(1 << 16, max(1 << 12, budget.usable // 64 // shape.row_bytes))))
    sizes = dataclasses.replace(wanted.sizes, io=io)
    usable = budget.usable
    if usable is None:
        est = estimate(shape, sizes, role)
        if budget.machine is None or est.total <= int(budget.machine[0] * (1 - MARGIN)):
            return Fit(budget, sizes, est)
        return _on_the_machine(budget, shape, wanted, role, sizes, est)
    smallest = _smallest(shape, wanted, io)
    low = estimate(shape, smallest, role)
    if low.total > usable:
        floor = dataclasses.replace(smallest, cache_rows=min(smallest.cache_rows, wanted.minimum_cache), hot_rows=0)
        if estimate(shape, floor, role).total <= usable:  # what the user set is what does not fit
            what, fixes = [], []
            if smallest.cache_rows > floor.cache_rows:
                what.append(f"the cache of {smallest.cache_rows:,} rows")
                most = _most(shape, dataclasses.replace(smallest, hot_rows=0), usable, "cache_rows", role)
                fixes.append(f"lower --cache-rows / --cache-budget-mb to at most {most:,} rows")
            if smallest.hot_rows:
                what.append(f"the hot tier of {smallest.hot_rows:,} rows")
                fixes.append("lower --hot-budget-mb (or use a smaller --hot-rows file)")
            raise BudgetError(
                f"memory budget {budget.mib:,.0f} MiB ({budget.source}) does not hold {' and '.join(what)} "
                f"(the run needs {low.mib:,.0f} MiB with them, {MARGIN:.0%} kept free): {', or '.join(fixes)}, "
                f"or {budget.more(need_mib(low.total))}",
                low,
            )
        big = sorted(low.parts, key=lambda p: -p.bytes)[:3]
        raise BudgetError(
            f"memory budget {budget.mib:,.0f} MiB ({budget.source}) is too small for this run: even its smallest "
            f"configuration needs {low.mib:,.0f} MiB ("
            + ", ".join(f"{p.name} {p.mib:,.0f}" for p in big)
            + f"), so the smallest budget that works is {need_mib(low.total):,} MiB ({MARGIN:.0%} kept free); "
            + (
                f"{budget.more()} or run where more memory is given"
                if budget.source.startswith("--")
                else budget.more()
            ),
            low,
        )
    changes: list[str] = []
    if estimate(shape, sizes, role).total > usable and sizes.staged > 2:
        staged = sizes.staged
        while staged > 2 and estimate(shape, dataclasses.replace(sizes, staged=staged), role).total > usable:
            staged = max(2, staged // 2)
        sizes = dataclasses.replace(sizes, staged=staged)
    if estimate(shape, sizes, role).total > usable and sizes.staged > 1:
        sizes = dataclasses.replace(sizes, staged=1)
    if sizes.staged != wanted.sizes.staged:  # said once, with the number the run uses
        changes.append(f"{plans(sizes.staged)} read ahead instead of {wanted.sizes.staged}")
    if estimate(shape, sizes, role).total > usable and sizes.io != smallest_io(sizes.io):
        sizes = dataclasses.replace(sizes, io=smallest_io(sizes.io))
        changes.append("the smallest I/O bounds (4 MiB of pages in flight, 8 MiB of dirty pages)")
    if estimate(shape, sizes, role).total > usable and sizes.hot_rows and not wanted.hot_fixed:
        h = _most(shape, sizes, usable, "hot_rows", role)
        changes.append(f"a hot tier of {h:,} rows instead of {sizes.hot_rows:,}")
        sizes = dataclasses.replace(sizes, hot_rows=h)
    if estimate(shape, sizes, role).total > usable and not wanted.cache_fixed:
        c = max(wanted.minimum_cache, _most(shape, sizes, usable, "cache_rows", role))
        changes.append(f"a cache of {c:,} rows instead of {sizes.cache_rows:,}")
        sizes = dataclasses.replace(sizes, cache_rows=c)
    est = estimate(shape, sizes, role)
    if est.total > usable:  # what the user set does not fit; the smallest configuration does
        if wanted.cache_fixed:
            c = _most(shape, dataclasses.replace(sizes, io=smallest_io(sizes.io), staged=1), usable, "cache_rows", role)
            raise BudgetError(
                f"memory budget {budget.mib:,.0f} MiB ({budget.source}) does not hold this run's cache of "
                f"{sizes.cache_rows:,} rows (the run needs {est.mib:,.0f} MiB, {MARGIN:.0%} kept free): "
                f"lower --cache-rows / --cache-budget-mb to at most {c:,} rows or {budget.more(need_mib(est.total))}",
                est,
            )
        raise BudgetError(
            f"memory budget {budget.mib:,.0f} MiB ({budget.source}) does not hold this run's hot tier of "
            f"{sizes.hot_rows:,} rows (the run needs {est.mib:,.0f} MiB, {MARGIN:.0%} kept free): lower "
            f"--hot-budget-mb or {budget.more(need_mib(est.total))}",
            est,
        )
    if shape.store == "disk" and not budget.enforced:
        # no cgroup bounds the page cache: the store bounds its own to what the rest leaves
        left = usable - est.total + est.part("store page cache")
        sizes = dataclasses.replace(sizes, io=dataclasses.replace(sizes.io, page_cache_bytes=max(16 * MIB, left)))
        est = estimate(shape, sizes, role)
    return Fit(budget, sizes, est, tuple(changes))


def plans(n: int) -> str:
    """``1 plan``, ``N plans``."""
    return f"{n:,} plan" + ("" if n == 1 else "s")


def _on_the_machine(budget: Budget, shape: RunShape, wanted: Wanted, role: str, sizes: Sizes, est: Estimate) -> Fit:
    """A run with no budget whose estimate ``est`` leaves less than the margin of the
    machine's memory free: with no budget at all its defaults are sized to the machine's
    memory as to a budget (what the user set is kept); with budgets off
    (``--memory-budget-mb 0``) nothing is sized. Either way a run whose estimate (the
    smallest one sizing found) exceeds the machine's memory is refused in one line
    (:func:`past_the_machine`), before anything large is allocated."""
    assert budget.machine is not None
    total, where = budget.machine
    if _off(budget):  # budgets off: nothing is sized
        if est.total > total:
            raise BudgetError(past_the_machine(budget, shape, est, fixed=wanted.cache_fixed), est)
        return Fit(budget, sizes, est)
    as_budget = Budget(total, f"{MACHINE}, {where}: no budget ({budget.source})")
    try:
        return fit(as_budget, shape, wanted, role)
    except BudgetError as e:
        if est.total <= total:  # it fits the machine, not with the margin kept free: as without a budget
            return Fit(budget, sizes, est)
        low = e.estimate or est
        raise BudgetError(past_the_machine(budget, shape, low, fixed=wanted.cache_fixed, sized=True), low) from None


def _off(budget: Budget) -> bool:
    """Whether the user turned budgets off (``--memory-budget-mb 0``)."""
    return budget.bytes is None and budget.source.endswith(" 0")


def past_the_machine(
    budget: Budget, shape: RunShape, est: Estimate, *, fixed: bool = False, sized: bool = False
) -> str:
    """The one line of a run with no budget that does not fit the machine's memory: its
    estimate, its largest parts, the machine's memory and what to do. ``sized``: ``est``
    is the smallest configuration's (the defaults were sized to the machine)."""
    assert budget.machine is not None
    total, where = budget.machine
    big = sorted(est.parts, key=lambda p: -p.bytes)[:3]
    todo = []
    if not shape.spec.store or shape.store != "disk":
        todo.append("--mode lookahead --store disk (the tables on disk)")
    if fixed:
        todo.append("a smaller --cache-rows / --cache-budget-mb")
    if _off(budget) and shape.spec.store:
        todo.append("a memory budget so that the defaults are sized (leave out --memory-budget-mb 0)")
    todo.append(f"a machine with at least {need_mib(est.total):,} MiB")
    what = "even its smallest configuration needs" if sized else "it needs"
    return (
        f"no memory budget ({budget.source}), and this run does not fit this machine's memory, "
        f"{total / MIB:,.0f} MiB ({where}): {what} {est.mib:,.0f} MiB ("
        + ", ".join(f"{p.name} {p.mib:,.0f}" for p in big)
        + "); use "
        + ", or ".join(todo)
    )


def full_tables_fit(budget: Budget, shape: RunShape) -> Fit:
    """The estimate of ``--mode full`` (every table in the process: nothing to size) against
    its budget, or with no budget against the machine's memory; raises BudgetError when it
    does not fit."""
    sizes = Sizes(cache_rows=0, hot_rows=0, lookahead=0, staged=0, io=DiskIO())
    est = estimate(shape, sizes)
    if budget.bytes is None and budget.machine is not None and est.total > budget.machine[0]:
        raise BudgetError(past_the_machine(budget, shape, est), est)
    usable = budget.usable
    if usable is not None and est.total > usable:
        raise BudgetError(
            f"memory budget {budget.mib:,.0f} MiB ({budget.source}) is too small for --mode full: its tables alone "
            f"take {est.part('store') / MIB:,.0f} MiB and the run {est.mib:,.0f} MiB, so the smallest budget that works "
            f"is {need_mib(est.total):,} MiB; {budget.more()}, or keep the tables in a store "
            "(--mode lookahead --store disk)",
            est,
        )
    return Fit(budget, sizes, est)
