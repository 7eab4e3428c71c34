"""Which rank plays which role.

Ranks ``0 .. N-1`` are trainers (rank 0 also reports: evaluation, digest, summary),
``N .. N+S-1`` embedding servers, and rank ``N+S`` the oracle (data + plans). The
same layout holds under the local launcher and under ``torchrun``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from bagpipe.config.environ import env_int
from bagpipe.errors import ConfigError


@dataclass(frozen=True)
class Layout:
    trainers: int
    servers: int

    @property
    def shape(self) -> str:
        """The job's shape as roles compare it at the rendezvous (:func:`check_shapes`)."""
        return f"{self.trainers} trainer(s) + {self.servers} server(s) (WORLD_SIZE {self.world_size})"

    def __post_init__(self) -> None:
        if self.trainers < 1:
            raise ConfigError(f"trainers must be >= 1, got {self.trainers}")
        if self.servers < 1:
            raise ConfigError(f"servers must be >= 1 for a distributed run, got {self.servers}")

    @property
    def world_size(self) -> int:
        return self.trainers + self.servers + 1

    @property
    def trainer_ranks(self) -> list[int]:
        return list(range(self.trainers))

    @property
    def server_ranks(self) -> list[int]:
        return list(range(self.trainers, self.trainers + self.servers))

    @property
    def oracle_rank(self) -> int:
        return self.trainers + self.servers

    def role(self, rank: int) -> tuple[str, int]:
        """("trainer" | "server" | "oracle", index within the role) of ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(
                f"rank {rank} is outside a job of {self.world_size} processes "
                f"({self.trainers} trainers + {self.servers} servers + 1 oracle)"
            )
        if rank < self.trainers:
            return "trainer", rank
        if rank < self.oracle_rank:
            return "server", rank - self.trainers
        return "oracle", 0

    def peers(self, rank: int) -> list[int]:
        """The ranks ``rank`` exchanges messages with: a trainer every server and the
        oracle, a server or the oracle every trainer (trainers meet each other only in
        collectives)."""
        if self.role(rank)[0] == "trainer":
            return self.server_ranks + [self.oracle_rank]
        return self.trainer_ranks

    def name(self, rank: int) -> str:
        """Human name of a rank's role, as the logs and error messages print it."""
        role, index = self.role(rank)
        return "oracle" if role == "oracle" else f"{role} {index}"


def role_threads(threads: int, layout: Layout, rank: int, environ: Mapping[str, str] | None = None) -> int:
    """torch threads of a role: ``threads`` if given (--threads), else OMP_NUM_THREADS
    (torchrun sets it; the local launcher sets it from this function), else the
    machine's cores split among the trainers (they compute) and one for each server
    and the oracle (they mostly wait on I/O)."""
    env = os.environ if environ is None else environ
    if threads:
        return threads
    omp = env_int("OMP_NUM_THREADS", 0, lo=0, hi=4096, environ=env)
    if omp:
        return omp
    if layout.role(rank)[0] == "trainer":
        return max(1, (os.cpu_count() or 1) // layout.trainers)
    return 1


def check_shapes(store, layout: Layout, name: str, deadline: float, hosts_store: bool = False) -> None:
    """Every rank's shape (``layout/RANK`` in the rendezvous ``store``) is this role's.

    A role started for another job shape counts among the arrivals too (a server of
    ``serve --servers 2`` beside workers of ``--servers 1``): the count was met, and the
    others then waited in the process group for the stranger for its 30-minute time-out.
    A ConfigError names the rank and both shapes; a RuntimeError at ``deadline``
    (``time.monotonic()``) when a rank never said its shape. The role that ``hosts_store``
    waits (5 s at most) for the others to have read the shapes before it refuses: its
    exit takes the store away, and they would report a rendezvous time-out instead."""
    for r in range(layout.world_size):
        while not store.check([f"layout/{r}"]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"Timed out: rank {r} did not say its job's shape")
            time.sleep(0.05)
        theirs = store.get(f"layout/{r}").decode()
        if theirs != layout.shape:
            store.add("shapes-refused", 1)
            until = time.monotonic() + 5  # a stranger never counts: at most this long
            while hosts_store and store.add("shapes-refused", 0) < layout.world_size - 1 and time.monotonic() < until:
                time.sleep(0.05)
            raise ConfigError(
                f"{name}: rank {r} was started for a job of {theirs}, this role for one of {layout.shape}: "
                "start every role with the same --trainers, --servers and WORLD_SIZE"
            )
