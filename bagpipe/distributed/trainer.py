"""A data-parallel trainer: the training loop with the :class:`DataParallel` topology.

Each step: take the next plan (its rows already fetched from the embedding servers by
the prefetch pipeline), run forward/backward on this trainer's 1/N slice of the global
batch (DDP averages the dense gradients), then the row strategy
(:class:`bagpipe.cache.allreduce.SyncedRowUpdate`) averages the synchronised embedding
rows' gradients and updates every row; expired rows go back to the servers in the
background. Trainer 0 also evaluates, computes params_sha256 over the servers' rows,
writes the final checkpoint, metrics.jsonl and summary.json -- through the same loop
code as a one-process run (:func:`bagpipe.train.loop.train`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from bagpipe.budget.estimate import RunShape
from bagpipe.cache.allreduce import SyncedRowUpdate
from bagpipe.cache.periodic import PeriodicRowUpdate
from bagpipe.checkpoint import Checkpoint, CutTarget
from bagpipe.config.sections import DistConfig
from bagpipe.config.train import TrainConfig
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.device import Device
from bagpipe.distributed.layout import Layout
from bagpipe.distributed.oracle_role import PlanReceiver
from bagpipe.distributed.row_exchange import OwnerRowUpdate
from bagpipe.distributed.server import RemoteStore, setup_message
from bagpipe.distributed.transport import CONTROL, Transport
from bagpipe.optim.sparse import SparseOptimizer
from bagpipe.oracle.plan import Plan
from bagpipe.store.init import RowInitializer
from bagpipe.train.backends import CachedBackend, cached_backend
from bagpipe.train.loop import train
from bagpipe.train.preflight import MemoryCheck
from bagpipe.train.progress import ProgressKind
from bagpipe.train.protocols import PartsWriter, RowUpdate
from bagpipe.train.summary import DistributedStats


class RemotePlans:
    """The plan source of a trainer (a :class:`~bagpipe.train.protocols.PlanSource`): its
    part of every global plan, from the oracle role."""

    def __init__(self, receiver: PlanReceiver):
        self.receiver = receiver
        self.lookahead: int | None = receiver.plan.lookahead

    def plans(self, stream: BatchStream, start: int, stop: int) -> Iterator[Plan]:
        yield from self.receiver
        self.receiver.close()  # the end of the stream: the oracle may stop waiting for credits

    def stats(self) -> dict:
        report = self.receiver.report
        return dict(report.plan) if report is not None else {}


RemoteBackend = CachedBackend[RemoteStore, RemotePlans]
"""A trainer's backend: the rows on the embedding servers (a :class:`RemoteStore`), the
plans from the oracle role (:class:`RemotePlans`), the cache the oracle role planned."""


class DataParallel:
    """Trainer ``rank`` of a job laid out as ``layout`` (a ``Topology[RemoteBackend]``:
    :class:`~bagpipe.train.protocols.Topology`).

    What it builds for the run -- the remote store, the plan stream -- lives in the
    :class:`RemoteBackend` that :meth:`backend` returns, which every later call is given.
    It computes on ``device`` (its GPU on ``--device cuda``: :mod:`bagpipe.device.placement`);
    ``group`` is the trainers' group (NCCL or gloo), None with one trainer.
    """

    def __init__(self, layout: Layout, rank: int, transport: Transport, group, dist: DistConfig, device: Device):
        self.layout, self.rank, self.t, self.group, self.device = layout, rank, transport, group, device
        self.reports = rank == 0
        self.sync_period = dist.sync_period  # K of --cache-sync periodic:K (0: the exact caches)
        self.cache_sync = dist.cache_sync
        self.bucket_mb = dist.ddp_bucket_mb  # 0: DDP's default buckets

    @property
    def backend_name(self) -> str:
        """The trainers' collectives' backend: nccl, gloo, or none (one trainer)."""
        return torch.distributed.get_backend(self.group) if self.group is not None else "none"

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.layout.trainers == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        dev = self.device.torch
        ids = [dev] if dev.type == "cuda" else None
        buckets = {"bucket_cap_mb": self.bucket_mb} if self.bucket_mb > 0 else {}
        return DistributedDataParallel(model, device_ids=ids, process_group=self.group, **buckets)

    def backend(
        self,
        cfg: TrainConfig,
        init: RowInitializer,
        state_dim: int,
        dataset: Dataset,
        stream: BatchStream,
        shape: RunShape,
        ckpt: Checkpoint | None,
        memory: MemoryCheck | None = None,
    ) -> RemoteBackend:
        if self.rank == 0:  # the servers learn the row space (and where to restore from) from trainer 0
            restore = str(ckpt.path) if ckpt is not None else None
            for s in self.layout.server_ranks:
                self.t.send(s, CONTROL, setup_message(init, state_dim, restore))
        store = RemoteStore(init, state_dim, self.t, self.layout.server_ranks)
        plans = RemotePlans(PlanReceiver(self.t, self.layout.oracle_rank))
        # the cache (and the trainers' memory) as the oracle role planned it
        return cached_backend(
            plans.receiver.plan,
            store,
            plans,
            self.device,
            cfg.cache.spec.executor,
            # the synchronised caches are equal on every trainer: trainer 0 writes them; in the
            # owner-based exchange each trainer writes the rows it owns (its slot_rows)
            writes_cached=self.rank == 0 or self.cache_sync == "owner",
        )

    def restore_rows(self, ckpt: Checkpoint, backend: RemoteBackend) -> None:
        """Nothing here: each server restored its own rows at start-up (no process funnels every row)."""

    def checkpoint_cut(self, step: int, backend: RemoteBackend, target: CutTarget | None) -> PartsWriter | None:
        """A cut at step ``step``: every trainer drains its write-backs (trainer 0 also sends
        its cached rows) and asks every server for its cut; a server takes it once every
        trainer asked (so every write-back before the cut is in), copies the rows its part
        needs and writes the part in the background. Trainer 0 names the folder and the
        kind; its checkpoint writer then waits for every server's part."""
        backend.flush(step - 1, durable=False)
        request: dict = {"op": "checkpoint", "step": step}
        if target is not None:
            merge = target.root / target.base if target.kind == "full" and target.base else None
            request |= {
                "dir": str(target.staging.resolve()),
                "kind": target.kind,
                "everything": target.everything,
                "base": str(merge.resolve()) if merge is not None else None,
            }
        servers = backend.store
        servers.checkpoint(request)
        if target is None:
            return None
        return lambda: servers.parts(step)

    def row_update(
        self, opt: SparseOptimizer, backend: RemoteBackend
    ) -> SyncedRowUpdate | PeriodicRowUpdate | OwnerRowUpdate:
        cache = backend.cache
        if self.sync_period:  # cDLRM's periodic averaging (an approximation)
            return PeriodicRowUpdate(opt, cache, self.sync_period, self.layout.trainers, self.group)
        if self.cache_sync == "owner":
            return OwnerRowUpdate(opt, cache, self.rank, self.group)
        return SyncedRowUpdate(opt, cache, self.group)

    def mean(self, values: list[float]) -> float:
        """The mean of the slices' mean losses is the global batch's mean loss."""
        # NCCL reduces device tensors only
        t = torch.tensor(values, dtype=torch.float64, device=self.device.torch if self.backend_name == "nccl" else None)
        if self.layout.trainers > 1:
            torch.distributed.all_reduce(t, group=self.group)
            t /= self.layout.trainers
        return float(t.mean())

    def progress_kind(self, progress: bool) -> ProgressKind:
        return "lines" if self.rank == 0 else "off"

    def section(self, backend: RemoteBackend, rows: RowUpdate) -> DistributedStats:
        N, dim = self.layout.trainers, backend.store.dim
        report = backend.source.receiver.report
        assert report is not None, "the oracle's last message carries its report"
        steps = max(report.plan.get("steps", 0), 1)
        partitioned = report.partitioned_sync_rows if report.cache_sync == "owner" else report.sync_rows
        return DistributedStats(
            trainers=N,
            servers=self.layout.servers,
            cache_sync=report.cache_sync,
            sync_bytes_per_step=rows.stats()["sync_bytes_per_step"],
            sync_rows_per_step=report.sync_rows / steps,
            sync_overlapped_share=1 - report.sync_urgent_rows / max(report.sync_rows, 1),
            replicated_sync_rows_per_step=report.replicated_sync_rows / steps,
            replicated_sync_bytes_per_step=(report.replicated_sync_rows / steps) * dim * 4 if N > 1 else 0.0,
            # what the exact partitioned cache would all-reduce on these plans (its rows' gradients)
            partitioned_sync_bytes_per_step=((partitioned / steps) * dim * 4 if N > 1 else 0.0)
            if report.cache_sync != "replicated"
            else None,
            fetched_rows_per_trainer=report.fetched_rows,
            plans_in_flight=report.plans_in_flight,
            max_plans_in_flight=report.max_in_flight,
            oracle_planning_s=report.seconds_planning,
            oracle_waiting_for_credit_s=report.seconds_waiting_for_credit,
            servers_report=backend.store.server_stats(),
            bytes_sent_by_trainer0=self.t.bytes_sent,
            bytes_received_by_trainer0=self.t.bytes_received,
            trainer_backend=self.backend_name,
        )


def run_trainer(
    cfg: TrainConfig, layout: Layout, rank: int, transport: Transport, group, device: Device
) -> dict | None:
    """Train as trainer ``rank`` on ``device``; trainer 0 returns the summary (others None)."""
    return train(cfg, topology=DataParallel(layout, rank, transport, group, cfg.dist, device))
