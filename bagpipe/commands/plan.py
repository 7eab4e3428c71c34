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
(what you set stays), with 15% of the budget kept free. The parts: the interpreter and
torch, the dense model and optimizer (with a step's activations, measured on the
model), the cache, the hot tier, staging (plans in flight, fetched and written-back
rows, I/O buffers), the oracle, the store, the page cache the run pins (dirty pages,
reads in flight) and evaluation. A distributed run (--servers) prints each role, and
the sum of every role with the launcher held against what a local job shares: its
memory cgroup's limit, or --memory-budget-mb where that is smaller (on a local job it
is the whole job's; each trainer is sized to it alone).

It takes `bagpipe train`'s options, --out included, so a train command line runs as it
is: plan writes nothing there, but refuses an --out that train would refuse before it
trains (the data set or a folder inside it, another data set or an export, a folder
holding another run -- its checkpoints or its records -- without --resume), in train's
words. With --resume (or --resume-from) it makes train's resume checks, and refuses
what train would refuse in the same words: no checkpoint to continue, a run already
complete at --steps, a setting that may not change on resume (the seed, the model, ...)
or another data set, a damaged checkpoint. That check reads the checkpoint's files
(their sizes and CRC-32s, as train does), which takes a while for a large run;
--resume-from's checkpoint is not made the one LATEST names (train does that). With
--out it also checks, as train does, that the run's checkpoints and its disk store fit on
their disks. Train's --summary-json check is not made (it probes by writing a file).

Exit status 0 when the run fits, 2 (with the one line `bagpipe train` would stop with)
when it does not.

Examples:
  bagpipe plan --data data/criteo --mode lookahead --store disk --cache-rows 84406 --lookahead 20
  bagpipe plan --data data/criteo --mode lookahead --store disk --memory-budget-mb 512
  bagpipe plan --config run.toml
"""

#: The run folder of a plan given no --out (it writes none).
NO_OUT = "(not written)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bagpipe.config import add_options
    from bagpipe.config.argtypes import given_once, path
    from bagpipe.config.train import TrainConfig

    p.add_argument(
        "--config",
        type=path,
        action=given_once("one settings file is read; merge them into one (command-line options win over it)"),
        metavar="FILE",
        help="TOML file with settings (command-line options win)",
    )
    add_options(p, TrainConfig)
    # the run folder is not written: --out is optional, taken so that a train command line can be pasted
    out = next(a for a in p._actions if a.dest == "out")
    out.help = (
        "accepted so that a `bagpipe train` command line runs as it is; plan writes nothing there, but "
        "refuses an --out train would refuse (the data set or inside it, a data set or an export, a folder "
        "holding another run without --resume); with --resume, the run there that train would refuse to "
        "continue (no checkpoint, complete, a changed setting or data set, a damaged checkpoint)"
    )


def run(args: argparse.Namespace) -> int:
    from bagpipe.budget import BudgetError
    from bagpipe.budget.job import job_overflow, job_total, launcher_estimate, shared_budget
    from bagpipe.budget.shape import run_shape
    from bagpipe.budget.sizing import MARGIN, plans
    from bagpipe.cache.advice import layout_advice, plan_advice
    from bagpipe.config import given
    from bagpipe.config.train import TrainConfig, load_config
    from bagpipe.data.shards import Dataset
    from bagpipe.data.stream import train_stream
    from bagpipe.train.preflight import memory_checks

    cfg = load_config(args.config, given(args, TrainConfig), defaults={"out": NO_OUT})
    if cfg.run.out != NO_OUT:  # from the command line or the config file: what train would refuse of it
        check_out(cfg)
    dataset = Dataset(cfg.data.data)
    if cfg.run.resume:  # --resume (--resume-from): what train checks of the run it continues, before it trains
        check_resume_of(cfg, dataset)
    stream = train_stream(dataset, cfg.data, cfg.run.seed)
    spec = cfg.cache.spec
    # the shape `train` measures in its pre-flight (a data-parallel trainer: its share of the batch)
    share = stream.batch_size // cfg.dist.trainers if cfg.distributed else None
    shape = run_shape(cfg, dataset, stream, share)
    if cfg.run.out != NO_OUT:  # train's disk checks, in its order: checkpoints, then a disk store (read-only)
        from bagpipe.train.preflight import store_space
        from bagpipe.train.space import check_checkpoint_space

        shape = store_space(cfg, shape, check_checkpoint_space(cfg, dataset, shape))
        check_reused_store(cfg, dataset, shape)
    budget = _budget(cfg)
    gib = shape.num_rows * shape.row_bytes / 2**30
    where = f"a {cfg.cache.store} store" if spec.store else "the trainer's memory (--mode full)"
    print(
        f"bagpipe plan: {cfg.arch.model}/{cfg.arch.recipe} --mode {spec.name} on {where}; {shape.num_rows:,} rows x "
        f"({shape.dim} + {shape.state_dim}) floats = {gib:.2f} GiB of rows; batch {shape.batch_size:,} "
        f"({shape.unique:,} unique rows in the largest of the first batches)"
    )
    # a local job's --memory-budget-mb is the whole job's: the roles together are held to it below
    whose = " (each trainer is sized to it; every role together is checked below)" if cfg.distributed else ""
    print(
        "memory budget: "
        + (
            f"{budget.mib:,.0f} MiB from {budget.source}{whose}; {budget.usable / 2**20:,.0f} MiB to plan for "
            f"({MARGIN:.0%} kept free)"
            if budget.bytes is not None and budget.usable is not None
            else f"none ({budget.source}): the estimate is printed, nothing is sized"
        )
    )
    try:
        # the checks `train` makes before it trains, in its words (bagpipe.train.preflight)
        checked = memory_checks(cfg, dataset, stream, shape)
    except BudgetError as e:
        if e.estimate is not None:
            print("estimate of the smallest configuration:")
            print("\n".join(e.estimate.lines()))
        print(f"does not fit: {e}")
        return 2
    fit = checked.fit
    s = fit.sizes
    if spec.store:
        chosen = [f"cache {s.cache_rows:,} rows ({s.cache_rows / shape.num_rows:.2%} of rows)"]
        if spec.looks_ahead:
            chosen.append(f"lookahead L = {s.lookahead}, {plans(s.staged)} read ahead")
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
        if budget.bytes is None and fit.budget.bytes is not None:  # no budget, and the defaults exceeded the machine
            print(
                f"  (no budget: the defaults were sized to {fit.budget.source.split(':')[0]}, {fit.budget.mib:,.0f} MiB)"
            )
        for c in fit.changes:
            print(f"  (the budget chose {c})")
        advice = plan_advice(spec, cfg.cache.store, remote=cfg.distributed)
        if advice:
            print(advice)
        lay = (checked.shape or shape).layout  # as the run chooses it (bagpipe.budget.shape.choose_layout)
        if lay is not None and not cfg.distributed:
            line = f"layout: {lay.name} ({lay.why})"
            # only for --store-layout identity: auto's own choice says why in `why` (and names the option)
            asked = lay.made and not lay.auto
            advice = layout_advice(cfg.cache.store, cfg.distributed, lay.name) if asked else None
            if advice:
                line += f"; {advice}" + _layout_room(cfg, dataset, stream)
            print(line)
    if not checked.roles:
        print(f"estimate of {'each trainer' if cfg.dist.trainers > 1 else 'the trainer'}'s peak ({fit.estimate.role}):")
        print("\n".join(fit.estimate.lines()))
        if fit.budget.usable is not None:
            print(f"fits: yes ({fit.estimate.mib:,.0f} of {fit.budget.usable / 2**20:,.0f} MiB)")
        return 0
    for role in checked.roles:
        print(f"estimate of {role.name}'s peak ({role.estimate.role}):")
        print("\n".join(role.estimate.lines()))
    total = job_total(checked.roles)
    print(
        f"the job on one machine (a local job: every role and the launcher, {launcher_estimate().mib:,.0f} MiB, "
        f"in one memory cgroup): {total / 2**20:,.0f} MiB"
    )
    # what memory_checks held the roles to (bagpipe.budget.job.check_job): the cgroup's limit,
    # or --memory-budget-mb where smaller
    shared = shared_budget(cfg.memory.memory_budget_mb)
    if shared.usable is None:
        return 0
    if total > shared.usable:  # only with --memory-budget-mb 0: check_job refuses it otherwise
        print(f"fits: not checked -- {job_overflow(checked.roles, shared)}")
    else:
        print(f"fits: yes (the job's {total / 2**20:,.0f} of {shared.usable / 2**20:,.0f} MiB of {shared.source})")
    return 0


def check_out(cfg) -> None:
    """Refuse, in train's words, an ``--out`` (or ``--store-dir``) that ``bagpipe train``
    would refuse before it trains: train's own checks, which only look (no folder made,
    no lock taken)."""
    from bagpipe.commands.train import check_out_folders
    from bagpipe.train.resume import elastic_restart, refuse_overwrite
    from bagpipe.train.rundir import RunDir

    check_out_folders(cfg)
    if not (cfg.run.resume or elastic_restart()):
        refuse_overwrite(RunDir(cfg.run.out))  # RunDir(path) only names the folder: claim() makes it
    c = cfg.cache
    if c.spec.store and c.store == "disk" and c.store_dir and not cfg.distributed:
        from pathlib import Path

        from bagpipe.store import check_users_store_dir, holds_store
        from bagpipe.store.disk import check_store_files

        # train's open_store refusals, read-only (a resume's store is checked by check_resume_of)
        check_users_store_dir(
            Path(c.store_dir), reuse=c.init_from_store or cfg.run.resume, must_exist=c.init_from_store
        )
        if holds_store(c.store_dir):
            check_store_files(c.store_dir)  # its header and layout; against the run's rows once its shape is known


def _layout_room(cfg, dataset, stream) -> str:
    """Where the budget does not hold the frequency layout the advice suggests, why ("":
    it does): the run with it sized as plan sizes it (plan suggested it in a 480 MiB group
    where the run with it needed 507; newcomer round 21)."""
    import dataclasses

    from bagpipe.budget import BudgetError
    from bagpipe.budget.shape import run_shape
    from bagpipe.train.preflight import memory_checks

    with_layout = dataclasses.replace(cfg, cache=dataclasses.replace(cfg.cache, store_layout="frequency"))
    try:
        memory_checks(with_layout, dataset, stream, run_shape(with_layout, dataset, stream))
    except BudgetError as e:
        return f"; but not in this budget: with it, {e}"
    return ""


def check_reused_store(cfg, dataset, shape) -> None:
    """Refuse, in train's words, a --store-dir store the run would start from that is not of
    its rows (another dimension, optimizer state, seed or data set; files of other sizes)."""
    from bagpipe.store import holds_store
    from bagpipe.store.disk import check_store_files, expected_header

    c = cfg.cache
    if not (c.spec.store and c.store == "disk" and c.store_dir and not cfg.distributed and holds_store(c.store_dir)):
        return
    want = expected_header(shape.num_rows, shape.dim, shape.state_dim, cfg.run.seed, dataset.meta.table_sizes)
    check_store_files(c.store_dir, want)


def check_resume_of(cfg, dataset) -> None:
    """Refuse, in train's words, a --resume (--resume-from) that ``bagpipe train`` would
    refuse before it trains: no checkpoint to continue, a complete run, a changed setting
    or data set, a damaged checkpoint (its files are read and checked against its
    manifest). Train's own check, which only reads: --resume-from's naming of the
    checkpoint in LATEST stays train's."""
    from bagpipe.train.resume import check_resume
    from bagpipe.train.rundir import RunDir

    if cfg.run.out == NO_OUT:
        from bagpipe.errors import ConfigError

        raise ConfigError(
            "--resume needs --out, the run folder to continue (train requires it): plan checks the run there as train does"
        )
    check_resume(RunDir(cfg.run.out), cfg, dataset)


def _budget(cfg):
    """The trainer's budget, as `train` finds it."""
    from bagpipe.budget import Budget

    return Budget.of(cfg.memory.memory_budget_mb)
