"""A data-parallel trainer: the training loop with the :class:`DataParallel` topology.

Each step: take the next plan (its rows already fetched from the embedding servers by
the prefetch pipeline), run forward/backward on this trainer's 1/N slice of the global
batch (DDP averages the dense gradients), then the row strategy
(:class:`bagpipe.cache.sync.SyncedRowUpdate`) averages the synchronised embedding
rows' gradients and updates every row; expired rows go back to the servers in the
background. Trainer 0 also evaluates, computes params_sha256 over the servers' rows,
writes the final checkpoint, metrics.jsonl and summary.json -- through the same loop
code as a one-process run (:func:`bagpipe.train.loop.train`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import torch

from bagpipe.accel.profile import HotSet
from bagpipe.cache.periodic import PeriodicRowUpdate
from bagpipe.cache.sync import SyncedRowUpdate
from bagpipe.checkpoint import Checkpoint, CheckpointFolder, Manifest, Part
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.distributed.layout import Layout
from bagpipe.distributed.oracle_role import PlanReceiver
from bagpipe.distributed.server import RemoteStore, setup_message
from bagpipe.distributed.transport import CONTROL, Transport
from bagpipe.faults import pause_at
from bagpipe.optim.sparse import SparseOptimizer
from bagpipe.oracle.plan import Plan
from bagpipe.store.init import RowInitializer
from bagpipe.train.backends import CachedBackend
from bagpipe.train.config import TrainConfig
from bagpipe.train.loop import train
from bagpipe.train.progress import ProgressKind


class RemotePlans:
    """The plan source of a trainer: its part of every global plan, from the oracle role."""

    def __init__(self, receiver: PlanReceiver):
        self.receiver = receiver
        # the baselines' plans (lru, nocache) depend on the previous step: executed synchronously
        self.pipelined = bool(receiver.info["pipelined"])
        self.lookahead = int(receiver.info["lookahead"]) if self.pipelined else None

    def plans(self, stream: BatchStream, start: int, stop: int) -> Iterator[Plan]:
        yield from self.receiver
        self.receiver.close()  # the end of the stream: the oracle may stop waiting for credits

    def stats(self) -> dict:
        report = self.receiver.report
        return dict(report.plan) if report is not None else {}


class DataParallel:
    """Trainer ``rank`` of a job laid out as ``layout`` (see :class:`bagpipe.train.topology.Topology`)."""

    def __init__(self, layout: Layout, rank: int, transport: Transport, group, log: Callable[[str], None]):
        self.layout, self.rank, self.t, self.group, self.log = layout, rank, transport, group, log
        self.reports = rank == 0
        self.store: RemoteStore | None = None
        self.plans: RemotePlans | None = None
        self.sync_period = 0  # K of --cache-sync periodic:K (0: the exact caches)

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.layout.trainers == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, process_group=self.group)

    def backend(self, cfg: TrainConfig, init: RowInitializer, state_dim: int, dataset: Dataset,
                stream: BatchStream, announce, ckpt: Checkpoint | None = None) -> CachedBackend:
        if self.rank == 0:  # the servers learn the row space (and where to restore from) from trainer 0
            restore = str(ckpt.path) if ckpt is not None else None
            for s in self.layout.server_ranks:
                self.t.send(s, CONTROL, setup_message(init, state_dim, restore))
        self.sync_period = cfg.dist.sync_period
        self.store = RemoteStore(init, state_dim, self.t, self.layout.server_ranks)
        self.plans = RemotePlans(PlanReceiver(self.t, self.layout.oracle_rank))
        info = self.plans.receiver.info
        hot = HotSet(info["hot"]["rows"], init.num_rows, info["hot"]["report"]) if info.get("hot") else None
        backend = CachedBackend(self.store, int(info["cache_rows"]), self.plans, writes_cached=self.rank == 0, hot=hot)
        if info.get("autotune") is not None:
            backend.extra_stats["autotune"] = info["autotune"]
        return backend

    def restore_rows(self, ckpt: Checkpoint, backend: CachedBackend) -> None:
        """Nothing here: each server restored its own rows at start-up (no process funnels every row)."""

    def checkpoint(self, run_dir: Path, step: int, dense: dict, backend: CachedBackend, compact_every: int) -> Manifest | None:
        """A cut at step ``step``: every trainer asks every server for its part (a server
        writes once all trainers asked, so every write-back before the cut is in); trainer
        0 names the folder and the kind, writes dense.pt meanwhile, and commits."""
        if self.rank != 0:
            self.store.checkpoint({"op": "checkpoint", "step": step})
            return None
        folder = CheckpointFolder(run_dir)
        staging = folder.begin(step)
        kind, base, chain = folder.next_kind(compact_every)
        request = {"op": "checkpoint", "step": step, "dir": str(staging.resolve()), "kind": kind}
        parts = self.store.checkpoint(request, meanwhile=lambda: folder.write_dense(staging, dense))
        pause_at("commit", step)
        s = self.store
        m = Manifest(step=step, num_rows=s.num_rows, dim=s.dim, state_dim=s.state_dim, kind=kind, base=base,
                     parts=[Part(**p) for p in parts], chain=chain)
        folder.commit(staging, m)
        return m

    def row_update(self, opt: SparseOptimizer, backend: CachedBackend) -> SyncedRowUpdate | PeriodicRowUpdate:
        if self.sync_period:  # cDLRM's periodic averaging (an approximation)
            return PeriodicRowUpdate(opt, backend.cache, self.sync_period, self.layout.trainers, self.group)
        return SyncedRowUpdate(opt, backend.cache, self.group)

    def mean(self, values: list[float]) -> float:
        """The mean of the slices' mean losses is the global batch's mean loss."""
        t = torch.tensor(values, dtype=torch.float64)
        if self.layout.trainers > 1:
            torch.distributed.all_reduce(t, group=self.group)
            t /= self.layout.trainers
        return float(t.mean())

    def progress_kind(self, progress: bool) -> ProgressKind:
        return "lines" if self.rank == 0 else "off"

    def say(self, line: str) -> None:
        self.log(line)

    def section(self, backend: CachedBackend, rows: SyncedRowUpdate | PeriodicRowUpdate) -> dict:
        N, dim = self.layout.trainers, backend.store.dim
        report = self.plans.receiver.report
        steps = max(report.plan.get("steps", 0), 1)
        return {
            "trainers": N,
            "servers": self.layout.servers,
            "cache_sync": report.cache_sync,
            "sync_bytes_per_step": rows.stats()["sync_bytes_per_step"],
            "sync_rows_per_step": report.sync_rows / steps,
            "sync_overlapped_share": 1 - report.sync_urgent_rows / max(report.sync_rows, 1),
            "replicated_sync_rows_per_step": report.replicated_sync_rows / steps,
            "replicated_sync_bytes_per_step": (report.replicated_sync_rows / steps) * dim * 4 if N > 1 else 0.0,
            # what the exact partitioned cache would all-reduce on these plans (its rows' gradients)
            "partitioned_sync_bytes_per_step": ((report.sync_rows / steps) * dim * 4 if N > 1 else 0.0)
            if report.cache_sync != "replicated" else None,
            "fetched_rows_per_trainer": report.fetched_rows,
            "plans_in_flight": report.plans_in_flight,
            "max_plans_in_flight": report.max_in_flight,
            "oracle_planning_s": report.seconds_planning,
            "oracle_waiting_for_credit_s": report.seconds_waiting_for_credit,
            "servers_report": self.store.server_stats(),
            "bytes_sent_by_trainer0": self.t.bytes_sent,
            "bytes_received_by_trainer0": self.t.bytes_received,
        }


def run_trainer(cfg: TrainConfig, layout: Layout, rank: int, transport: Transport, group, log) -> dict | None:
    """Train as trainer ``rank``; trainer 0 returns the summary (others None)."""
    return train(cfg, announce=log if rank == 0 else None, topology=DataParallel(layout, rank, transport, group, log))

