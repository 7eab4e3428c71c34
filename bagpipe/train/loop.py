"""The training loop: one function from a :class:`TrainConfig` to a summary, for every topology.

What differs between one process and a data-parallel trainer is a :class:`Topology`
(:mod:`bagpipe.train.topology` for one process, :mod:`bagpipe.distributed.trainer` for
a trainer of a distributed job): which backend holds the rows, how a step updates
them (the row strategy), how the model is wrapped (DDP), how a figure is averaged over
the trainers and whether this process writes the run's files. Everything else --
resuming, the progress line, metrics.jsonl, evaluation, checkpoints, the digest and
summary.json -- is this one piece of code.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from bagpipe.accel.hotline import hotline_step
from bagpipe.accel.slipstream import stale_skip_for
from bagpipe.checkpoint import CheckpointFolder
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.models import build_model
from bagpipe.optim.schedule import set_lr
from bagpipe.store.init import RowInitializer
from bagpipe.train.config import TrainConfig
from bagpipe.train.evaluate import eval_line, evaluate
from bagpipe.train.guards import check_step
from bagpipe.train.metrics import RssSampler
from bagpipe.train.progress import Progress
from bagpipe.train.resume import (
    elastic_restart,
    refuse_overwrite,
    restore_dense,
    resume_point,
)
from bagpipe.train.rundir import RunDir, digest_of
from bagpipe.train.step import train_step
from bagpipe.train.summary import LOSS_WINDOW, StepMeter, build_summary
from bagpipe.train.tensorboard import with_tensorboard
from bagpipe.train.topology import SingleProcess, Topology

LOG_EVERY = 10  # steps between metrics.jsonl records (and progress updates)


def train(cfg: TrainConfig, announce: Callable[[str], None] | None = None, topology: Topology | None = None) -> dict | None:
    """Train as configured; returns (and writes) the summary, or None on a process that
    does not report (a data-parallel trainer other than trainer 0).

    ``announce`` receives one-line notices meant for the user before training starts
    (the auto-tuner's choice, ``resumed from step N``); the command line passes ``print``.

    Start-up checks everything before the run folder changes: the folder is locked
    (one run per folder), the data set's files are checked, a resumed run must
    continue what the folder holds; if start-up fails in a folder this call created,
    the folder is removed again.
    """
    topo = topology if topology is not None else SingleProcess()
    say = announce or (lambda line: None)
    rc = cfg.run
    if not topo.reports:  # trainers 1..N-1 write nothing to the run folder
        return _start(cfg, topo, RunDir(rc.out), say)
    with RunDir(rc.out).claim() as run:
        return _start(cfg, topo, run, say)


def _start(cfg: TrainConfig, topo: Topology, run: RunDir, say: Callable[[str], None]) -> dict | None:
    rc = cfg.run
    if rc.threads:
        torch.set_num_threads(rc.threads)
    dataset = Dataset(cfg.data.data)
    # a role restarted by torchrun --max-restarts continues from the latest checkpoint, if any
    resuming = rc.resume or elastic_restart()
    if topo.reports:
        ckpt = resume_point(run, cfg, dataset, required=rc.resume) if resuming else refuse_overwrite(run)
    else:  # trainers 1..N-1 take the checkpoint trainer 0 checked
        ckpt = CheckpointFolder(run.path).latest() if resuming else None
    meta = dataset.meta
    stream = BatchStream(dataset, "train", cfg.data.batch_size, seed=rc.seed, block_size=cfg.data.block_size)
    mcfg = cfg.arch.model_config()
    torch.manual_seed(rc.seed)
    model = build_model(mcfg, meta.num_dense, meta.num_features)
    net = topo.wrap(model)
    dense_opt = cfg.optim.dense_optimizer(model.parameters())
    sparse_opt = cfg.optim.sparse_optimizer(mcfg.embedding_dim)
    init = RowInitializer(meta.table_sizes, mcfg.embedding_dim, rc.seed)
    backend = topo.backend(cfg, init, sparse_opt.state_dim, dataset, stream, say, ckpt)
    failed = True
    try:
        start = 0
        if ckpt is not None:
            start = restore_dense(ckpt, model, dense_opt, init, sparse_opt.state_dim)
            topo.restore_rows(ckpt, backend)
            say(f"resumed from step {start}")
        if topo.reports:  # written by the first step's heartbeat: a refusal before it leaves the folder as it was
            run.write_config_later(cfg.to_json(), mcfg, {"dir": str(dataset.dir), "fingerprint": dataset.fingerprint(),
                                                         "table_sizes": meta.table_sizes, "num_dense": meta.num_dense})
        summary = _train(cfg, topo, run, dataset, stream, model, net, dense_opt, sparse_opt, init, backend, start)
        failed = False
        return summary
    finally:
        backend.close(abandon=failed)


def _approximation(names: list[str], skipper, row_stats: dict) -> dict | None:
    """The summary's ``approximation`` section: None for an exact run."""
    if not names:
        return None
    out: dict = {"names": names}
    if skipper is not None:
        out["skip_stale"] = skipper.report()
    if "periodic" in row_stats:
        out["periodic"] = row_stats["periodic"]
    return out


def _train(cfg, topo, run, dataset, stream, model, net, dense_opt, sparse_opt, init, backend, start) -> dict | None:
    rc = cfg.run
    rows = topo.row_update(sparse_opt, backend)
    # Slipstream's watched rows are profiled (full) before the meter starts
    skipper = stale_skip_for(cfg, backend, dataset, init.dim, sparse_opt.state_dim, topo.say if topo.reports else None)
    approx = cfg.approximations
    tags = {"exact": False, "approximation": approx} if approx else {}  # every metrics record of an approximate run
    meter = StepMeter(start=start, warmup=rc.warmup_steps, batch_size=cfg.data.batch_size,
                      phases=lambda: backend.phase_seconds() | rows.phase_seconds())
    log = with_tensorboard(run.metrics(since=start), rc.tensorboard) if topo.reports else None
    progress = Progress(topo.progress_kind(rc.progress), total=rc.steps, initial=start,
                        desc=f"train {cfg.arch.model}/{cfg.cache.mode}", say=topo.say if topo.reports else None)
    rss = RssSampler()
    schedule, bases = cfg.optim.schedule(), {"lr": cfg.optim.lr, "embedding_lr": cfg.optim.row_lr}

    saved = {"written": 0, "full": 0, "seconds": 0.0, "bytes": 0, "last_step": start if start else None}

    def checkpoint(step: int) -> None:
        """Save the run (every trainer takes part; the store must hold every row)."""
        t0 = time.perf_counter()
        dense = {"step": step, "model": model.state_dict(), "dense_optimizer": dense_opt.state_dict(), "torch_rng": torch.get_rng_state(),
                 "lr_schedule": schedule.state(step, bases)}
        m = topo.checkpoint(run.path, step, dense, backend, rc.checkpoint_compact_every)
        if m is not None:
            saved.update(written=saved["written"] + 1, full=saved["full"] + (m.kind == "full"), last_step=step,
                         bytes=saved["bytes"] + sum(p.bytes for p in m.parts),
                         seconds=saved["seconds"] + time.perf_counter() - t0)

    def settle(step: int) -> None:
        """After ``step`` steps: every row final and in the store (for an evaluation or a
        checkpoint mid-run). Write-back labels are 0-based plan indices: the last plan
        done is ``step - 1``, and announcing any later label would let other trainers'
        reads overtake write-backs that have not happened yet."""
        rows.finish()
        backend.flush(step - 1)

    run_step = hotline_step if cfg.cache.mode == "hotline" else train_step  # Hotline: two micro-batches a step
    if skipper is not None:  # Slipstream: the stale inputs are left out of the step
        run_step = skipper.wrap(run_step)
    step = start
    try:
        for inp in backend.steps(stream, start, rc.steps, before_evict=rows.before_evict):
            set_lr(dense_opt, schedule.lr(cfg.optim.lr, inp.step))  # the rows' optimizer scales its own by inp.step
            loss = run_step(net, dense_opt, rows, inp, meter.times)
            backend.after_step(inp)  # its copy-out time is in the executor's "writeback"
            step = inp.step + 1
            check_step(step, loss, model, inp)  # a NaN or infinite loss, gradient or row stops the run here
            meter.record(step, loss)
            if topo.reports:
                run.heartbeat(step)
            progress.advance()
            if step % stream.batches_per_epoch == 0 and step < rc.steps:
                progress.note(f"epoch {step // stream.batches_per_epoch + 1} begins at step {step + 1} "
                              f"(the train split holds {stream.batches_per_epoch} batches; each epoch reshuffles its blocks)")
            if step % LOG_EVERY == 0 or step == rc.steps or step == start + 1:
                recent = topo.mean(meter.losses[-LOG_EVERY:])  # every trainer takes part
                sps = meter.samples_per_s()
                progress.show(step, recent, sps)
                if log is not None:
                    log.write(step=step, loss=recent, samples_per_s=sps, **schedule.rates(step - 1, bases), **tags)
            if rc.eval_every and step % rc.eval_every == 0 and step < rc.steps:
                settle(step)
                if topo.reports:
                    ev = evaluate(model, backend.lookup, dataset, cfg.data.batch_size, rc.eval_samples)
                    log.write(step=step, **ev, **tags)
                    progress.note(f"step {step}: {eval_line(ev)}")
            if rc.checkpoint_every and step % rc.checkpoint_every == 0 and step < rc.steps:
                settle(step)  # part of the checkpoint's cost: its time is in samples_per_s
                checkpoint(step)
        rows.finish()
        meter.stop()
        progress.close()
        train_loss = topo.mean(meter.losses[-LOSS_WINDOW:]) if meter.losses else None
        backend.finish()
        if rc.final_checkpoint:
            checkpoint(step)
        peak_anon = rss.stop()
        if not topo.reports:
            return None
        ev = evaluate(model, backend.lookup, dataset, cfg.data.batch_size, rc.eval_samples)
        log.write(step=step, **ev, **tags)
        digest = digest_of(model, backend.export()) if rc.digest else None
        summary = build_summary(
            mode=cfg.cache.mode, model=cfg.arch.model, optimizer=cfg.optim.optimizer, batch_size=cfg.data.batch_size,
            steps=step, timing=meter.result(), train_logloss=train_loss, evaluation=ev, params_sha256=digest,
            peak_anon_rss_mb=peak_anon, total_rows=init.num_rows, embedding_dim=init.dim,
            cache=backend.stats(), distributed=topo.section(backend, rows),
            epochs=step / stream.batches_per_epoch, checkpoints=saved,
            approximation=_approximation(approx, skipper, rows.stats()),
        )
        run.write_summary(summary, also=rc.summary_json)
        return summary
    finally:
        rss.stop()
        progress.close()
        if log is not None:
            log.close()
