"""The training loop: one function from a TrainConfig to a summary dict."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.errors import CheckpointError, ConfigError
from bagpipe.models import build_model
from bagpipe.optim.sparse import build_dense_optimizer, build_sparse_optimizer
from bagpipe.store.init import RowInitializer
from bagpipe.train.backends import CachedBackend, FullBackend
from bagpipe.train.checkpoint import load_latest, save_checkpoint
from bagpipe.train.config import TrainConfig
from bagpipe.train.metrics import RssSampler, current_rss_mb, log_loss, peak_rss_mb, roc_auc
from bagpipe.train.step import forward_logits, train_step

TIME_KEYS = ("wait_embeddings", "forward", "backward", "optimizer", "writeback")


def make_store(cfg: TrainConfig, init: RowInitializer, state_dim: int):
    if cfg.store == "memory":
        from bagpipe.store.memory import MemoryStore

        return MemoryStore(init, state_dim)
    from bagpipe.store.disk import DiskStore

    if cfg.store_dir:  # a user-given store is opened as it is: its rows are the starting tables
        return DiskStore(init, state_dim, cfg.store_dir)
    path = Path(cfg.out) / "store"
    if path.exists():  # the run's own store: a fresh or resumed run rebuilds it from scratch / the checkpoint
        shutil.rmtree(path)
    return DiskStore(init, state_dim, path)


def cache_rows_for(cfg: TrainConfig, total_rows: int, lookups: int) -> int:
    """--cache-rows, else 5% of all rows, but never less than what one batch can touch."""
    return cfg.cache_rows or int(min(total_rows, max(math.ceil(0.05 * total_rows), lookups)))


def autotune(cfg: TrainConfig, init: RowInitializer, state_dim: int, stream: BatchStream):
    """The auto-tuner's choice for ``cfg.cache_budget_mb`` (None when off or the mode has no cache)."""
    if not (cfg.cache_budget_mb > 0 and cfg.mode in ("lru", "lookahead")):
        return None
    from bagpipe.oracle.autotune import choose

    return choose(
        cfg.cache_budget_mb, init.num_rows, init.dim, state_dim, stream.batch, cfg.steps,
        tune_lookahead=cfg.mode == "lookahead",
    )


def make_backend(cfg: TrainConfig, init: RowInitializer, state_dim: int, lookups_per_batch: int, tuned=None):
    """The backend of ``cfg.mode``; ``tuned`` (an AutotuneChoice) overrides cache rows and L."""
    if cfg.mode == "full":
        return FullBackend(init, state_dim)
    store = make_store(cfg, init, state_dim)
    lookahead = cfg.lookahead
    if cfg.mode == "nocache":
        cache_rows = lookups_per_batch  # a staging area for one batch
    elif tuned is not None:
        cache_rows = tuned.cache_rows
        lookahead = tuned.lookahead or cfg.lookahead
    else:
        cache_rows = cache_rows_for(cfg, init.num_rows, lookups_per_batch)
    return CachedBackend(cfg.mode, store, cache_rows, lookahead=lookahead)


def dense_digest(model: torch.nn.Module):
    """A sha256 started over every dense parameter (by name); feed it the rows with :func:`hashed`.

    The finished digest (params_sha256) covers every dense parameter, every embedding
    row and its optimizer state, in global row order.
    """
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h


def hashed(rows, h):
    """Pass (start, weights, state) chunks through while adding them to digest ``h``."""
    for a, w, s in rows:
        h.update(np.ascontiguousarray(w, dtype=np.float32).tobytes())
        h.update(np.ascontiguousarray(s, dtype=np.float32).tobytes())
        yield a, w, s


@torch.no_grad()
def evaluate(model: torch.nn.Module, lookup, dataset: Dataset, batch_size: int, max_samples: int = 0) -> dict:
    """Log loss and AUC on the eval split; ``lookup(rows) -> (U, D)`` reads embedding rows."""
    if not dataset.has_split("eval"):
        return {"eval_logloss": None, "eval_auc": None, "eval_samples": 0}
    stream = BatchStream(dataset, "eval", batch_size, shuffle=False, drop_last=False)
    model.eval()
    labels, probs = [], []
    seen = 0
    for batch in stream.batches():
        uniq, inverse = torch.unique(batch.rows, sorted=True, return_inverse=True)
        logits = forward_logits(model, lookup(uniq), inverse, batch)
        labels.append(batch.labels.numpy())
        probs.append(torch.sigmoid(logits).numpy())
        seen += batch.batch_size
        if max_samples and seen >= max_samples:
            break
    model.train()
    y, p = np.concatenate(labels), np.concatenate(probs)
    if max_samples:
        y, p = y[:max_samples], p[:max_samples]
    return {"eval_logloss": log_loss(y, p), "eval_auc": roc_auc(y, p), "eval_samples": int(len(y))}


def digest_and_save(cfg: TrainConfig, model: torch.nn.Module, rows, save: Callable) -> str | None:
    """One pass over every (start, weights, state) chunk of ``rows`` feeds both
    params_sha256 (if ``cfg.digest``) and the final checkpoint (``save(rows)``, if
    ``cfg.save_final``); returns the digest or None."""
    h = dense_digest(model) if cfg.digest else None
    rows = rows if h is None else hashed(rows, h)
    if cfg.save_final:
        save(rows)
    elif h is not None:
        for _ in rows:
            pass
    return h.hexdigest() if h is not None else None


def write_run_config(cfg: TrainConfig, mcfg) -> None:
    """RUN/config.json: the run's settings and model, what ``bagpipe eval`` rebuilds the model from."""
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    (Path(cfg.out) / "config.json").write_text(json.dumps({"train": cfg.to_json(), "model": dataclasses.asdict(mcfg)}, indent=2))


def write_summary(cfg: TrainConfig, summary: dict) -> None:
    """RUN/summary.json, and --summary-json if given."""
    text = json.dumps(summary, indent=2)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    (Path(cfg.out) / "summary.json").write_text(text)
    if cfg.summary_json:
        Path(cfg.summary_json).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.summary_json).write_text(text)


class MetricsLog:
    """Appends one JSON object per line to RUN/metrics.jsonl."""

    def __init__(self, path: Path):
        self.f = open(path, "a")

    def write(self, **record) -> None:
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def train(cfg: TrainConfig, announce: Callable[[str], None] | None = None) -> dict:
    """Train as configured; returns (and writes) the summary.

    ``announce`` receives one-line notices meant for the user before training starts
    (today: the auto-tuner's choice); the command line passes ``print``.
    """
    out = Path(cfg.out)
    if not cfg.resume and (out / "checkpoints" / "LATEST").exists():
        raise ConfigError(f"{out} already holds a run with checkpoints; pass --resume to continue it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dataset = Dataset(cfg.data)
    meta = dataset.meta
    stream = BatchStream(dataset, "train", cfg.batch_size, seed=cfg.seed, block_size=cfg.block_size)
    mcfg = cfg.model_config()
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg, meta.num_dense, meta.num_features)
    dense_opt = build_dense_optimizer(cfg.optimizer, cfg.lr, model.parameters())
    sparse_opt = build_sparse_optimizer(cfg.optimizer, cfg.lr)
    init = RowInitializer(meta.table_sizes, mcfg.embedding_dim, cfg.seed)
    lookups = lookups_per_batch(cfg, meta, stream)
    tuned = autotune(cfg, init, sparse_opt.state_dim, stream)
    if tuned is not None and announce is not None:
        announce(tuned.line())
    backend = make_backend(cfg, init, sparse_opt.state_dim, lookups, tuned)

    start = 0
    if cfg.resume:
        ckpt = load_latest(out)
        if ckpt is None:
            raise CheckpointError(f"{out}: --resume given but the run has no checkpoint")
        if ckpt.weights().shape != (init.num_rows, init.dim):
            raise CheckpointError(
                f"{ckpt.path}: holds {ckpt.weights().shape[0]} rows of dim {ckpt.weights().shape[1]}, "
                f"this run has {init.num_rows} rows of dim {init.dim}"
            )
        try:
            model.load_state_dict(ckpt.dense["model"])
            dense_opt.load_state_dict(ckpt.dense["dense_optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:
            first = str(e).strip().splitlines()[0]
            raise CheckpointError(f"{ckpt.path}: does not match this run's model/optimizer ({first})") from None
        torch.set_rng_state(ckpt.dense["torch_rng"])
        for a, w, s in ckpt.rows():
            backend.load_rows(a, w, s)
        start = ckpt.step
    write_run_config(cfg, mcfg)
    log = MetricsLog(out / "metrics.jsonl")

    def checkpoint(step: int, rows=None) -> None:
        """Save the run; the store must be flushed. ``rows`` defaults to a fresh export."""
        dense = {"step": step, "model": model.state_dict(), "dense_optimizer": dense_opt.state_dict(), "torch_rng": torch.get_rng_state()}
        rows = backend.export() if rows is None else rows
        save_checkpoint(out, step, dense, rows, init.num_rows, init.dim, sparse_opt.state_dim)

    times = dict.fromkeys(TIME_KEYS, 0.0)
    losses: list[float] = []
    rss = RssSampler()
    t_measure = None  # start of the measured (post-warm-up) steps
    bar = tqdm(total=cfg.steps, initial=start, desc=f"train {cfg.model}/{cfg.mode}", unit="step", disable=not cfg.progress, dynamic_ncols=True)
    t_start = time.perf_counter()
    step = start
    try:
        for inp in backend.steps(stream, start, cfg.steps):
            loss = train_step(model, dense_opt, sparse_opt, inp, times)
            backend.after_step(inp)  # its copy-out time is in the executor's "writeback"
            losses.append(loss)
            step = inp.step + 1
            if step - start == cfg.warmup_steps:
                t_measure = time.perf_counter()
                times_at_warmup = dict(times)
                pipe_at_warmup = _pipeline_times(backend)
            bar.update(1)
            if step % 10 == 0 or step == cfg.steps:
                elapsed = time.perf_counter() - t_start
                sps = (step - start) * cfg.batch_size / max(elapsed, 1e-9)
                bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", samples_s=f"{sps:,.0f}")
                log.write(step=step, loss=float(np.mean(losses[-10:])), samples_per_s=sps)
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
                backend.flush()
                ev = evaluate(model, backend.lookup, dataset, cfg.batch_size, cfg.eval_samples)
                log.write(step=step, **ev)
            if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.steps:
                backend.flush()
                checkpoint(step)
        t_end = time.perf_counter()
        bar.close()
        trained = step - start
        if t_measure is None:  # warm-up longer than the run (only when resuming near the end)
            t_measure, times_at_warmup, pipe_at_warmup = t_start, dict.fromkeys(TIME_KEYS, 0.0), {}
        measured = trained - (cfg.warmup_steps if trained > cfg.warmup_steps else 0)
        pipe = _pipeline_times(backend)
        for k in ("wait_embeddings", "writeback"):
            times[k] += pipe.get(k, 0.0)
            times_at_warmup[k] += pipe_at_warmup.get(k, 0.0)
        step_times = {k: 1000 * (times[k] - times_at_warmup[k]) / max(measured, 1) for k in TIME_KEYS}
        elapsed = t_end - t_measure
        peak_anon = rss.stop()
        backend.flush()
        ev = evaluate(model, backend.lookup, dataset, cfg.batch_size, cfg.eval_samples)
        log.write(step=step, **ev)
        digest = digest_and_save(cfg, model, backend.export(), lambda rows: checkpoint(step, rows))
        summary = {
            "mode": cfg.mode,
            "model": cfg.model,
            "optimizer": cfg.optimizer,
            "steps": step,
            "steps_this_run": trained,
            "samples": trained * cfg.batch_size,
            "batch_size": cfg.batch_size,
            "seconds": t_end - t_start,
            "measured_steps": measured,
            "samples_per_s": measured * cfg.batch_size / max(elapsed, 1e-9),
            "train_logloss": float(np.mean(losses[-50:])) if losses else None,
            **ev,
            "params_sha256": digest,
            "peak_rss_mb": peak_rss_mb(),
            "peak_anon_rss_mb": peak_anon,
            "rss_mb": current_rss_mb(),
            "total_rows": init.num_rows,
            "embedding_dim": init.dim,
            "time_per_step_ms": step_times,
            "cache": backend.stats(),
        }
        if cfg.mode != "full":
            summary["cache"]["lookahead"] = backend.lookahead if cfg.mode == "lookahead" else None
        if tuned is not None:
            summary["cache"]["autotune"] = tuned.as_dict()
        write_summary(cfg, summary)
        return summary
    finally:
        rss.stop()
        bar.close()
        log.close()
        backend.close()


def _pipeline_times(backend) -> dict:
    if isinstance(backend, CachedBackend) and backend.executor is not None:
        return backend.executor.times.as_dict()
    return {}


def lookups_per_batch(cfg: TrainConfig, meta, stream: BatchStream) -> int:
    """Upper bound of lookups per batch: B*F for one-hot data; multi-hot data scans the
    first epoch's batches."""
    lookups = cfg.batch_size * meta.num_features
    if meta.multihot_features:
        for i in range(min(stream.batches_per_epoch, cfg.steps)):
            lookups = max(lookups, int(stream.batch(i).rows.shape[0]))
    return lookups

