"""The training loop: one function from a :class:`TrainConfig` to a summary, for every topology.

The loop is written against the declared seams of :mod:`bagpipe.train.protocols` only.
What differs between one process and a data-parallel trainer is a :class:`Topology`
(:mod:`bagpipe.train.topology` for one process, :mod:`bagpipe.distributed.trainer` for
a trainer of a distributed job): which backend holds the rows, how a step updates
them (the row strategy), how the model is wrapped (DDP), how a figure is averaged over
the trainers and whether this process writes the run's files. Everything else --
resuming, the progress line, metrics.jsonl, evaluation, checkpoints, the digest and
summary.json -- is this one piece of code.

Start-up checks the run (:func:`bagpipe.train.preflight.preflight`, which the local
launcher calls too) and builds its parts (:class:`RunParts`); :meth:`_Run.train` steps
and, after each step, lets the parts that act every so many steps
(:mod:`bagpipe.train.cadence`: metrics, evaluations, checkpoints) decide whether to;
:meth:`_Run.end` is the end of the run, one timed sequence.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Generic

import torch

import bagpipe.phases as phases
from bagpipe.budget.device import check_device_budget, device_estimate
from bagpipe.budget.watch import MemoryWatch
from bagpipe.cache.advice import slow_store
from bagpipe.checkpoint import InitialRows, RowSpace
from bagpipe.config.train import TrainConfig
from bagpipe.data.stream import train_stream
from bagpipe.device import on_host, open_device
from bagpipe.models import build_model
from bagpipe.optim.schedule import set_lr
from bagpipe.optim.sparse import SparseOptimizer
from bagpipe.store.init import RowInitializer
from bagpipe.train.cadence import (
    LOG_EVERY,
    Cadence,
    Checkpointer,
    EndClock,
    Epochs,
    Evaluator,
    MetricsLogger,
    NullReporter,
    Reporter,
    RunReporter,
)
from bagpipe.train.evaluate import evaluate
from bagpipe.train.guards import StepGuard
from bagpipe.train.preflight import Preflight, preflight
from bagpipe.train.progress import Progress
from bagpipe.train.protocols import B, StepFn, Topology
from bagpipe.train.resume import restore_dense
from bagpipe.train.rundir import RunDir, dense_copy, digest_of
from bagpipe.train.step import EmulatedStep, step_for
from bagpipe.train.step.slipstream import StaleSkip, stale_skip_for
from bagpipe.train.summary import (
    LOSS_WINDOW,
    Approximation,
    CheckpointStats,
    EndOfRun,
    MemoryReport,
    StepMeter,
    Summary,
)
from bagpipe.train.topology import SingleProcess

log = logging.getLogger(__name__)

__all__ = ["LOG_EVERY", "RunParts", "train"]


def train(cfg: TrainConfig, topology: Topology[B] | None = None) -> dict | None:
    """Train as configured; returns (and writes) the summary, or None on a process that
    does not report (a data-parallel trainer other than trainer 0).

    One-line notices meant for the user before and during training (the auto-tuner's
    choice, the hot tier, ``resumed from step N``, evaluations) go to the ``bagpipe``
    logger; the command line shows them.

    Start-up checks everything before the run folder changes: the folder is locked
    (one run per folder), the data set's files are checked, a resumed run must
    continue what the folder holds; if start-up fails in a folder this call created,
    the folder is removed again.

    Without a ``topology`` the run is one process on the device ``cfg.device`` names
    (opened here, and closed at the end).
    """
    if topology is None:
        dc = cfg.device
        device = open_device(dc.device, deterministic=dc.deterministic, memory_budget_mb=dc.device_memory_budget_mb)
        try:
            return train(cfg, SingleProcess(device))
        finally:
            device.close()
    topo = topology
    rc = cfg.run
    if not topo.reports:  # trainers 1..N-1 write nothing to the run folder
        return _start(cfg, topo, RunDir(rc.out), NullReporter())
    with RunDir(rc.out).claim() as run:
        return _start(cfg, topo, run, RunReporter(run, cfg))


@dataclass(frozen=True)
class Dense:
    """The dense side of a run: the model, the model as the step runs it (``net``: DDP on a
    data-parallel trainer) and its optimizer."""

    model: torch.nn.Module
    net: torch.nn.Module
    opt: torch.optim.Optimizer


@dataclass(frozen=True)
class RunParts(Generic[B]):
    """What start-up built for one run of the loop; ``B``: the topology's backend."""

    cfg: TrainConfig
    topo: Topology[B]
    pre: Preflight
    """The data set, its train stream, the run's shape, the checkpoint it continues."""
    dense: Dense
    init: RowInitializer
    sparse_opt: SparseOptimizer
    backend: B
    reporter: Reporter
    start: int
    """The step the run starts at (0, or the resumed checkpoint's)."""


def _set_threads(n: int, warn: bool) -> None:
    """torch's intra-op threads; more than the CPUs this process may run on is said once
    (``warn``: the reporting trainer): the threads then queue for the cores -- slower, never
    wrong -- and a typo such as ``--threads 1000`` is not taken silently."""
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if warn and n > cpus:
        log.warning(
            f"--threads {n} is more than the {cpus} CPUs this process may run on: torch's threads will wait "
            f"for the cores (slower, not wrong); give --threads {cpus} or fewer"
        )
    torch.set_num_threads(n)


def _start(cfg: TrainConfig, topo: Topology[B], run: RunDir, reporter: Reporter) -> dict | None:
    rc = cfg.run
    if rc.threads:
        _set_threads(rc.threads, warn=topo.reports)
    # trainer 0 checks; trainers 1..N-1 take the checkpoint trainer 0 checked
    pre = preflight(cfg, run, checks=topo.reports)
    meta = pre.dataset.meta
    mcfg = cfg.arch.model_config()
    torch.manual_seed(rc.seed)
    # built on the host (the same initial values on every device), then moved
    model = build_model(mcfg, meta.num_dense, meta.num_features).to(topo.device.torch)
    # before any row reaches the device: a run that cannot fit its device budget stops here
    check_device_budget(cfg, device_estimate(cfg, meta, pre.shape.dense_params, pre.share))
    dense = Dense(model, topo.wrap(model), cfg.optim.dense_optimizer(model.parameters()))
    sparse_opt = cfg.optim.sparse_optimizer(mcfg.embedding_dim)
    init = RowInitializer(meta.table_sizes, mcfg.embedding_dim, rc.seed)
    backend = topo.backend(cfg, init, sparse_opt.state_dim, pre.dataset, pre.stream, pre.shape, pre.ckpt, pre.memory)
    phases.mark("ready")
    failed = True
    try:
        start = 0
        if pre.ckpt is not None:
            start = restore_dense(pre.ckpt, model, dense.opt, init, sparse_opt.state_dim)
            topo.restore_rows(pre.ckpt, backend)
            phases.mark("restored")
            reporter.resumed(start)
        reporter.config_later(
            cfg.to_json(),
            mcfg,
            {
                "dir": str(pre.dataset.dir),
                "fingerprint": pre.dataset.fingerprint(),
                "table_sizes": meta.table_sizes,
                "num_dense": meta.num_dense,
            },
        )
        parts = RunParts(
            cfg=cfg,
            topo=topo,
            pre=pre,
            dense=dense,
            init=init,
            sparse_opt=sparse_opt,
            backend=backend,
            reporter=reporter,
            start=start,
        )
        summary = _Run(parts).train()
        failed = False
        return summary
    finally:
        backend.close(abandon=failed)


def _approximation(
    names: list[str], skipper: StaleSkip | None, row_stats: dict, step: StepFn | None
) -> Approximation | None:
    """The summary's ``approximation`` section: None for an exact run."""
    if not names:
        return None
    return Approximation(
        names=names,
        skip_stale=skipper.report() if skipper is not None else None,
        periodic=row_stats.get("periodic"),
        emulated_compute=step.report() if isinstance(step, EmulatedStep) else None,
    )


class _Run(Generic[B]):
    """One run of the loop, from its first step to its summary."""

    def __init__(self, parts: RunParts[B]):
        p = self.p = parts
        rc, init = parts.cfg.run, parts.init
        self.rows = p.topo.row_update(p.sparse_opt, p.backend)
        self.schedule = p.cfg.optim.schedule()
        self.bases = {"lr": p.cfg.optim.lr, "embedding_lr": p.cfg.optim.row_lr}
        self.checkpointer = Checkpointer(
            every=rc.checkpoint_every,
            total=rc.steps,
            writer=p.reporter.checkpoint_writer(
                RowSpace(init.num_rows, init.dim, p.sparse_opt.state_dim, InitialRows(init.seed, init.table_sizes))
            ),
            finish_rows=self.rows.finish,
            cut_rows=lambda step, target: p.topo.checkpoint_cut(step, p.backend, target),
            dense_state=self.dense_state,
        )
        # Slipstream's watched rows are profiled (full) before the meter starts
        self.skipper = stale_skip_for(
            p.cfg.approx,
            p.cfg.cache.spec,
            p.cfg.hot,
            p.backend,
            p.pre.dataset,
            train_stream(p.pre.dataset, p.cfg.data, rc.seed),
            p.init.dim,
            p.sparse_opt.state_dim,
            rc.seed,
        )
        self.step: StepFn | None = None  # the step function, once training starts
        self.meter = StepMeter(
            start=p.start,
            warmup=rc.warmup_steps,
            batch_size=p.cfg.data.batch_size,
            phases=lambda: p.backend.phase_seconds() | self.rows.phase_seconds(),
        )

    def dense_state(self, step: int) -> dict:
        """What a checkpoint of ``step`` holds of the dense side (on the host: loadable on any machine)."""
        return dense_copy(
            step=step,
            model=on_host(self.p.dense.model.state_dict()),
            dense_optimizer=on_host(self.p.dense.opt.state_dict()),
            torch_rng=torch.get_rng_state(),
            lr_schedule=self.schedule.state(step, self.bases),
        )

    def settle(self, step: int) -> None:
        """After ``step`` steps: every row final and in the store (for an evaluation or a
        checkpoint mid-run). Write-back labels are 0-based plan indices: the last plan
        done is ``step - 1``, and announcing any later label would let other trainers'
        reads overtake write-backs that have not happened yet."""
        self.rows.finish()
        self.p.backend.flush(step - 1)

    def rates(self, step: int) -> dict:
        """The learning rates of the 0-based ``step``."""
        return self.schedule.rates(step, self.bases)

    def evaluation(self) -> dict:
        p = self.p
        return evaluate(p.dense.model, p.backend.lookup, p.pre.dataset, p.cfg.data.batch_size, p.cfg.run.eval_samples)

    def train(self) -> dict | None:
        p, rows, meter = self.p, self.rows, self.meter
        cfg, rc, stream, reporter = p.cfg, p.cfg.run, p.pre.stream, p.reporter
        progress = Progress(
            p.topo.progress_kind(rc.progress),
            total=rc.steps,
            initial=p.start,
            desc=f"train {cfg.arch.model}/{cfg.cache.mode}",
            quiet=not p.topo.reports,
        )
        watch = MemoryWatch()  # samples the anonymous memory from here to the end of the run
        reporter.open(p.start)
        epochs = Epochs(stream.batches_per_epoch, rc.steps, progress)
        epochs.resumed(p.start)  # resumed at an epoch's end: the next one begins now
        cadence: tuple[Cadence, ...] = (
            epochs,
            MetricsLogger(LOG_EVERY, rc.steps, p.start, meter, p.topo.mean, self.rates, progress, watch, reporter),
            Evaluator(rc.eval_every, rc.steps, self.settle, self.evaluation, reporter, progress.note),
            self.checkpointer,
        )
        self.step = step_for(cfg)  # the mode's, or --emulate-compute's
        run_step: StepFn = self.step
        if self.skipper is not None:  # Slipstream: the stale inputs are left out of the step
            run_step = self.skipper.wrap(run_step)
        step, guard = p.start, StepGuard(cfg.cache.store_dir if cfg.cache.init_from_store else None)
        try:
            for inp in p.backend.steps(stream, p.start, rc.steps, before_evict=rows.before_evict):
                # the rows' optimizer scales its own rate by inp.step
                set_lr(p.dense.opt, self.schedule.lr(cfg.optim.lr, inp.step))
                loss = run_step(p.dense.net, p.dense.opt, rows, inp, meter.times)
                p.backend.after_step(inp)  # its copy-out time is in the executor's "writeback"
                step = inp.step + 1
                # a NaN or infinite loss, gradient or row, or an exploded loss, stops the run here
                guard.check(step, loss, p.dense.model, inp)
                meter.record(step, loss)
                reporter.stepped(step)
                progress.advance()
                for part in cadence:
                    part.maybe(step)
            rows.finish()
            meter.stop()
            progress.close()
            return self.end(step, watch)
        except BaseException:
            self.checkpointer.abandon()
            raise
        finally:
            watch.stop()
            progress.close()
            reporter.close()

    def end(self, step: int, watch: MemoryWatch) -> dict | None:
        """The end of the run after its last step, each phase timed (the summary's
        ``end_of_run_s``); a process that does not report stops after the final cut."""
        p, reporter = self.p, self.p.reporter
        clock = EndClock()
        with clock.phase("finish"):
            train_loss = p.topo.mean(self.meter.losses[-LOSS_WINDOW:]) if self.meter.losses else None
            p.backend.finish()
        if p.cfg.run.final_checkpoint and step > p.start:  # (a run restarted after its end has it already)
            with clock.phase("checkpoint_cut"):
                self.checkpointer.cut(step)  # written while the run evaluates and hashes
        peak_anon = watch.peak()  # the summary's training-time peak; the watch goes on
        with clock.phase("evaluation"):
            ev = reporter.evaluate(step, self.evaluation)
        with clock.phase("digest"):
            digest = reporter.only(self.digest) if p.cfg.run.digest else None
        with clock.phase("checkpoint_wait"):
            self.checkpointer.wait()
        end = clock.result()
        return reporter.write_summary(lambda: self.summary(step, train_loss, ev, digest, peak_anon, end, watch))

    def digest(self) -> str:
        p = self.p
        return digest_of(p.dense.model, p.init, p.sparse_opt.state_dim, p.backend.touched())

    def summary(
        self,
        step: int,
        train_loss: float | None,
        ev: dict | None,
        digest: str | None,
        peak_anon: float,
        end: EndOfRun,
        watch: MemoryWatch,
    ) -> dict:
        p, cfg = self.p, self.p.cfg
        writer = self.checkpointer.writer
        # built on the process that reports, which evaluates and writes the checkpoints
        assert writer is not None and ev is not None
        return Summary.of(
            mode=cfg.cache.mode,
            model=cfg.arch.model,
            device=p.topo.device.describe(),
            optimizer=cfg.optim.optimizer,
            batch_size=cfg.data.batch_size,
            steps=step,
            timing=self.meter.result(),
            train_logloss=train_loss,
            evaluation=ev,
            params_sha256=digest,
            peak_anon_rss_mb=peak_anon,
            total_rows=p.init.num_rows,
            embedding_dim=p.init.dim,
            cache=p.backend.stats(),
            distributed=p.topo.section(p.backend, self.rows),
            epochs=step / p.pre.stream.batches_per_epoch,
            checkpoints=CheckpointStats.of(writer.history, p.start),
            approximation=_approximation(cfg.approximations, self.skipper, self.rows.stats(), self.step),
            not_exact=p.reporter.not_exact,
            end_of_run_s=end,
            memory=MemoryReport.of(p.backend.fit, watch, watch.stop()),
            spec=cfg.cache.spec,
            slow_store=slow_store(cfg.cache.store, cfg.distributed),
            remote_store=cfg.distributed,
        ).to_json()
