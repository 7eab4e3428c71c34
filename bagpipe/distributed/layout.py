"""Which rank plays which role.

Ranks ``0 .. N-1`` are trainers (rank 0 also reports: evaluation, digest, summary),
``N .. N+S-1`` embedding servers, and rank ``N+S`` the oracle (data + plans). The
same layout holds under the local launcher and under ``torchrun``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from bagpipe.config.environ import env_int
from bagpipe.errors import ConfigError


@dataclass(frozen=True)
class Layout:
    trainers: int
    servers: int

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
