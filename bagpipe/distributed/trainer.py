"""A data-parallel trainer: dense model under DDP, embedding rows in a partitioned cache.

Each step: take the next plan (its rows already fetched from the embedding servers by
the prefetch pipeline), run forward/backward on this trainer's 1/N slice of the global
batch (DDP averages the dense gradients), then :func:`sync_and_update` averages the
synchronised embedding rows' gradients and updates every row; expired rows go back to
the servers in the background. Trainer 0 also evaluates, computes params_sha256 over
the servers' rows, writes the final checkpoint and the summary.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bagpipe.cache.pipeline import PlanExecutor
from bagpipe.cache.slots import SlotCache
from bagpipe.cache.sync import sync_and_update
from bagpipe.data.shards import Dataset
from bagpipe.distributed.layout import Layout
from bagpipe.distributed.oracle_role import PlanReceiver
from bagpipe.distributed.partition import TrainerPlan
from bagpipe.distributed.server import RemoteStore, setup_message
from bagpipe.distributed.transport import CONTROL, Transport
from bagpipe.models import build_model
from bagpipe.models.embedding import gather_rows
from bagpipe.optim.sparse import SparseOptimizer, build_dense_optimizer, build_sparse_optimizer
from bagpipe.store.init import RowInitializer
from bagpipe.train.backends import store_lookup
from bagpipe.train.checkpoint import save_checkpoint
from bagpipe.train.config import TrainConfig
from bagpipe.train.loop import digest_and_save, evaluate, write_run_config, write_summary
from bagpipe.train.metrics import RssSampler, current_rss_mb, peak_rss_mb
from bagpipe.train.step import forward_logits


def data_parallel_step(
    net: torch.nn.Module,
    dense_opt: torch.optim.Optimizer,
    sparse_opt: SparseOptimizer,
    cache: SlotCache,
    plan: TrainerPlan,
    group,
    times: dict,
    pending: list,
) -> tuple[float, int]:
    """One step on this trainer's slice; returns (loss, bytes all-reduced for embeddings).

    The same float operations as :func:`bagpipe.train.step.train_step` on the slice,
    plus the gradient averaging of :mod:`bagpipe.cache.sync`. ``pending`` holds the
    previous step's deferred synchronisation (at most one), which has overlapped this
    step's forward and backward; it is finished here, and this step's takes its place.
    """
    t0 = time.perf_counter()
    slots = torch.from_numpy(plan.slots).to(cache.device)
    batch = plan.batch.to(cache.device)
    rows_u = gather_rows(cache.weights, slots)
    logits = forward_logits(net, rows_u, torch.from_numpy(plan.inverse).to(cache.device), batch)
    loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
    t1 = time.perf_counter()
    dense_opt.zero_grad(set_to_none=True)
    loss.backward()  # DDP all-reduces (averages) the dense gradients here
    t2 = time.perf_counter()
    dense_opt.step()
    finish_pending(pending, times)
    sent, rest = sync_and_update(
        cache, sparse_opt, rows_u.detach(), rows_u.grad, slots,
        torch.from_numpy(plan.sync_slots).to(cache.device), torch.from_numpy(plan.sync_pos).to(cache.device),
        plan.num_trainers, group, urgent=plan.sync_urgent,
    )
    if rest is not None:
        pending.append(rest)
    t3 = time.perf_counter()
    times["forward"] += t1 - t0
    times["backward"] += t2 - t1
    times["optimizer"] += t3 - t2
    return float(loss.detach()), sent


def finish_pending(pending: list, times: dict) -> None:
    """Complete the deferred synchronisation, if any (all-reduce wait + row update)."""
    t0 = time.perf_counter()
    while pending:
        pending.pop().finish()
    times["sync_wait"] = times.get("sync_wait", 0.0) + time.perf_counter() - t0


def run_trainer(cfg: TrainConfig, layout: Layout, rank: int, transport: Transport, group, log) -> dict | None:
    """Train as trainer ``rank``; trainer 0 returns the summary (others None)."""
    N = layout.trainers
    dataset = Dataset(cfg.data)
    meta = dataset.meta
    mcfg = cfg.model_config()
    torch.manual_seed(cfg.seed)
    model = build_model(mcfg, meta.num_dense, meta.num_features)
    net = model
    if N > 1:
        from torch.nn.parallel import DistributedDataParallel

        net = DistributedDataParallel(model, process_group=group)
    dense_opt = build_dense_optimizer(cfg.optimizer, cfg.lr, model.parameters())
    sparse_opt = build_sparse_optimizer(cfg.optimizer, cfg.lr)
    init = RowInitializer(meta.table_sizes, mcfg.embedding_dim, cfg.seed)
    if rank == 0:
        write_run_config(cfg, mcfg)
        for s in layout.server_ranks:
            transport.send(s, CONTROL, setup_message(init, sparse_opt.state_dim))
    store = RemoteStore(init, sparse_opt.state_dim, transport, layout.server_ranks)
    plans = PlanReceiver(transport, layout.oracle_rank)
    cache = SlotCache(plans.info["cache_rows"], init.dim, sparse_opt.state_dim)
    times = dict.fromkeys(("forward", "backward", "optimizer", "sync_wait"), 0.0)
    pending: list = []  # the previous step's deferred synchronisation

    def settle(plan) -> None:
        """Before a plan frees or refills slots: rows still being synchronised must be final."""
        if pending and (pending[0].touches(plan.evict_before_slots) or pending[0].touches(plan.drop_before_slots)):
            finish_pending(pending, times)

    executor = PlanExecutor(store, cache, iter(plans), pipelined=True, depth=cfg.lookahead + 1, before_evict=settle)
    losses, synced = [], []
    rss = RssSampler()
    every = max(1, cfg.steps // 20)
    t_start = time.perf_counter()
    t_measure = t_log = t_start
    step = 0
    try:
        for plan in executor:
            loss, sent = data_parallel_step(net, dense_opt, sparse_opt, cache, plan, group, times, pending)
            executor.after_step(plan)
            losses.append(loss)
            synced.append(sent)
            step = plan.step + 1
            if step == cfg.warmup_steps:
                t_measure = time.perf_counter()
            if rank == 0 and (step % every == 0 or step in (1, cfg.steps) or time.perf_counter() - t_log > 10):
                t_log = time.perf_counter()
                sps = step * cfg.batch_size / max(time.perf_counter() - t_start, 1e-9)
                log(f"step {step}/{cfg.steps}  loss {np.mean(losses[-every:]):.4f}  {sps:,.0f} samples/s")
        finish_pending(pending, times)
        t_end = time.perf_counter()
        # the mean of the slices' mean losses is the global batch's mean loss
        recent = torch.tensor(losses[-50:], dtype=torch.float64)
        if N > 1:
            torch.distributed.all_reduce(recent, group=group)
            recent /= N
        plans.close()
        pipe = executor.times.as_dict()
        if rank == 0:
            executor.flush_cached()  # synchronised rows are equal on every trainer: one writes them
        executor.close()
        store.finish_writes()
        peak_anon = rss.stop()
        if rank != 0:
            store.close()  # goodbye to the servers; after a failure there is none, so they fail too
            return None
        ev = evaluate(model, lambda rows: store_lookup(store, rows), dataset, cfg.batch_size, cfg.eval_samples)
        dense = {"step": step, "model": model.state_dict(), "dense_optimizer": dense_opt.state_dict(), "torch_rng": torch.get_rng_state()}
        digest = digest_and_save(
            cfg, model, store.chunks(),
            lambda rows: save_checkpoint(Path(cfg.out), step, dense, rows, init.num_rows, init.dim, sparse_opt.state_dim),
        )
        measured = step - (cfg.warmup_steps if step > cfg.warmup_steps else 0)
        report = plans.report
        servers = store.server_stats()
        store.close()
        summary = {
            "mode": cfg.mode,
            "model": cfg.model,
            "optimizer": cfg.optimizer,
            "steps": step,
            "samples": step * cfg.batch_size,
            "batch_size": cfg.batch_size,
            "seconds": t_end - t_start,
            "measured_steps": measured,
            "samples_per_s": measured * cfg.batch_size / max(t_end - t_measure, 1e-9),
            "train_logloss": float(recent.mean()) if losses else None,
            **ev,
            "params_sha256": digest,
            "peak_rss_mb": peak_rss_mb(),
            "peak_anon_rss_mb": peak_anon,
            "rss_mb": current_rss_mb(),
            "total_rows": init.num_rows,
            "embedding_dim": init.dim,
            "time_per_step_ms": {k: 1000 * v / max(step, 1) for k, v in (times | pipe).items()},
            "cache": dict(report.plan) | {"cache_rows": report.cache_rows, "lookahead": report.lookahead},
            "distributed": {
                "trainers": N,
                "servers": layout.servers,
                "cache_sync": cfg.cache_sync,
                "sync_bytes_per_step": float(np.mean(synced)) if synced else 0.0,
                "sync_rows_per_step": report.sync_rows / max(step, 1),
                "sync_overlapped_share": 1 - report.sync_urgent_rows / max(report.sync_rows, 1),
                "replicated_sync_rows_per_step": report.replicated_sync_rows / max(step, 1),
                "replicated_sync_bytes_per_step": (report.replicated_sync_rows / max(step, 1)) * init.dim * 4 if N > 1 else 0.0,
                "fetched_rows_per_trainer": report.fetched_rows,
                "plans_in_flight": cfg.plans_in_flight,
                "max_plans_in_flight": report.max_in_flight,
                "oracle_planning_s": report.seconds_planning,
                "servers_report": servers,
                "bytes_sent_by_trainer0": transport.bytes_sent,
                "bytes_received_by_trainer0": transport.bytes_received,
            },
        }
        write_summary(cfg, summary)
        return summary
    finally:
        rss.stop()
        executor.close(abandon=True)  # after success it is closed already

