"""A run's cache, decided in one place for every topology.

:func:`set_up_cache` sizes the cache (C and L, by the auto-tuner when given a budget),
picks the hot tier, and returns a :class:`CacheSetup`: the planner's side (whose
:class:`LocalPlans` make the run's plans) and the :class:`CachePlan`, everything a
trainer's cache is built from (:func:`bagpipe.train.backends.cached_backend`). A
one-process run (:class:`bagpipe.train.topology.SingleProcess`) and the oracle role of a
distributed job (:mod:`bagpipe.distributed.oracle_role`, which sends the plan to every
trainer as a record of :mod:`bagpipe.distributed.codec`) both call it, so a run's cache
is the same wherever its planner runs. Given the run's memory plan it also fits the
cache, the plans read ahead, a default hot tier and the disk store's I/O bounds to the
run's memory budget (:mod:`bagpipe.budget`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from bagpipe.accel.hot import HotSplit, hot_set_for
from bagpipe.accel.profile import HotSet
from bagpipe.budget import MemoryPlan
from bagpipe.budget.estimate import MIB, Sizes, estimate
from bagpipe.budget.shape import with_traffic
from bagpipe.budget.sizing import Fit, Wanted, fit
from bagpipe.config.modes import ModeSpec
from bagpipe.config.sections import CacheConfig, HotConfig
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.oracle.plan import Plan
from bagpipe.oracle.planners import Planner, build_planner
from bagpipe.oracle.sizing import CacheSize, lookups_per_batch, size_cache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachePlan:
    """What a trainer's cache is: all a cached backend is built from, whichever process
    planned it (:func:`bagpipe.train.backends.cached_backend`).

    The oracle role of a distributed job sends it to every trainer as it is (a record of
    :mod:`bagpipe.distributed.codec`: every field travels, checked against its
    annotation), so a field added here reaches the trainers with no other change.

    Attributes:
        cache_rows: C, the cache's slots for the planned (cold) rows.
        lookahead: L, the planner's window as sized (used by a planner that looks ahead).
        staged: plans whose rows are fetched ahead of the step (the pipelined executor's
            depth), as the memory budget chose; None: the executor's own default (L + 1).
        hot: the hot rows (slots C..C+H-1 of the cache, for the whole run), or None.
        autotune: the auto-tuner's choice of C and L
            (:meth:`bagpipe.oracle.autotune.AutotuneChoice.as_dict`, the summary's
            ``cache.autotune``), or None when it did not choose.
        fit: the sizes chosen for the trainer's memory budget and their estimate
            (:mod:`bagpipe.budget.sizing`, the summary's ``memory``), or None when the
            run was not sized.
    """

    cache_rows: int
    lookahead: int
    staged: int | None = None
    hot: HotSet | None = None
    autotune: dict | None = None
    fit: Fit | None = None


@dataclass(frozen=True)
class CacheSetup:
    """What a run's cache is: its mode and planner, and the :class:`CachePlan` its trainers build.

    Attributes:
        spec: the mode's row of the table of modes (its planner).
        num_rows: R, rows of all tables.
        plan: C, L, the plans staged, the hot tier, the auto-tuner's choice and the
            memory budget's fit.
        enough: a cache size that holds every batch of the run (the hint of a too-small
            cache's error).
        fae_schedule: ``keep`` the data order, or ``split`` it as FAE does.
        retain: the lookahead oracle keeps a row past its window until its slot is needed
            (one trainer); a data-parallel job's oracle writes it back after its window,
            since a row that stays cached on N trainers is synchronised after every update.
    """

    spec: ModeSpec
    num_rows: int
    plan: CachePlan
    enough: int
    fae_schedule: str = "keep"
    retain: bool = False

    @property
    def lookahead(self) -> int | None:
        """L, for a planner that looks ahead (else None)."""
        return self.plan.lookahead if self.spec.looks_ahead else None

    def planner(self) -> Planner:
        """A new planner of the mode's kind for C slots."""
        assert self.spec.planner is not None, f"--mode {self.spec.name} has no planner"
        return build_planner(
            self.spec.planner, self.num_rows, self.plan.cache_rows, self.plan.lookahead, self.enough, retain=self.retain
        )


def _setup(
    spec: ModeSpec,
    num_rows: int,
    size: CacheSize,
    hot: HotSet | None,
    enough: int,
    fae_schedule: str,
    chosen: Fit | None,
    retain: bool,
) -> CacheSetup:
    plan = CachePlan(
        cache_rows=size.rows,
        lookahead=size.lookahead,
        staged=chosen.sizes.staged if chosen is not None and spec.pipelined else None,
        hot=hot,
        autotune=size.tuned.as_dict() if size.tuned is not None else None,
        fit=chosen,
    )
    return CacheSetup(spec, num_rows, plan, enough, fae_schedule, retain)


def set_up_cache(
    spec: ModeSpec,
    cache: CacheConfig,
    hot: HotConfig,
    *,
    dataset: Dataset,
    stream: BatchStream,
    steps: int,
    dim: int,
    state_dim: int,
    seed: int,
    memory: MemoryPlan | None = None,
    retain: bool = False,
) -> CacheSetup:
    """The cache of a run of ``spec`` (a mode with a store) over ``dataset``'s train ``stream``
    for ``steps`` steps, rows of D = ``dim`` with S = ``state_dim`` optimizer values.

    With a ``memory`` plan (the budget and the run's shape), the sizes the user left to
    their defaults are fitted to the budget (:func:`bagpipe.budget.sizing.fit`: the plans
    read ahead, a mode's default hot tier, the default cache; the disk store's I/O
    bounds), and a run that cannot fit raises :class:`~bagpipe.budget.sizing.BudgetError`.
    ``retain``: see :class:`CacheSetup` (True for a job of one trainer)."""
    num_rows = dataset.meta.total_rows
    lookups = lookups_per_batch(dataset.meta, stream, steps)
    size = size_cache(
        spec,
        cache,
        total_rows=num_rows,
        dim=dim,
        state_dim=state_dim,
        stream=stream,
        steps=steps,
        lookups=lookups,
        retain=retain,
    )
    if size.tuned is not None:
        log.info(size.tuned.line())
    if memory is None:
        rows = hot_set_for(hot, spec, dataset, dim, state_dim, seed)
        return _setup(spec, num_rows, size, rows, min(lookups, num_rows), hot.fae_schedule, None, retain)
    # a hot tier the user asked for is chosen first (its size is then known); a mode's
    # default one is sized by the budget below
    rows = hot_set_for(hot, spec, dataset, dim, state_dim, seed) if hot.on else None
    row_bytes = 4 * (dim + state_dim)
    hot_rows = len(rows) if rows is not None else int(spec.hot_budget_mb * MIB // row_bytes)
    wanted = Wanted(
        Sizes(
            cache_rows=size.rows,
            hot_rows=hot_rows,
            lookahead=size.lookahead if spec.looks_ahead else 0,
            staged=(size.lookahead + 1) if spec.pipelined else 0,
            io=memory.io,
        ),
        cache_fixed=spec.sized_cache and (cache.cache_rows > 0 or cache.cache_budget_mb > 0),
        hot_fixed=hot.on,
        minimum_cache=min(lookups, num_rows) if spec.sized_cache else size.rows,
    )
    shape = with_traffic(memory.shape, stream, size.rows + hot_rows, size.lookahead, steps)
    chosen = fit(memory.budget, shape, wanted, memory.role)
    if chosen.sizes.cache_rows != size.rows:  # a smaller cache misses more: estimate it with its own traffic
        rows_ = chosen.sizes.cache_rows + chosen.sizes.hot_rows
        shape = with_traffic(memory.shape, stream, rows_, size.lookahead, steps)
        chosen = dataclasses.replace(chosen, estimate=estimate(shape, chosen.sizes, memory.role))
    log.info(chosen.line())
    if chosen.sizes.cache_rows != size.rows:
        size = dataclasses.replace(size, rows=chosen.sizes.cache_rows)
    if not hot.on and chosen.sizes.hot_rows:  # the mode's default hot tier, as large as the budget let it be
        fitted = hot
        if chosen.sizes.hot_rows < hot_rows:
            fitted = dataclasses.replace(hot, hot_budget_mb=chosen.sizes.hot_rows * row_bytes / MIB)
        rows = hot_set_for(fitted, spec, dataset, dim, state_dim, seed)
    return _setup(spec, num_rows, size, rows, min(lookups, num_rows), hot.fae_schedule, chosen, retain)


class LocalPlans:
    """A :class:`~bagpipe.train.protocols.PlanSource` whose planner runs in this process:
    a new planner of the set-up's kind, behind a :class:`HotSplit` when a hot tier serves
    the hot rows."""

    def __init__(self, setup: CacheSetup):
        self.setup = setup
        self.lookahead = setup.lookahead
        self.planner: Planner | None = None
        hot, cache_rows = setup.plan.hot, setup.plan.cache_rows
        self.split = HotSplit(hot, cache_rows, setup.fae_schedule) if hot is not None else None

    def plans(self, stream: BatchStream, start: int, stop: int) -> Iterator[Plan]:
        """The plans of steps [start, stop) of ``stream``."""
        self.planner = planner = self.setup.planner()
        if self.split is not None:
            return self.split.plans(planner, stream, start, stop)
        return planner.plans(stream.numbered(start, stop))

    def stats(self) -> dict:
        """The planner's counters (``PlanStats``), and the hot tier's under ``hot``."""
        out = self.planner.stats.as_dict() if self.planner is not None else {}
        return out | ({"hot": self.split.report()} if self.split is not None else {})
