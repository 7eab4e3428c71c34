"""Before a run changes anything: the checks the loop and the launcher share.

:func:`preflight` is what a run checks before its folder changes and before a row is
trained: the data set opens (its files checked); a resumed run continues what its folder
holds (nothing to resume, a finished run, a changed setting: one line), a new run does
not overwrite another's; the run's checkpoints fit on their disk. It also measures the
run's shape once (:func:`bagpipe.budget.shape.run_shape`, a throwaway model and a few
batches): the checkpoint estimate, the device estimate and the memory plan all read it.

The loop calls it on every trainer (trainer 0 checks; the others take the checkpoint
trainer 0 checked); the local launcher calls it once before any role starts, so that a
refusal is said in one line by the launcher rather than by a role.

:func:`memory_checks` is every memory refusal a run makes before it trains, in one place:
``bagpipe plan``, a one-process run's pre-flight and the local launcher all call it, so
`plan` refuses what `train` refuses, in the same words: the trainer's budget (its cache
set up and fitted as the run sets it up), a cache below a batch's unique rows, each
embedding server's budget, and a local job's roles together against the one memory
cgroup they share (:mod:`bagpipe.budget.job`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from bagpipe.budget import MemoryPlan
from bagpipe.budget.estimate import RunShape
from bagpipe.budget.job import RoleShare
from bagpipe.budget.shape import counted, run_shape, without_count
from bagpipe.budget.sizing import Budget, BudgetError, Fit
from bagpipe.cache.setup import CacheSetup
from bagpipe.checkpoint import Checkpoint, CheckpointFolder
from bagpipe.config.train import TrainConfig
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream, train_stream
from bagpipe.errors import ConfigError
from bagpipe.train.resume import elastic_restart, refuse_overwrite, resume_point
from bagpipe.train.rundir import RunDir
from bagpipe.train.space import check_checkpoint_space, check_store_space

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Preflight:
    """What the checks found, for the run to use rather than find again."""

    dataset: Dataset
    stream: BatchStream
    """The run's train stream."""
    shape: RunShape
    """The run's shape, measured once (a data-parallel trainer's: its share of the batch)."""
    share: int | None
    """A data-parallel trainer's share of the batch; None: the whole batch."""
    ckpt: Checkpoint | None
    """The checkpoint the run continues; None: it starts at step 0."""
    memory: MemoryCheck | None = None
    """A one-process run's memory checks (its cache set up and fitted to its budget);
    None: a role of a distributed job (the launcher or ``bagpipe plan`` checks the job)."""


@dataclass(frozen=True)
class MemoryCheck:
    """What :func:`memory_checks` found (every check passed)."""

    fit: Fit
    """The trainer's sizes for its budget and their estimate (a distributed job's: each trainer's)."""
    setup: CacheSetup | None
    """The cache as the run sets it up (None: ``--mode full``)."""
    roles: tuple[RoleShare, ...] = ()
    """A distributed job's roles (each trainer, each server, the oracle); () for one process."""
    shape: RunShape | None = None
    """The shape the checks fitted: the one given; its frequency layout's estimate from the
    rows the split was counted to use (a budget that did not hold the bound); or -- where a
    memory budget does not hold ``--store-layout auto``'s count of the split -- the same
    with the identity layout."""


def preflight(cfg: TrainConfig, run: RunDir, *, checks: bool = True) -> Preflight:
    """Check the run ``cfg`` in the folder ``run`` (claimed by the caller) before anything
    in it changes; raises a one-line error. ``checks=False``: a data-parallel trainer
    other than trainer 0, which only finds the checkpoint trainer 0 checked."""
    rc = cfg.run
    dataset = Dataset(cfg.data.data)
    # a role restarted by torchrun --max-restarts continues from the latest checkpoint, if any
    resuming = rc.resume or elastic_restart()
    if not checks:
        ckpt = CheckpointFolder(run.path).latest() if resuming else None
    elif resuming:
        ckpt = resume_point(run, cfg, dataset, required=rc.resume, complete_ok=elastic_restart())
    else:
        refuse_overwrite(run)
        ckpt = None
    stream = train_stream(dataset, cfg.data, rc.seed)
    share = stream.batch_size // cfg.dist.trainers if cfg.dist.distributed else None
    shape = run_shape(cfg, dataset, stream, share)
    memory = None
    if checks:
        est = check_checkpoint_space(cfg, dataset, shape)  # before anything is trained: refuse what could not be saved
        shape = store_space(cfg, shape, est)  # ... nor a disk store that could fill its disk (SIGBUS, not an error)
        if not cfg.dist.distributed:  # a job's roles are checked together by its launcher
            memory = memory_checks(cfg, dataset, stream, shape)
            shape = memory.shape or shape
    return Preflight(dataset=dataset, stream=stream, shape=shape, share=share, ckpt=ckpt, memory=memory)


def _auto_frequency(shape: RunShape) -> bool:
    """``--store-layout auto`` chose the frequency layout (which it may still give up)."""
    return shape.layout is not None and shape.layout.auto and shape.layout.name == "frequency"


def store_space(cfg: TrainConfig, shape: RunShape, checkpoints) -> RunShape:
    """:func:`~bagpipe.train.space.check_store_space` for ``shape``; where the disk does not
    hold ``--store-layout auto``'s frequency layout (its packed rows and row log) but holds
    the identity layout, the shape with the identity layout (said in the summary)."""
    try:
        check_store_space(cfg, shape, checkpoints)
        return shape
    except ConfigError:
        if not _auto_frequency(shape):
            raise
    plain = without_count(shape, "the disk does not hold the frequency layout's packed rows and row log")
    check_store_space(cfg, plain, checkpoints)
    return plain


def memory_checks(
    cfg: TrainConfig, dataset: Dataset, stream: BatchStream, shape: RunShape, *, together: bool = True
) -> MemoryCheck:
    """Every memory refusal of the run ``cfg`` before it trains (``shape``: as
    :func:`preflight` measures it); raises one line, the words the run itself would stop
    with. ``together``: a distributed job's roles share this process's memory cgroup (a
    local job), and their sum is held against its limit too. A frequency layout's count is
    first estimated with the rows used bounded by the split's lookups; where the budget does
    not hold that, the rows the split uses are counted (:func:`~bagpipe.budget.shape.counted`)
    and the checks run again on the count. ``--store-layout auto``'s frequency layout is then
    given up for the identity layout where the budget still does not hold its count, or holds
    it only with a smaller cache or read-ahead than without it."""
    if not _frequency_made_here(shape):
        return _memory_checks(cfg, dataset, stream, shape, together)
    packed, said, shape = _try_counted(cfg, dataset, stream, shape, together)
    assert shape.layout is not None
    auto = shape.layout.auto  # --store-layout frequency: refused only if even the count does not fit
    need = f"{shape.layout_bytes / 2**20:,.0f} MiB"
    if packed is None:
        if not auto:
            return _memory_checks(cfg, dataset, stream, shape, together)  # raises, saying its lines
        why = f"the memory budget does not hold the frequency layout's count of the split ({need})"
        return _memory_checks(cfg, dataset, stream, without_count(shape, why), together)
    kept = packed
    if auto and packed.fit.changes:  # the budget shrank something to hold the count: without it, does it?
        why = f"the memory budget would hold the frequency layout's count ({need}) only with a smaller cache or read-ahead"
        with held_logs() as plain_said:
            plain = _memory_checks(cfg, dataset, stream, without_count(shape, why), together)
        if plain.fit.sizes != packed.fit.sizes:
            kept, said = plain, plain_said
    for record in said:  # the lines of the checks kept, once
        logging.getLogger(record.name).handle(record)
    return kept


def _try_counted(
    cfg: TrainConfig, dataset: Dataset, stream: BatchStream, shape: RunShape, together: bool
) -> tuple[MemoryCheck | None, list[logging.LogRecord], RunShape]:
    """The checks of a frequency layout made here, their lines held back, and the shape they
    ran on: as estimated, else (the budget does not hold it) with the split's rows counted."""
    with held_logs() as held:  # the trial's own lines (its fit) are said only if it is kept
        try:
            return _memory_checks(cfg, dataset, stream, shape, together), held, shape
        except BudgetError:
            pass
    exact = counted(shape, dataset, stream)
    if exact is shape:
        return None, [], shape
    with held_logs() as held:
        try:
            return _memory_checks(cfg, dataset, stream, exact, together), held, exact
        except BudgetError:
            return None, [], exact


def _frequency_made_here(shape: RunShape) -> bool:
    lay = shape.layout
    return lay is not None and lay.name == "frequency" and lay.made


@contextmanager
def held_logs() -> Iterator[list[logging.LogRecord]]:
    """Hold back every line logged inside the block (the handlers of the ``bagpipe`` and the
    root logger drop them); the list of records, in order, to replay if wanted."""
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if not any(r is record for r in held):  # one record reaches every handler
            held.append(record)
        return False

    handlers = [*logging.getLogger("bagpipe").handlers, *logging.getLogger().handlers]
    for h in handlers:
        h.addFilter(hold)
    try:
        yield held
    finally:
        for h in handlers:
            h.removeFilter(hold)


def _memory_checks(
    cfg: TrainConfig, dataset: Dataset, stream: BatchStream, shape: RunShape, together: bool
) -> MemoryCheck:
    from bagpipe.budget import memory_plan
    from bagpipe.budget.sizing import full_tables_fit

    spec = cfg.cache.spec
    distributed = cfg.dist.distributed
    # a distributed job's trainers are sized by the oracle role as remote trainers
    memory = memory_plan(cfg, dataset, stream, role="remote-trainer" if distributed else "trainer", shape=shape)
    if memory.budget.note:  # --memory-budget-mb above the cgroup's limit: said once, by plan and train alike
        log.warning(memory.budget.note)
    if not spec.store:
        return MemoryCheck(full_tables_fit(memory.budget, memory.shape), None, shape=shape)
    setup = cache_setup(cfg, dataset, stream, memory)
    assert setup.plan.fit is not None  # sized: a memory plan was given
    _batches_fit(setup, stream, cfg.run.steps)
    roles: tuple[RoleShare, ...] = ()
    if distributed:
        from bagpipe.optim.names import row_state_dim

        dim = cfg.arch.model_config().embedding_dim
        state_dim = row_state_dim(cfg.optim.optimizer, dim)
        roles = _job_roles(cfg, dataset, stream, setup.plan.fit, dim, state_dim)
        if together:
            from bagpipe.budget.job import check_job, shared_budget

            def at(budget: Budget) -> tuple[RoleShare, ...] | None:  # the roles sized at another budget
                try:
                    fitted = cache_setup(cfg, dataset, stream, MemoryPlan(budget, memory.shape, role=memory.role))
                    assert fitted.plan.fit is not None
                    server = budget if cfg.memory.server_memory_budget_mb is None else None
                    return _job_roles(cfg, dataset, stream, fitted.plan.fit, dim, state_dim, server, quiet=True)
                except BudgetError:
                    return None

            check_job(roles, shared_budget(cfg.memory.memory_budget_mb), off=cfg.memory.memory_budget_mb == 0, at=at)
    return MemoryCheck(setup.plan.fit, setup, roles, shape=shape)


def _batches_fit(setup: CacheSetup, stream: BatchStream, steps: int) -> None:
    """The run's first plans, made as the run makes them (no row moves): a cache below a
    batch's unique rows raises the planner's own CapacityError, the line the run would
    stop with at that step. As many batches as :func:`~bagpipe.budget.shape.with_traffic`
    plans; a cache of ``enough`` rows holds every batch and is not planned."""
    from bagpipe.cache.setup import LocalPlans

    if setup.spec.planner is None or setup.plan.cache_rows >= setup.enough:
        return
    L = max(1, setup.plan.lookahead)
    n = min(steps, max(1, stream.batches_per_epoch) * 4, 2 * L + 9 if setup.spec.looks_ahead else 24)
    for _ in LocalPlans(setup).plans(stream, 0, n):
        pass


def _job_roles(
    cfg: TrainConfig,
    dataset: Dataset,
    stream: BatchStream,
    trainer: Fit,
    dim: int,
    state_dim: int,
    server_budget: Budget | None = None,
    quiet: bool = False,
) -> tuple[RoleShare, ...]:
    """Each role of a distributed job with its estimate; an embedding server's budget
    (``server_budget``, else its options') is checked here (:func:`bagpipe.budget.server_fit`,
    as each server checks it) before any role starts. Server 0 holds the most rows."""
    from bagpipe.budget import estimate, server_fit
    from bagpipe.budget.job import server_request_rows

    n, s = cfg.dist.trainers, cfg.dist.servers
    budget = server_budget or Budget.of(cfg.memory.server_memory_budget_mb, option="--server-memory-budget-mb")
    if (
        budget.note and not quiet
    ):  # above the cgroup's limit: said once, by plan and train alike (as --memory-budget-mb)
        log.warning(budget.note)
    rows = -(-dataset.meta.total_rows // s)  # server 0's shard: rows r with r % S == 0
    _, server = server_fit(budget, rows, dim, state_dim, cfg.cache.store, server_request_rows(cfg.data.batch_size, s))
    oracle = estimate(run_shape(cfg, dataset, stream), trainer.sizes, role="oracle")  # it plans the global batch
    return (
        RoleShare("each trainer" if n > 1 else "the trainer", n, trainer.estimate),
        RoleShare("each embedding server" if s > 1 else "the embedding server", s, server),
        RoleShare("the oracle", 1, oracle),
    )


def cache_setup(cfg: TrainConfig, dataset: Dataset, stream: BatchStream, memory: MemoryPlan) -> CacheSetup:
    """The cache of run ``cfg`` set up from its sections (mode, cache, hot tier, steps, D,
    the row optimizer's S, seed) for ``memory``: what one process builds and what the oracle
    role sends every trainer (:func:`bagpipe.cache.setup.set_up_cache`)."""
    from bagpipe.cache.setup import set_up_cache
    from bagpipe.optim.names import row_state_dim

    dim = cfg.arch.model_config().embedding_dim
    return set_up_cache(
        cfg.cache.spec,
        cfg.cache,
        cfg.hot,
        dataset=dataset,
        stream=stream,
        steps=cfg.run.steps,
        dim=dim,
        state_dim=row_state_dim(cfg.optim.optimizer, dim),
        seed=cfg.run.seed,
        memory=memory,
        retain=cfg.dist.trainers == 1,
    )
