"""The training loop: one function from a :class:`TrainConfig` to a summary, for every topology.

The loop is written against the declared seams of :mod:`bagpipe.train.protocols` only.
What differs between one process and a data-parallel trainer is a :class:`Topology`
(:mod:`bagpipe.train.topology` for one process, :mod:`bagpipe.distributed.trainer` for
a trainer of a distributed job): which backend holds the rows, how a step updates
them (the row strategy), how the model is wrapped (DDP), how a figure is averaged over
the trainers and whether this process writes the run's files. Everything else --
resuming, the progress line, metrics.jsonl, evaluation, checkpoints, the digest and
summary.json -- is this one piece of code.
"""

from __future__ import annotations

import logging
import time
from typing import Generic

import torch

import bagpipe.phases as phases
from bagpipe.cache.advice import slow_store
from bagpipe.checkpoint import CheckpointFolder, CheckpointWriter, InitialRows, RowSpace
from bagpipe.config.train import TrainConfig
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream, train_stream
from bagpipe.device import on_host, open_device
from bagpipe.faults import pause_at
from bagpipe.memory.device import check_device_budget, device_estimate
from bagpipe.memory.watch import MemoryWatch
from bagpipe.models import build_model
from bagpipe.optim.schedule import set_lr
from bagpipe.optim.sparse import SparseOptimizer
from bagpipe.store.init import RowInitializer
from bagpipe.train.evaluate import eval_line, evaluate
from bagpipe.train.guards import StepGuard
from bagpipe.train.progress import Progress
from bagpipe.train.protocols import B, StepFn, Topology
from bagpipe.train.resume import (
    elastic_restart,
    refuse_overwrite,
    restore_dense,
    resume_point,
)
from bagpipe.train.rundir import RunDir, dense_copy, digest_of
from bagpipe.train.space import check_checkpoint_space
from bagpipe.train.step import STEPS
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
from bagpipe.train.tensorboard import with_tensorboard
from bagpipe.train.topology import SingleProcess

log = logging.getLogger(__name__)

LOG_EVERY = 10  # steps between metrics.jsonl records (and progress updates)


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
        return _start(cfg, topo, RunDir(rc.out))
    with RunDir(rc.out).claim() as run:
        return _start(cfg, topo, run)


def _start(cfg: TrainConfig, topo: Topology[B], run: RunDir) -> dict | None:
    rc = cfg.run
    if rc.threads:
        torch.set_num_threads(rc.threads)
    dataset = Dataset(cfg.data.data)
    # a role restarted by torchrun --max-restarts continues from the latest checkpoint, if any
    resuming = rc.resume or elastic_restart()
    if topo.reports:
        if resuming:
            ckpt = resume_point(run, cfg, dataset, required=rc.resume, complete_ok=elastic_restart())
        else:
            refuse_overwrite(run)
            ckpt = None
        check_checkpoint_space(cfg, dataset)  # before anything is trained: refuse what could not be saved
    else:  # trainers 1..N-1 take the checkpoint trainer 0 checked
        ckpt = CheckpointFolder(run.path).latest() if resuming else None
    meta = dataset.meta
    stream = train_stream(dataset, cfg.data, rc.seed)
    mcfg = cfg.arch.model_config()
    torch.manual_seed(rc.seed)
    # built on the host (the same initial values on every device), then moved
    model = build_model(mcfg, meta.num_dense, meta.num_features).to(topo.device.torch)
    # before any row reaches the device: a run that cannot fit its device budget stops here
    share = stream.batch_size // cfg.dist.trainers if cfg.dist.distributed else None
    check_device_budget(cfg, device_estimate(cfg, meta, sum(p.numel() for p in model.parameters()), share))
    net = topo.wrap(model)
    dense_opt = cfg.optim.dense_optimizer(model.parameters())
    sparse_opt = cfg.optim.sparse_optimizer(mcfg.embedding_dim)
    init = RowInitializer(meta.table_sizes, mcfg.embedding_dim, rc.seed)
    backend = topo.backend(cfg, init, sparse_opt.state_dim, dataset, stream, ckpt)
    phases.mark("ready")
    failed = True
    try:
        start = 0
        if ckpt is not None:
            start = restore_dense(ckpt, model, dense_opt, init, sparse_opt.state_dim)
            topo.restore_rows(ckpt, backend)
            phases.mark("restored")
            if topo.reports:
                log.info(f"resumed from step {start}")
        if topo.reports:  # written by the first step's heartbeat: a refusal before it leaves the folder as it was
            run.write_config_later(
                cfg.to_json(),
                mcfg,
                {
                    "dir": str(dataset.dir),
                    "fingerprint": dataset.fingerprint(),
                    "table_sizes": meta.table_sizes,
                    "num_dense": meta.num_dense,
                },
            )
        run_ = _Run(cfg, topo, run, dataset, stream, model, net, dense_opt, sparse_opt, init, backend, start)
        summary = run_.train()
        failed = False
        return summary
    finally:
        backend.close(abandon=failed)


def _approximation(names: list[str], skipper: StaleSkip | None, row_stats: dict) -> Approximation | None:
    """The summary's ``approximation`` section: None for an exact run."""
    if not names:
        return None
    return Approximation(
        names=names,
        skip_stale=skipper.report() if skipper is not None else None,
        periodic=row_stats.get("periodic"),
    )


class _Run(Generic[B]):
    """One run of the loop, from its first step to its summary (the pieces :func:`train` built);
    ``B``: the topology's backend."""

    def __init__(
        self,
        cfg: TrainConfig,
        topo: Topology[B],
        run: RunDir,
        dataset: Dataset,
        stream: BatchStream,
        model: torch.nn.Module,
        net: torch.nn.Module,
        dense_opt: torch.optim.Optimizer,
        sparse_opt: SparseOptimizer,
        init: RowInitializer,
        backend: B,
        start: int,
    ):
        self.cfg, self.topo, self.run, self.dataset, self.stream = cfg, topo, run, dataset, stream
        self.model, self.net, self.dense_opt, self.sparse_opt = model, net, dense_opt, sparse_opt
        self.init, self.backend, self.start = init, backend, start
        self.rows = topo.row_update(sparse_opt, backend)
        self.schedule = cfg.optim.schedule()
        self.bases = {"lr": cfg.optim.lr, "embedding_lr": cfg.optim.row_lr}
        self.writer = (
            CheckpointWriter(
                CheckpointFolder(run.path),
                cfg.run.checkpoint_compact_every,
                RowSpace(init.num_rows, init.dim, sparse_opt.state_dim, InitialRows(init.seed, init.table_sizes)),
            )
            if topo.reports
            else None
        )

    def checkpoint(self, step: int) -> None:
        """The cut of the checkpoint of ``step`` (every trainer takes part): what it needs is
        copied now, its files are written in the background (:mod:`bagpipe.checkpoint.writer`)."""
        t0 = time.perf_counter()
        writer = self.writer
        if writer is not None:
            writer.wait()  # the previous checkpoint is written (in a run that checkpoints every few minutes: long ago)
        pause_at("cut", step)  # a test changes the world here (fills the disk)
        self.rows.finish()  # deferred row work done: every row final
        target = writer.begin(step) if writer is not None else None
        write_parts = self.topo.checkpoint_cut(step, self.backend, target)
        if writer is None:
            return
        assert target is not None and write_parts is not None
        dense = dense_copy(
            step=step,
            model=on_host(self.model.state_dict()),  # loadable on any machine
            dense_optimizer=on_host(self.dense_opt.state_dict()),
            torch_rng=torch.get_rng_state(),
            lr_schedule=self.schedule.state(step, self.bases),
        )
        writer.submit(target, dense, write_parts, time.perf_counter() - t0)

    def settle(self, step: int) -> None:
        """After ``step`` steps: every row final and in the store (for an evaluation or a
        checkpoint mid-run). Write-back labels are 0-based plan indices: the last plan
        done is ``step - 1``, and announcing any later label would let other trainers'
        reads overtake write-backs that have not happened yet."""
        self.rows.finish()
        self.backend.flush(step - 1)

    def train(self) -> dict | None:
        cfg, topo, run, backend, rows = self.cfg, self.topo, self.run, self.backend, self.rows
        rc, spec, start, stream = cfg.run, cfg.cache.spec, self.start, self.stream
        # Slipstream's watched rows are profiled (full) before the meter starts
        skipper = stale_skip_for(
            cfg.approx,
            spec,
            cfg.hot,
            backend,
            self.dataset,
            train_stream(self.dataset, cfg.data, rc.seed),
            self.init.dim,
            self.sparse_opt.state_dim,
            rc.seed,
        )
        approx = cfg.approximations
        tags = {"exact": False, "approximation": approx} if approx else {}  # every metrics record of an approximate run
        meter = StepMeter(
            start=start,
            warmup=rc.warmup_steps,
            batch_size=cfg.data.batch_size,
            phases=lambda: backend.phase_seconds() | rows.phase_seconds(),
        )
        metrics = with_tensorboard(run.metrics(since=start), rc.tensorboard) if topo.reports else None
        progress = Progress(
            topo.progress_kind(rc.progress),
            total=rc.steps,
            initial=start,
            desc=f"train {cfg.arch.model}/{cfg.cache.mode}",
            quiet=not topo.reports,
        )
        watch = MemoryWatch()  # samples the anonymous memory from here to the end of the run
        schedule, bases = self.schedule, self.bases
        run_step: StepFn = STEPS[spec.step]
        if skipper is not None:  # Slipstream: the stale inputs are left out of the step
            run_step = skipper.wrap(run_step)
        step = start
        guard = StepGuard()
        try:
            for inp in backend.steps(stream, start, rc.steps, before_evict=rows.before_evict):
                # the rows' optimizer scales its own rate by inp.step
                set_lr(self.dense_opt, schedule.lr(cfg.optim.lr, inp.step))
                loss = run_step(self.net, self.dense_opt, rows, inp, meter.times)
                backend.after_step(inp)  # its copy-out time is in the executor's "writeback"
                step = inp.step + 1
                guard.check(
                    step, loss, self.model, inp
                )  # a NaN or infinite loss, gradient or row, or an exploded loss, stops the run here
                meter.record(step, loss)
                if topo.reports:
                    run.heartbeat(step)
                    if step == start + 1:
                        phases.report(run.path)  # a restarted job: where the seconds since the failure went
                progress.advance()
                if step % stream.batches_per_epoch == 0 and step < rc.steps:
                    progress.note(
                        f"epoch {step // stream.batches_per_epoch + 1} begins at step {step + 1} "
                        f"(the train split holds {stream.batches_per_epoch} batches; each epoch reshuffles its blocks)"
                    )
                if step % LOG_EVERY == 0 or step == rc.steps or step == start + 1:
                    watch.mark(step)
                    recent = topo.mean(meter.losses[-LOG_EVERY:])  # every trainer takes part
                    sps = meter.samples_per_s()
                    progress.show(step, recent, sps)
                    if metrics is not None:
                        metrics.write(
                            step=step, loss=recent, samples_per_s=sps, **schedule.rates(step - 1, bases), **tags
                        )
                if rc.eval_every and step % rc.eval_every == 0 and step < rc.steps:
                    self.settle(step)
                    if metrics is not None:
                        ev = evaluate(self.model, backend.lookup, self.dataset, cfg.data.batch_size, rc.eval_samples)
                        metrics.write(step=step, **ev, **tags)
                        progress.note(f"step {step}: {eval_line(ev)}")
                if rc.checkpoint_every and step % rc.checkpoint_every == 0 and step < rc.steps:
                    self.checkpoint(step)  # the cut: its time is in samples_per_s, the write runs meanwhile
            rows.finish()
            meter.stop()
            progress.close()
            end = EndOfRun()
            t_end = time.perf_counter()
            train_loss = topo.mean(meter.losses[-LOSS_WINDOW:]) if meter.losses else None
            backend.finish()
            end.finish = time.perf_counter() - t_end
            if rc.final_checkpoint and step > start:  # (a run restarted after its end has it already)
                t0 = time.perf_counter()
                self.checkpoint(step)  # written while the run evaluates and hashes
                end.checkpoint_cut = time.perf_counter() - t0
            peak_anon = watch.peak()  # the summary's training-time peak; the watch goes on
            if metrics is None:
                return None
            t0 = time.perf_counter()
            ev = evaluate(self.model, backend.lookup, self.dataset, cfg.data.batch_size, rc.eval_samples)
            metrics.write(step=step, **ev, **tags)
            end.evaluation = time.perf_counter() - t0
            t0 = time.perf_counter()
            digest = (
                digest_of(self.model, self.init, self.sparse_opt.state_dim, backend.touched()) if rc.digest else None
            )
            end.digest = time.perf_counter() - t0
            t0 = time.perf_counter()
            assert self.writer is not None
            self.writer.wait()
            end.checkpoint_wait = time.perf_counter() - t0
            end.total = time.perf_counter() - t_end
            summary = Summary.of(
                mode=cfg.cache.mode,
                model=cfg.arch.model,
                device=topo.device.describe(),
                optimizer=cfg.optim.optimizer,
                batch_size=cfg.data.batch_size,
                steps=step,
                timing=meter.result(),
                train_logloss=train_loss,
                evaluation=ev,
                params_sha256=digest,
                peak_anon_rss_mb=peak_anon,
                total_rows=self.init.num_rows,
                embedding_dim=self.init.dim,
                cache=backend.stats(),
                distributed=topo.section(backend, rows),
                epochs=step / stream.batches_per_epoch,
                checkpoints=CheckpointStats.of(self.writer.history, start),
                approximation=_approximation(approx, skipper, rows.stats()),
                end_of_run_s=end,
                memory=MemoryReport.of(backend.fit, watch, watch.stop()),
                spec=spec,
                slow_store=slow_store(cfg.cache.store, cfg.distributed),
            ).to_json()
            if summary["advice"]:
                log.info(f"advice: {summary['advice']}")
            run.write_summary(summary, also=rc.summary_json)
            return summary
        except BaseException:
            if self.writer is not None:
                self.writer.close(abandon=True)  # the run failed: its last complete checkpoint is what survives
            raise
        finally:
            watch.stop()
            progress.close()
            if metrics is not None:
                metrics.close()
