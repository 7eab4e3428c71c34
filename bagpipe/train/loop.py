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

from typing import Callable

import torch

from bagpipe.accel.hotline import hotline_step
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.errors import ConfigError
from bagpipe.models import build_model
from bagpipe.optim.sparse import build_dense_optimizer, build_sparse_optimizer
from bagpipe.store.init import RowInitializer
from bagpipe.train.checkpoint import restore, save_checkpoint
from bagpipe.train.config import TrainConfig
from bagpipe.train.evaluate import evaluate
from bagpipe.train.metrics import RssSampler
from bagpipe.train.progress import Progress
from bagpipe.train.rundir import RunDir, digest_and_save
from bagpipe.train.step import train_step
from bagpipe.train.summary import LOSS_WINDOW, StepMeter, build_summary
from bagpipe.train.topology import SingleProcess, Topology

LOG_EVERY = 10  # steps between metrics.jsonl records (and progress updates)


def train(cfg: TrainConfig, announce: Callable[[str], None] | None = None, topology: Topology | None = None) -> dict | None:
    """Train as configured; returns (and writes) the summary, or None on a process that
    does not report (a data-parallel trainer other than trainer 0).

    ``announce`` receives one-line notices meant for the user before training starts
    (e.g. the auto-tuner's choice); the command line passes ``print``.
    """
    topo = topology if topology is not None else SingleProcess()
    rc = cfg.run
    run = RunDir(rc.out)
    if topo.reports and not rc.resume and (run.path / "checkpoints" / "LATEST").exists():
        raise ConfigError(f"{run.path} already holds a run with checkpoints; pass --resume to continue it or choose another --out")
    if rc.threads:
        torch.set_num_threads(rc.threads)
    dataset = Dataset(cfg.data.data)
    meta = dataset.meta
    stream = BatchStream(dataset, "train", cfg.data.batch_size, seed=rc.seed, block_size=cfg.data.block_size)
    mcfg = cfg.arch.model_config()
    torch.manual_seed(rc.seed)
    model = build_model(mcfg, meta.num_dense, meta.num_features)
    net = topo.wrap(model)
    dense_opt = build_dense_optimizer(cfg.optim.optimizer, cfg.optim.lr, model.parameters())
    sparse_opt = build_sparse_optimizer(cfg.optim.optimizer, cfg.optim.lr)
    init = RowInitializer(meta.table_sizes, mcfg.embedding_dim, rc.seed)
    backend = topo.backend(cfg, init, sparse_opt.state_dim, dataset, stream, announce)
    failed = True
    try:
        start = restore(run.path, model, dense_opt, backend, init) if rc.resume else 0
        if topo.reports:
            run.write_config(cfg.to_json(), mcfg)
        summary = _train(cfg, topo, run, dataset, stream, model, net, dense_opt, sparse_opt, init, backend, start)
        failed = False
        return summary
    finally:
        backend.close(abandon=failed)


def _train(cfg, topo, run, dataset, stream, model, net, dense_opt, sparse_opt, init, backend, start) -> dict | None:
    rc = cfg.run
    rows = topo.row_update(sparse_opt, backend)
    meter = StepMeter(start=start, warmup=rc.warmup_steps, batch_size=cfg.data.batch_size,
                      phases=lambda: backend.phase_seconds() | rows.phase_seconds())
    log = run.metrics() if topo.reports else None
    progress = Progress(topo.progress_kind(rc.progress), total=rc.steps, initial=start,
                        desc=f"train {cfg.arch.model}/{cfg.cache.mode}", say=topo.say)
    rss = RssSampler()

    def checkpoint(step: int, chunks=None) -> None:
        """Save the run; the store must hold every row (``chunks`` defaults to a fresh export)."""
        dense = {"step": step, "model": model.state_dict(), "dense_optimizer": dense_opt.state_dict(), "torch_rng": torch.get_rng_state()}
        save_checkpoint(run.path, step, dense, backend.export() if chunks is None else chunks, init.num_rows, init.dim, sparse_opt.state_dim)

    def settle(step: int) -> None:
        """Every row final and in the store (for an evaluation or a checkpoint mid-run)."""
        rows.finish()
        backend.flush(step)

    run_step = hotline_step if cfg.cache.mode == "hotline" else train_step  # Hotline: two micro-batches a step
    step = start
    try:
        for inp in backend.steps(stream, start, rc.steps, before_evict=rows.before_evict):
            loss = run_step(net, dense_opt, rows, inp, meter.times)
            backend.after_step(inp)  # its copy-out time is in the executor's "writeback"
            step = inp.step + 1
            meter.record(step, loss)
            progress.advance()
            if step % LOG_EVERY == 0 or step == rc.steps or step == start + 1:
                recent = topo.mean(meter.losses[-LOG_EVERY:])  # every trainer takes part
                sps = meter.samples_per_s()
                progress.show(step, recent, sps)
                if log is not None:
                    log.write(step=step, loss=recent, samples_per_s=sps)
            if rc.eval_every and step % rc.eval_every == 0 and step < rc.steps:
                settle(step)
                if topo.reports:
                    ev = evaluate(model, backend.lookup, dataset, cfg.data.batch_size, rc.eval_samples)
                    log.write(step=step, **ev)
                    progress.note(f"step {step}: eval logloss {ev['eval_logloss']:.4f}, eval AUC {ev['eval_auc']:.4f}"
                                  if ev["eval_auc"] is not None else f"step {step}: no eval split")
            if rc.checkpoint_every and step % rc.checkpoint_every == 0 and step < rc.steps:
                settle(step)
                if topo.reports:
                    checkpoint(step)
        rows.finish()
        meter.stop()
        progress.close()
        train_loss = topo.mean(meter.losses[-LOSS_WINDOW:]) if meter.losses else None
        backend.finish()
        peak_anon = rss.stop()
        if not topo.reports:
            return None
        ev = evaluate(model, backend.lookup, dataset, cfg.data.batch_size, rc.eval_samples)
        log.write(step=step, **ev)
        save = (lambda chunks: checkpoint(step, chunks)) if rc.final_checkpoint else None
        digest = digest_and_save(model, backend.export(), digest=rc.digest, save=save)
        summary = build_summary(
            mode=cfg.cache.mode, model=cfg.arch.model, optimizer=cfg.optim.optimizer, batch_size=cfg.data.batch_size,
            steps=step, timing=meter.result(), train_logloss=train_loss, evaluation=ev, params_sha256=digest,
            peak_anon_rss_mb=peak_anon, total_rows=init.num_rows, embedding_dim=init.dim,
            cache=backend.stats(), distributed=topo.section(backend, rows),
        )
        run.write_summary(summary, also=rc.summary_json)
        return summary
    finally:
        rss.stop()
        progress.close()
        if log is not None:
            log.close()
