"""``bagpipe plan``: what a training run would need in memory, before it runs."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Print what `bagpipe train` with the same options would use in memory, part by part,
and whether that fits the run's memory budget -- without training.

The budget is --memory-budget-mb, or else the limit of the memory cgroup this command
runs in (a container's, a Kubernetes pod's, a Slurm job's), page cache included. The
run is sized as `bagpipe train` sizes it: the plans it reads ahead, the disk store's
I/O bounds, a mode's default hot tier and the default cache give way to the budget
(what you set stays), with 10% of the budget kept free. The parts: the interpreter and
torch, the dense model and optimizer (with a step's activations, measured on the
model), the cache, the hot tier, staging (plans in flight, fetched and written-back
rows, I/O buffers), the oracle, the store, the page cache the run pins (dirty pages,
reads in flight) and evaluation. A distributed run (--servers) prints each role.

Exit status 0 when the run fits, 2 (with the one line `bagpipe train` would stop with)
when it does not.

Examples:
  bagpipe plan --data data/criteo --mode lookahead --store disk --cache-rows 84406 --lookahead 20
  bagpipe plan --data data/criteo --mode lookahead --store disk --memory-budget-mb 512
  bagpipe plan --config run.toml
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bagpipe.config import add_options
    from bagpipe.config.argtypes import path
    from bagpipe.config.train import TrainConfig

    p.add_argument("--config", type=path, metavar="FILE", help="TOML file with settings (command-line options win)")
    # the run folder is not written: --out is optional here
    add_options(p, TrainConfig, skip=("out",))


def run(args: argparse.Namespace) -> int:
    from bagpipe.budget import BudgetError, memory_plan
    from bagpipe.cache.advice import plan_advice
    from bagpipe.config import given
    from bagpipe.config.train import TrainConfig, load_config
    from bagpipe.data.shards import Dataset
    from bagpipe.data.stream import train_stream

    settings = given(args, TrainConfig) | {"out": "(not written)"}
    cfg = load_config(args.config, settings)
    dataset = Dataset(cfg.data.data)
    stream = train_stream(dataset, cfg.data, cfg.run.seed)
    spec = cfg.cache.spec
    memory = memory_plan(cfg, dataset, stream, role="remote-trainer" if cfg.distributed else "trainer")
    shape = memory.shape
    gib = shape.num_rows * shape.row_bytes / 2**30
    where = f"a {cfg.cache.store} store" if spec.store else "the trainer's memory (--mode full)"
    print(
        f"bagpipe plan: {cfg.arch.model}/{cfg.arch.recipe} --mode {spec.name} on {where}; {shape.num_rows:,} rows x "
        f"({shape.dim} + {shape.state_dim}) floats = {gib:.2f} GiB of rows; batch {shape.batch_size:,} "
        f"({shape.unique:,} unique rows in the largest of the first batches)"
    )
    budget = memory.budget
    print(
        "memory budget: "
        + (
            f"{budget.mib:,.0f} MiB from {budget.source}; {budget.usable / 2**20:,.0f} MiB to plan for (10% kept free)"
            if budget.bytes is not None and budget.usable is not None
            else f"none ({budget.source}): the estimate is printed, nothing is sized"
        )
    )
    try:
        fit = _fit(cfg, dataset, stream, memory)
    except BudgetError as e:
        if e.estimate is not None:
            print("estimate of the smallest configuration:")
            print("\n".join(e.estimate.lines()))
        print(f"does not fit: {e}")
        return 2
    s = fit.sizes
    if spec.store:
        chosen = [f"cache {s.cache_rows:,} rows ({s.cache_rows / shape.num_rows:.2%} of rows)"]
        if spec.looks_ahead:
            chosen.append(f"lookahead L = {s.lookahead}, {s.staged} plans read ahead")
        if s.hot_rows:
            chosen.append(f"hot tier {s.hot_rows:,} rows")
        if cfg.cache.store == "disk":
            io = s.io
            chosen.append(
                f"disk store: {io.threads} I/O threads, {io.hint_bytes / 2**20:.0f} MiB of pages in flight, "
                + (f"dirty pages <= {io.dirty_bytes / 2**20:.0f} MiB" if io.dirty_bytes else "dirty pages unbounded")
                + (f", page cache <= {io.page_cache_bytes / 2**20:.0f} MiB" if io.page_cache_bytes else "")
            )
        print("it would use: " + "; ".join(chosen))
        for c in fit.changes:
            print(f"  (the budget chose {c})")
        advice = plan_advice(spec, cfg.cache.store, remote=cfg.distributed)
        if advice:
            print(advice)
    roles = [(f"{'each trainer' if cfg.dist.trainers > 1 else 'the trainer'}", cfg.dist.trainers, fit.estimate)]
    if cfg.distributed:
        roles = _roles(cfg, dataset, stream, shape, fit)
    total = 0
    for name, count, est in roles:
        print(f"estimate of {name}'s peak ({est.role}):")
        print("\n".join(est.lines()))
        total += count * est.total
    if len(roles) > 1:
        print(f"the job (every role on one machine): {total / 2**20:,.0f} MiB")
    if budget.usable is not None:
        print(f"fits: yes ({fit.estimate.mib:,.0f} of {budget.usable / 2**20:,.0f} MiB)")
    return 0


def _fit(cfg, dataset, stream, memory):
    """The fit ``bagpipe train`` would make (the same set-up code)."""
    from bagpipe.budget.sizing import full_tables_fit
    from bagpipe.cache.setup import set_up_cache

    spec = cfg.cache.spec
    if not spec.store:
        return full_tables_fit(memory.budget, memory.shape)
    setup = set_up_cache(
        spec,
        cfg.cache,
        cfg.hot,
        dataset=dataset,
        stream=stream,
        steps=cfg.run.steps,
        dim=memory.shape.dim,
        state_dim=memory.shape.state_dim,
        seed=cfg.run.seed,
        memory=memory,
    )
    assert setup.plan.fit is not None
    return setup.plan.fit


def _roles(cfg, dataset, stream, shape, fit):
    """(name, how many, estimate) of each role of a distributed job."""
    from bagpipe.budget import Budget
    from bagpipe.budget.estimate import estimate, estimate_server
    from bagpipe.budget.shape import run_shape
    from bagpipe.budget.sizing import io_for

    n, S = cfg.dist.trainers, cfg.dist.servers
    trainer = fit.estimate  # the oracle role sizes the trainers' cache for them
    io = io_for(Budget.of(cfg.memory.server_memory_budget_mb, option="--server-memory-budget-mb"))
    rows = max(1, cfg.data.batch_size * 32 // S)
    server = estimate_server(-(-shape.num_rows // S), shape.dim, shape.state_dim, cfg.cache.store, io, rows)
    oracle = estimate(run_shape(cfg, dataset, stream), fit.sizes, role="oracle")  # plans the global batch
    return [("each trainer", n, trainer), ("each embedding server", S, server), ("the oracle", 1, oracle)]
