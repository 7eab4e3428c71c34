"""The settings of ``bagpipe bench cluster`` (its options), shared by its runs
(:mod:`bagpipe.bench.scenarios.cluster.scenario`) and its report
(:mod:`bagpipe.bench.scenarios.cluster.report`)."""

from __future__ import annotations

from dataclasses import dataclass

from bagpipe.bench.harness.settings import CachePoint, Throughput
from bagpipe.config.modes import mode_spec

MODES = ("nocache", "lru", "lookahead")


@dataclass(kw_only=True)
class ClusterBench(CachePoint, Throughput):
    """Every role in a network namespace of its own on a bridge, links shaped both ways
    (tbf; a server's and the oracle's at --server-ratio times a trainer's rate), one
    thread per role: samples/s of nocache, lru and lookahead against link rate and
    number of trainers (batch per trainer fixed), --mode full on one process as the
    ideal; bytes per step on every link against a cost model, probe rates, time per
    step by phase, CPU per role. Needs root and network namespaces (skips in one line
    without). --batch-size is the batch of each trainer."""

    name = "cluster"
    QUICK = dict(
        scale=0.01,
        recipe="debug",
        batch_size=128,
        steps=10,
        warmup=3,
        reps=1,
        rates=(20.0,),
        trainers=(1,),
        modes=("nocache", "lookahead"),
        lookahead=4,
        large_lookahead=0,
        eval_samples=256,
        probe_s=0.3,
        embedding_dim=16,
        digest=True,
    )

    batch_size: int = 1024
    steps: int = 40
    warmup: int = 8
    eval_samples: int = 2048
    scale: float = 0.25
    rates: tuple[float, ...] = (1000.0, 300.0, 100.0, 30.0)
    """Link rates of a trainer in Mbit/s, each direction (a server's and the oracle's are --server-ratio times it)."""
    server_ratio: float = 2.5
    """A server's (and the oracle's) link rate over a trainer's (the paper: 25 / 10 Gbit/s)."""
    trainers: tuple[int, ...] = (1, 2, 4)
    """Numbers of trainers (each trains on --batch-size samples a step)."""
    servers: int = 1
    """Embedding servers."""
    modes: tuple[str, ...] = MODES
    """Modes across the network: a comma-separated subset of nocache,lru,lookahead (full always runs, on one process)."""
    large_lookahead: int = 60
    """A second, larger L for lookahead (0: only --lookahead)."""
    embedding_dim: int = 48
    """D (the paper's Criteo Kaggle runs: 48)."""
    probe_s: float = 1.0
    """Seconds each link probe sends for."""
    digest: bool = False
    """Compute params_sha256 of every run (the exactness check of --quick: every one-trainer run equals full's)."""

    def validate(self) -> None:
        super().validate()
        self.check_subset("modes", MODES)
        self.check("rates", bool(self.rates) and all(r > 0 for r in self.rates), "must be link rates > 0 in Mbit/s")
        self.check(
            "trainers", bool(self.trainers) and all(n >= 1 for n in self.trainers), "must be numbers of trainers >= 1"
        )
        self.check("servers", 1 <= self.servers <= 8, "must be in 1..8")
        self.check("server_ratio", self.server_ratio > 0, "must be > 0")
        self.check(
            "large_lookahead",
            self.large_lookahead == 0 or self.large_lookahead > self.lookahead,
            f"must be 0 or larger than --lookahead ({self.lookahead})",
        )
        self.check("threads", self.threads in (0, 1), "must be 1 (or 0): every role runs one thread")
        self.check("embedding_dim", self.embedding_dim >= 1, "must be >= 1")
        self.check("probe_s", self.probe_s > 0, "must be > 0")

    def configs(self) -> list[tuple[str, str, int]]:
        """(key, mode, L) of every mode across the network."""
        out = []
        for mode in self.modes:
            if mode_spec(mode).looks_ahead:  # one configuration per L
                out += [(f"{mode}-L{L}", mode, L) for L in (self.lookahead, self.large_lookahead) if L]
            else:
                out.append((mode, mode, 1))
        return out
