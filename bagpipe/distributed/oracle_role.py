"""The oracle as its own role: reads the data, plans the global batch, feeds the trainers.

One process reads the sample stream (global batches of B samples), runs the
:class:`LookaheadOracle` over them, splits every plan into the N trainers' plans
(:func:`bagpipe.distributed.partition.partition`) and sends each trainer its own, ahead of
time. Back-pressure: at most ``plans_in_flight`` plans per trainer are sent and not
yet taken by that trainer's pipeline (a trainer returns one credit per plan it takes),
so the oracle's memory stays bounded however long the run.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import bagpipe.phases as phases
from bagpipe.budget import memory_plan
from bagpipe.cache.setup import CachePlan, CacheSetup, LocalPlans
from bagpipe.config.train import TrainConfig
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream, train_stream
from bagpipe.distributed.exchange import OwnerPartitioner
from bagpipe.distributed.layout import Layout
from bagpipe.distributed.oracle_report import OracleReport
from bagpipe.distributed.partition import TrainerPlan, partition
from bagpipe.distributed.schema import WireError
from bagpipe.distributed.transport import CREDIT, PLAN, Transport
from bagpipe.oracle.plan import Plan
from bagpipe.train.preflight import cache_setup


def oracle_cache(cfg: TrainConfig) -> tuple[BatchStream, CacheSetup]:
    """The global batches of job ``cfg`` and the cache every trainer allocates: set up once,
    by the oracle, exactly as one process sets it up (``bench cluster``'s cost model replays it)."""
    dataset = Dataset(cfg.data.data)
    stream = train_stream(dataset, cfg.data, cfg.run.seed)
    # the trainers' memory: the cache, the plans they read ahead (their budget is
    # --memory-budget-mb, else this machine's cgroup limit)
    setup = cache_setup(cfg, dataset, stream, memory_plan(cfg, dataset, stream, role="remote-trainer"))
    return stream, setup


def run_oracle(cfg: TrainConfig, layout: Layout, transport: Transport) -> OracleReport:
    """Plan the job's global batches and send each trainer its part, to the end of the run."""
    stream, setup = oracle_cache(cfg)
    start = resume_step(cfg)
    for r in layout.trainer_ranks:  # the cache each trainer builds, first on the plan stream
        transport.send(r, PLAN, setup.plan)
    phases.mark("ready")
    d = cfg.dist
    source = LocalPlans(setup)
    report = OracleReport(
        cache_rows=setup.plan.cache_rows,
        lookahead=setup.plan.lookahead,
        cache_sync=d.cache_sync,
        plans_in_flight=d.plans_in_flight,
        fetched_rows=[0] * layout.trainers,
    )
    credits = _Credits(transport, layout.trainer_ranks, d.plans_in_flight)
    plans = source.plans(stream, start, cfg.run.steps)
    for parts in trainer_plans(plans, layout.trainers, d.cache_sync, report):
        for r, p in zip(layout.trainer_ranks, parts):
            t1 = time.perf_counter()
            credits.take(r)
            report.seconds_waiting_for_credit += time.perf_counter() - t1
            transport.send(r, PLAN, p)
            report.fetched_rows[r] += len(p.fetch_rows)
    report.plan = source.stats()
    report.max_in_flight = credits.max_in_flight
    for r in layout.trainer_ranks:
        transport.send(r, PLAN, {"end": True, "report": report})
    credits.wait_all_returned()  # nothing is left unread on the wire
    return report


def trainer_plans(plans: Iterator[Plan], N: int, cache_sync: str, report: OracleReport) -> Iterator[list[TrainerPlan]]:
    """Each global plan split into the N trainers' plans (``--cache-sync``'s split), counted
    in ``report``; the owner-based exchange holds two plans back (it plans deliveries for
    the next two steps' users)."""
    owner = OwnerPartitioner(N) if cache_sync == "owner" else None
    while True:
        t0 = time.perf_counter()
        gplan = next(plans, None)
        if owner is not None:
            ready = owner.push(gplan) if gplan is not None else owner.finish()
            report.partitioned_sync_rows = owner.partitioned_sync_rows
        else:
            ready = [partition(gplan, N, replicated=cache_sync == "replicated")] if gplan is not None else []
        report.seconds_planning += time.perf_counter() - t0
        for parts in ready:
            p = parts[0]
            if owner is not None:
                report.sync_rows += int(p.exchange_rows.sum())
                # waited for: the urgent half and the deferred half's rows (delivered after the next backward)
                report.sync_urgent_rows += int(p.exchange_rows[0] + p.exchange_rows[2] + p.exchange_rows[3])
            else:
                report.sync_rows += len(p.sync_slots)
                report.sync_urgent_rows += p.sync_urgent
            report.replicated_sync_rows += p.replicated_sync_rows
            yield parts
        if gplan is None:
            return


def resume_step(cfg: TrainConfig) -> int:
    """The step the job starts at: the latest checkpoint's when resuming (--resume, or a
    restart by torchrun), as the trainers decide it, else 0."""
    from bagpipe.checkpoint import CheckpointFolder
    from bagpipe.train.resume import elastic_restart

    if not (cfg.run.resume or elastic_restart()):
        return 0
    ckpt = CheckpointFolder(cfg.run.out).latest()
    return ckpt.step if ckpt is not None else 0


class _Credits:
    """Per trainer: how many more plans may be sent. One thread per trainer receives the
    credits it returns, so a trainer returning a credit never waits for the oracle
    (gloo's send completes only once the peer receives)."""

    def __init__(self, transport: Transport, trainers: list[int], window: int):
        self.t = transport
        self.window = window
        self.in_flight = dict.fromkeys(trainers, 0)
        self.max_in_flight = 0
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._stop = False
        self._threads = [
            threading.Thread(target=self._receive, args=(r,), daemon=True, name=f"credits-{r}") for r in trainers
        ]
        for th in self._threads:
            th.start()

    def _receive(self, rank: int) -> None:
        try:
            while True:
                if self.t.recv(rank, CREDIT) is None:  # the trainer's last word
                    return
                with self._cond:
                    self.in_flight[rank] -= 1
                    self._cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - raised in the oracle's thread
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _wait(self, ready) -> None:
        with self._cond:
            while not ready():
                if self._error is not None:
                    raise self._error
                self._cond.wait(timeout=0.5)

    def take(self, rank: int) -> None:
        """Block until ``rank`` has room for one more plan, and count it sent."""
        self._wait(lambda: self.in_flight[rank] < self.window)
        with self._cond:
            self.in_flight[rank] += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight[rank])

    def wait_all_returned(self) -> None:
        for th in self._threads:
            while th.is_alive():
                th.join(timeout=0.5)
                if self._error is not None:
                    raise self._error


class PlanReceiver:
    """A trainer's side of the plan stream: ``plan``, the cache the oracle role planned
    (the stream's first message); then iterate to get plans, one credit per plan taken.

    A thread (``bagpipe-plans``) takes the plans off the wire as the oracle sends them, up
    to the oracle's window ahead. The oracle sends to one trainer after the other and a
    gloo send completes only once the peer receives: received only when the trainer
    asked for its next plan (a synchronous executor, ``nocache`` and ``lru``, at the start
    of each step), trainer k got its plan k plan-transfers after trainer 0, and every
    trainer's read waited for the last one's mark (8 trainers under ``bench cluster
    --dilation 300``: ~1 s a step, docs/distributed.md)."""

    def __init__(self, transport: Transport, oracle_rank: int):
        self.t = transport
        self.oracle = oracle_rank
        plan = self.t.recv(self.oracle, PLAN)
        if not isinstance(plan, CachePlan):  # the wire allows it anywhere on the stream
            raise WireError(f"the plan stream starts with a {type(plan).__name__}, not the cache's CachePlan")
        self.plan: CachePlan = plan
        self.report: OracleReport | None = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        # from now on: the oracle's sends to the trainers after this one need not wait for
        # this trainer's setup (its cache, a restore)
        self._receiver = threading.Thread(target=self._receive, name="bagpipe-plans", daemon=True)
        self._receiver.start()

    def _receive(self) -> None:
        """Take plans off the wire to the stream's end (or a failure, handed over as such)."""
        try:
            while True:
                msg = self.t.recv(self.oracle, PLAN)
                self._inbox.put(msg)
                if isinstance(msg, dict) and msg.get("end"):
                    return
        except BaseException as e:  # noqa: BLE001 - raised in the trainer's thread
            self._inbox.put(e)

    def __iter__(self):
        while True:
            msg = self._inbox.get()
            if isinstance(msg, BaseException):
                raise msg
            if isinstance(msg, dict) and msg.get("end"):
                self.report = msg["report"]
                return
            yield msg
            self.t.send(self.oracle, CREDIT, 1)  # the pipeline took the plan: room for one more

    def close(self) -> None:
        """Tell the oracle this trainer takes no more plans (after the end of the stream)."""
        self.t.send(self.oracle, CREDIT, None)
