"""One process of a distributed job: join the process group, play the rank's role, leave.

Every role reads the rendezvous from the environment, as ``torchrun`` and the local
launcher both set it: ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import bagpipe.phases as phases
from bagpipe.config import Section, need
from bagpipe.config.environ import MAX_PORT, env_int
from bagpipe.config.sections import Store
from bagpipe.config.train import TrainConfig
from bagpipe.device.placement import TrainerPlacement, local_rank, place_trainer, trainer_backend
from bagpipe.distributed.layout import Layout, role_threads
from bagpipe.distributed.rendezvous import rendezvous
from bagpipe.distributed.superseded import SupersededWatch
from bagpipe.errors import BagpipeError, ConfigError

log = logging.getLogger(__name__)

# Generous: a server waits for the next request while trainer 0 evaluates or hashes
# every row, which can take minutes on big tables. A dead peer is noticed at once
# (gloo reports the closed connection); this bounds only a peer that hangs alive.
OP_TIMEOUT = timedelta(minutes=30)


def import_role_modules() -> None:
    """Import what every role runs (torch, the training loop, the oracle, the servers) and
    take one step of each dense optimizer (its first step imports much of torch, ~1 s on
    an idle core, sympy included): the recovery phase ``imports``, which a pre-started
    spare has done before it is needed."""
    import torch
    import torch.distributed  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    import bagpipe.distributed.oracle_role  # noqa: F401
    import bagpipe.distributed.server  # noqa: F401
    import bagpipe.distributed.trainer  # noqa: F401
    import bagpipe.optim.build  # noqa: F401
    import bagpipe.store.disk  # noqa: F401
    import bagpipe.store.memory  # noqa: F401

    layer = torch.nn.Linear(2, 1)
    for opt in (torch.optim.Adagrad, torch.optim.Adam, torch.optim.SGD):
        layer.zero_grad()
        layer(torch.ones(1, 2)).sum().backward()
        opt(layer.parameters(), lr=0.1).step()


def env_rank(layout: Layout) -> int:
    """RANK from the environment, checked against the job's layout."""
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE") if k not in os.environ]
    if missing:
        raise ConfigError(
            f"a distributed role needs {', '.join(missing)} in its environment "
            "(set by torchrun or by `bagpipe train --trainers N --servers S`)"
        )
    check_world_size(layout)
    env_int("MASTER_PORT", lo=1, hi=MAX_PORT)  # checked here, before the role does anything
    env_int("TORCHELASTIC_RESTART_COUNT", 0)
    env_int("OMP_NUM_THREADS", 0, lo=0, hi=4096)
    return env_int("RANK", lo=0, hi=layout.world_size - 1)


def check_world_size(layout: Layout) -> None:
    """A WORLD_SIZE in the environment (torchrun's, or set by hand) is the job's number of
    processes; one that is not is refused in one line (a role would wait at the rendezvous
    for processes that never come, or count a stranger's)."""
    if "WORLD_SIZE" not in os.environ:
        return
    world = env_int("WORLD_SIZE", lo=1)
    if world != layout.world_size:
        raise ConfigError(
            f"WORLD_SIZE is {world} but {layout.trainers} trainers + {layout.servers} servers + 1 oracle "
            f"make {layout.world_size} processes; start every role with the same --trainers, --servers and "
            "WORLD_SIZE (or leave WORLD_SIZE unset for bagpipe serve)"
        )


@dataclass(kw_only=True)
class ServerConfig(Section):
    """What an embedding server needs to know of its own (the row space comes from trainer 0)."""

    store: Store = "memory"
    """Where the shard's rows live."""
    store_dir: str | None = None
    """Directory of the disk store (a shard-K-of-S folder is made in it); default RUN/store."""
    init_from_store: bool = False
    """Start from the rows the shard's --store-dir already holds."""
    run_dir: str = "."
    """The run directory."""
    threads: int = 1
    """torch threads."""
    rendezvous_timeout: float = 300.0
    """Seconds to wait for the job's other processes to start."""
    memory_budget_mb: float | None = None
    """MiB this server may use, page cache included (default: the limit of its memory
    cgroup; 0: none): its disk store's I/O bounds are sized to it, and a shard that does
    not fit stops the server before it serves, naming the smallest budget that works."""
    request_rows: int = 1 << 16
    """Rows one request of a trainer carries at most (the estimate's staging)."""
    secret_file: str | None = None
    """File holding the job's secret (default $BAGPIPE_JOB_SECRET or $BAGPIPE_JOB_SECRET_FILE)."""

    def validate(self) -> None:
        need(self.threads >= 1, f"threads must be >= 1, got {self.threads}")
        need(
            self.rendezvous_timeout > 0,
            f"rendezvous timeout must be a number of seconds > 0, got {self.rendezvous_timeout}",
        )

    @classmethod
    def of(cls, cfg: TrainConfig, layout: Layout, rank: int) -> ServerConfig:
        return cls(
            store=cfg.cache.store,
            store_dir=cfg.cache.store_dir,
            init_from_store=cfg.cache.init_from_store,
            run_dir=cfg.run.out,
            threads=role_threads(cfg.run.threads, layout, rank),
            rendezvous_timeout=cfg.dist.rendezvous_timeout,
            memory_budget_mb=cfg.memory.server_memory_budget_mb,
            request_rows=max(1, cfg.data.batch_size * 32 // layout.servers),  # ~32 lookups a sample at most
            secret_file=cfg.dist.secret_file,
        )


def superseded_watch(name: str) -> SupersededWatch | None:
    """Under torchrun, a watch that ends this role once another host's roles have
    restarted into the next attempt (:mod:`bagpipe.distributed.superseded`); None
    elsewhere (the local launcher restarts every role itself)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    addr, port = os.environ["MASTER_ADDR"], env_int("MASTER_PORT", lo=1, hi=MAX_PORT)
    return SupersededWatch(addr, port, env_int("TORCHELASTIC_RESTART_COUNT", 0), name, _end_attempt).start()


def _end_attempt(message: str) -> None:
    """Print the role's one error line and end the process with exit code 1, so that its
    torchrun agent restarts it. ``os._exit`` from the watch's thread: the main thread may
    be blocked inside torch where no exception reaches it."""
    report_error(BagpipeError(message))
    logging.shutdown()
    os._exit(1)


#: How a role of a launched job prints the error it stops with; the launcher looks for it.
ERROR_PREFIX = "bagpipe worker: error: "


def report_error(e: BaseException) -> None:
    """Print the one line a role stops with, at once: leaving the process group can
    take a while (or be cut short by the launcher stopping the job), and this line is
    the reason the launcher and the role's log must show."""
    if not getattr(e, "reported", False):
        text = " ".join(str(e).split("\n")).encode("utf-8", "backslashreplace").decode("utf-8")
        print(ERROR_PREFIX + text, file=sys.stderr, flush=True)
        e.reported = True  # type: ignore[attr-defined]


@contextmanager
def joined(
    layout: Layout,
    rank: int,
    threads: int,
    rendezvous_timeout_s: float,
    secret_file: str | None = None,
    placement: TrainerPlacement | None = None,
    report_errors: bool = False,
    settings: dict[str, str] | None = None,
):
    """Join the job's process group and prove the job's secret (``secret_file``, else the
    environment's) to every role this one talks to; yields (transport, trainer group);
    always leaves the group.

    ``placement``: a trainer's GPU (None on a server or the oracle); the trainers' group
    runs NCCL when every trainer has a GPU of its own, gloo otherwise
    (:mod:`bagpipe.device.placement`). ``report_errors``: print an error this role stops
    with (:func:`report_error`) before leaving."""
    import torch
    import torch.distributed as dist

    from bagpipe.distributed.auth import load_secret
    from bagpipe.distributed.transport import Transport, gloo_reason, receiving_elsewhere

    secret = load_secret(secret_file)  # before waiting for anyone: a missing secret is a one-line error now
    torch.set_num_threads(max(1, threads))  # N + S + 1 processes share the machine's cores
    store = rendezvous(layout, rank, rendezvous_timeout_s)
    name = layout.name(rank)
    watch = superseded_watch(name)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=layout.world_size, timeout=OP_TIMEOUT)
    transport = None
    try:
        # every rank must create every group, in the same order and with the same backend
        if placement is not None:
            store.set(f"trainer-gpu/{rank}", placement.tag)
        backend = trainer_backend([store.get(f"trainer-gpu/{r}").decode() for r in layout.trainer_ranks])
        group = dist.new_group(layout.trainer_ranks, backend=backend) if layout.trainers > 1 else None
        transport = Transport(layout.name, log=log.warning)
        transport.join(layout.peers(rank), secret, settings)
        phases.mark("joined")
        log.info(f"{name} (rank {rank} of {layout.world_size}) joined")
        yield transport, group
    except RuntimeError as e:  # a collective (DDP, embedding sync) whose peer is gone
        lost = BagpipeError(f"{name} lost contact with another role ({gloo_reason(e)})")
        if report_errors:
            report_error(lost)
        raise lost from e
    except BagpipeError as e:
        if report_errors:
            report_error(e)
        raise
    finally:
        # Another thread inside a receive (a trainer's plan receiver, a server's reader, the
        # oracle's credits): leaving the process group under it aborts the process, so the
        # group stays and nothing here waits; the error goes on to whoever ends the process
        # past that thread with its exit code: a role's worker at once after its line, the
        # command line after its message (cli.py)
        stuck = receiving_elsewhere()
        if watch is not None:
            watch.stop(wait=not stuck)
        try:
            if not stuck:
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - leaving anyway
            pass
        sys.stdout.flush()


def run_role(cfg: TrainConfig, layout: Layout, rank: int) -> dict | None:
    """Play ``rank``'s role to the end; trainer 0 returns the run's summary."""
    role, _ = layout.role(rank)
    from bagpipe.train.resume import elastic_restart, finished
    from bagpipe.train.rundir import RunDir

    if elastic_restart() and finished(RunDir(cfg.run.out), cfg.run.steps):
        log.info(
            f"{layout.name(rank)}: restarted after the job had ended (its summary and final checkpoint are written); nothing to do"
        )
        return None
    settings = role_settings(cfg)
    if role == "server":
        serve(ServerConfig.of(cfg, layout, rank), layout, rank, report_errors=True, settings=settings)
        return None
    threads, timeout = role_threads(cfg.run.threads, layout, rank), cfg.dist.rendezvous_timeout
    if role == "trainer":
        from bagpipe.device import open_device
        from bagpipe.distributed.trainer import run_trainer
        from bagpipe.distributed.transport import receiving_elsewhere

        placement = trainer_placement(cfg.device.device)
        # opened before joining: a trainer without its GPU fails at once, naming why
        device = open_device(
            cfg.device.device, placement.index, cfg.device.deterministic, cfg.device.device_memory_budget_mb
        )
        done = False
        try:
            with joined(
                layout, rank, threads, timeout, cfg.dist.secret_file, placement, report_errors=True, settings=settings
            ) as (transport, group):
                summary = run_trainer(cfg, layout, rank, transport, group, device)
            done = True
            return summary
        finally:
            # after an error with a thread inside a receive the process ends past it (joined):
            # closing the device could wait on a collective whose peer is gone
            if done or not receiving_elsewhere():
                device.close()
    with joined(layout, rank, threads, timeout, cfg.dist.secret_file, report_errors=True, settings=settings) as (
        transport,
        group,
    ):
        from bagpipe.distributed.oracle_role import run_oracle

        report = run_oracle(cfg, layout, transport)
        log.info(
            f"oracle: planned {report.plan.get('steps', 0)} steps, hit rate {report.plan.get('hit_rate', 0):.1%}, "
            f"{report.seconds_planning:.1f} s planning, at most {report.max_in_flight} plans in flight per trainer"
        )
        return None


def role_settings(cfg: TrainConfig) -> dict[str, str]:
    """What this role compares with every peer at the join (:mod:`bagpipe.config.agreement`):
    its settings, and its data set by contents."""
    from bagpipe.config.agreement import job_settings
    from bagpipe.data.integrity import fingerprint
    from bagpipe.data.schema import DatasetMeta

    data = Path(cfg.data.data)
    return job_settings(cfg, fingerprint(data, DatasetMeta.load(data)))


def trainer_placement(device: str) -> TrainerPlacement:
    """This trainer process's GPU: ``cuda:LOCAL_RANK`` (see :mod:`bagpipe.device.placement`)."""
    import torch

    return place_trainer(device, local_rank(), torch.cuda.device_count() if device == "cuda" else 0)


def serve(
    scfg: ServerConfig, layout: Layout, rank: int, report_errors: bool = False, settings: dict[str, str] | None = None
) -> None:
    """Run embedding server ``rank`` until every trainer has said goodbye (``report_errors``,
    ``settings``: as :func:`joined`; a server started by hand holds no training settings)."""
    from bagpipe.budget import Budget, server_fit
    from bagpipe.distributed.server import (
        EmbeddingServer,
        ShardInit,
        receive_setup,
        restore_shard,
    )
    from bagpipe.store import open_store

    role, shard = layout.role(rank)
    if role != "server":
        raise ConfigError(f"rank {rank} is {layout.name(rank)}, not a server, in this layout")
    with joined(
        layout,
        rank,
        scfg.threads,
        scfg.rendezvous_timeout,
        scfg.secret_file,
        report_errors=report_errors,
        settings=settings,
    ) as (transport, _):
        init, state_dim, restore = receive_setup(transport, layout.trainer_ranks[0])
        sinit = ShardInit(init, shard, layout.servers)
        directory = (
            Path(scfg.store_dir) if scfg.store_dir else Path(scfg.run_dir) / "store"
        ) / f"shard-{shard}-of-{layout.servers}"
        budget = Budget.of(scfg.memory_budget_mb, option="--server-memory-budget-mb")
        io, est = server_fit(budget, sinit.num_rows, init.dim, state_dim, scfg.store, scfg.request_rows)
        # the run's own store starts fresh, as in one process; a checkpoint overwrites every row
        store = open_store(
            scfg.store,
            sinit,
            state_dim,
            directory,
            owned=not scfg.store_dir,
            reuse=scfg.init_from_store or restore is not None,
            io=io,
        )
        phases.mark("ready")
        log.info(
            f"server {shard}: {sinit.num_rows:,} of {init.num_rows:,} rows (row % {layout.servers} == {shard}), "
            f"{scfg.store} store; memory estimate {est.mib:,.0f} MiB, budget "
            + (f"{budget.mib:,.0f} MiB ({budget.source})" if budget.bytes is not None else f"none ({budget.source})")
        )
        if restore is not None:
            t0 = time.perf_counter()
            step, rows = restore_shard(store, restore, shard, layout.servers)
            phases.mark("restored")
            log.info(
                f"server {shard}: restored its rows from the checkpoint of step {step} ({rows:,} rows trained) "
                f"in {time.perf_counter() - t0:.1f} s"
            )
        try:
            memory = {
                "budget_mb": budget.mib,
                "budget_source": budget.source,
                "estimate_mb": round(est.mib, 1),
                "estimate_parts_mb": est.as_dict()["parts_mb"],
            }
            server = EmbeddingServer(store, transport, layout.trainer_ranks, memory)
            report = server.serve()  # a reader left inside a receive after an error: see joined()
        finally:
            store.close()
        log.info(
            f"server {shard}: requests {report.requests}; reads held {report.waited_s:.2f} s for other trainers' "
            f"write-backs, {report.lock_s:.2f} s for the store's lock, {report.read_s:.2f} s in the store, "
            f"row replies {report.reply_s:.2f} s to the wire"
        )
