"""The settings of ``bagpipe bench cluster`` (its options), shared by its runs
(:mod:`bagpipe.bench.scenarios.cluster.scenario`) and its report
(:mod:`bagpipe.bench.scenarios.cluster.report`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bagpipe.bench.harness.settings import CachePoint, Throughput
from bagpipe.config.compute import V100_BATCH, V100_STEP_MS
from bagpipe.config.modes import mode_spec
from bagpipe.config.sections import MAX_DDP_BUCKET_MB
from bagpipe.config.train import TrainConfig, only_applicable

MODES = ("nocache", "lru", "lookahead")

#: The paper's cluster (the BagPipe artifact's launch settings, issue 31): each trainer a
#: V100 behind a 10 Gbit/s NIC, the embedding server and the oracle behind 25 Gbit/s,
#: 8 trainers of B = 2048 each, D = 48, L = 200, Criteo Kaggle.
PAPER_CLUSTER: dict[str, Any] = dict(
    trainer_mbit=10_000.0,
    server_mbit=25_000.0,
    trainers=8,
    batch_size=V100_BATCH,
    embedding_dim=48,
    lookahead=200,
    profile="criteo-kaggle",
)


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
    cache_sync: str = "partitioned"
    """How every job's trainers synchronise their cached rows (bagpipe train --cache-sync):
    partitioned (a ring all-reduce of the step's shared and staying rows) or owner (each
    row summed by one owner and sent to its next users)."""
    ddp_bucket_mb: float = 0.0
    """MiB of dense gradients every job's trainers all-reduce at a time (bagpipe train
    --ddp-bucket-mb; 0: torch's default, 1 MiB then 25 MiB). Each bucket is all-reduced
    while the rest of the (emulated) backward runs; the cost model follows the same buckets."""
    embedding_dim: int = 48
    """D (the paper's Criteo Kaggle runs: 48)."""
    probe_s: float = 1.0
    """Seconds each link probe sends for."""
    digest: bool = False
    """Compute params_sha256 of every run (the exactness check of --quick: every one-trainer run equals full's)."""
    dilation: float = 0.0
    """k: 0 runs the real compute at --rates. k > 0 emulates the paper's cluster k times
    slower: every trainer's forward + backward is a delay of k x the profile GPU's
    (--gpu-step-ms per 2048 samples, scaled per sample; bagpipe train --emulate-compute),
    every trainer link 10,000 / k Mbit/s, the server's and the oracle's 25,000 / k (so
    --rates and --server-ratio are set by k); the ideal is the emulated compute alone."""
    gpu_step_ms: float = V100_STEP_MS
    """With --dilation or --project: the profile GPU's forward + backward of one trainer's 2048 samples,
    ms (an assumption, not a figure of the paper: bagpipe.config.compute.V100_STEP_MS)."""
    congestion_control: str = "cubic"
    """TCP congestion control of every emulated host (set on its route, ip route ...
    congctl): cubic, Linux's default, or another the kernel has loaded (bbr, reno);
    inherit: this machine's own default (net.ipv4.tcp_congestion_control)."""
    starved_share: float = 0.10
    """A role is starved of CPU -- the run's figures invalid -- when its threads waited on
    the run queue for more than this share of the measured wall time (/proc/PID/task/*/schedstat)."""

    project: tuple[int, ...] = ()
    """Numbers of trainers to project the paper's cluster to by the cost model alone (no
    job runs; e.g. 8,16,32,64): replays the planner for each, at --project-servers."""
    project_servers: tuple[int, ...] = (1, 2, 4)
    """With --project: numbers of embedding servers."""
    project_efficiency: float = 0.96
    """With --project: achieved over nominal link rate (bench cluster's probes: 0.95-0.97)."""
    project_step_ms: tuple[float, ...] = ()
    """With --project: the profile GPU's forward + backward of 2048 samples to project at,
    ms (e.g. 2,4,8,13: where the paper's ~75% of nocache's step on embedding access lies;
    one replay of the planner serves them all). Default: --gpu-step-ms alone."""

    def validate(self) -> None:
        super().validate()
        self.check_subset("modes", MODES)
        self.check("project", all(n >= 1 for n in self.project), "must be numbers of trainers >= 1")
        self.check(
            "project_servers",
            bool(self.project_servers) and all(1 <= s <= 8 for s in self.project_servers),
            "must be numbers of servers in 1..8",
        )
        self.check("project_efficiency", 0 < self.project_efficiency <= 1, "must be in (0, 1]")
        self.check(
            "project_step_ms",
            all(0 < ms <= 1e6 for ms in self.project_step_ms),
            "must be step times in ms, each > 0 (and at most 1e6)",
        )
        self.check("project_step_ms", bool(self.project) or not self.project_step_ms, "applies to --project")
        self.check(
            "gpu_step_ms",
            not self.project_step_ms or self.gpu_step_ms == V100_STEP_MS,
            "is replaced by --project-step-ms: give one of the two",
        )
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
        self.check("cache_sync", self.cache_sync in ("partitioned", "owner"), "must be partitioned or owner")
        self.check(
            "ddp_bucket_mb",
            0 <= self.ddp_bucket_mb <= MAX_DDP_BUCKET_MB,
            f"must be MiB in [0, {MAX_DDP_BUCKET_MB:g}] (0: torch's default)",
        )
        self.check("embedding_dim", self.embedding_dim >= 1, "must be >= 1")
        self.check("probe_s", self.probe_s > 0, "must be > 0")
        self.check("dilation", self.dilation >= 0, "must be >= 0 (0: real compute at --rates)")
        self.check("gpu_step_ms", self.gpu_step_ms > 0, "must be > 0 ms")
        self.check("starved_share", 0 < self.starved_share <= 1, "must be in (0, 1]")
        offered = available_congestion_control()
        self.check(
            "congestion_control",
            self.congestion_control == "inherit" or offered is None or self.congestion_control in offered,
            f"must be inherit or one this kernel offers ({', '.join(offered or [])}; "
            "net.ipv4.tcp_available_congestion_control)",
        )
        if self.dilation:
            self.check("rates", self.rates == ClusterBench.rates, "is set by --dilation k (10,000 / k Mbit/s): drop it")
            self.check("server_ratio", self.server_ratio == 2.5, "is the paper's 2.5 with --dilation: drop it")
            self.check("digest", not self.digest, "does not apply to --dilation (emulated compute does not train)")
        elif not self.project:
            self.check("gpu_step_ms", self.gpu_step_ms == V100_STEP_MS, "applies to --dilation k > 0 or --project")

    def gpu_step_source(self) -> str:
        """Where the profile GPU's step time came from (neither is a figure of the paper)."""
        if self.gpu_step_ms == V100_STEP_MS:
            return "assumption (bagpipe.config.compute.V100_STEP_MS), not a figure of the paper"
        return "--gpu-step-ms, not a figure of the paper"

    def projected_step_ms(self) -> tuple[float, ...]:
        """The profile GPU's step times (ms per 2048 samples) --project projects at."""
        return self.project_step_ms or (self.gpu_step_ms,)

    def host_congestion_control(self) -> str | None:
        """What every emulated host's TCP is set to (None: the machine's, inherited)."""
        return None if self.congestion_control == "inherit" else self.congestion_control

    def congestion_label(self) -> str:
        """The congestion control the report names: with inherit, which one that is here."""
        if self.congestion_control != "inherit":
            return self.congestion_control
        try:
            return f"inherit: {Path('/proc/sys/net/ipv4/tcp_congestion_control').read_text().strip()}"
        except OSError:
            return "inherit"

    def with_servers(self, servers: int) -> ClusterBench:
        """These settings with ``servers`` embedding servers."""
        return replace(self, servers=servers)

    def link_rates(self) -> tuple[float, ...]:
        """A trainer's link rates (Mbit/s) the sweep runs: --rates, or the paper's / k."""
        return (PAPER_CLUSTER["trainer_mbit"] / self.dilation,) if self.dilation else self.rates

    def emulated_compute(self) -> str | None:
        """The trainers' --emulate-compute SPEC (None: real compute)."""
        if not self.dilation:
            return None
        if self.gpu_step_ms == V100_STEP_MS:
            return f"v100-dlrm-kaggle*{self.dilation:g}"
        return f"{self.gpu_step_ms * 1000 / V100_BATCH * self.dilation:.6g}us/sample"

    def compute_ms(self) -> float:
        """The emulated compute of one trainer's step (--batch-size samples), ms."""
        return self.gpu_step_ms / V100_BATCH * self.batch_size * self.dilation

    def off_profile(self) -> list[str]:
        """How the sweep differs from the paper's cluster (one phrase each)."""
        out = []
        if max(self.trainers) != PAPER_CLUSTER["trainers"]:
            out.append(f"trainers {','.join(map(str, self.trainers))} (paper {PAPER_CLUSTER['trainers']})")
        for name in ("batch_size", "embedding_dim", "profile"):
            if getattr(self, name) != PAPER_CLUSTER[name]:
                out.append(f"{name} {getattr(self, name)} (paper {PAPER_CLUSTER[name]})")
        if PAPER_CLUSTER["lookahead"] not in (self.lookahead, self.large_lookahead):
            out.append(f"L {self.lookahead}/{self.large_lookahead} (paper {PAPER_CLUSTER['lookahead']})")
        if self.scale != 1.0:
            out.append(f"tables at {self.scale:g} of their cardinality")
        return out

    def configs(self) -> list[tuple[str, str, int]]:
        """(key, mode, L) of every mode across the network."""
        out = []
        for mode in self.modes:
            if mode_spec(mode).looks_ahead:  # one configuration per L
                out += [(f"{mode}-L{L}", mode, L) for L in (self.lookahead, self.large_lookahead) if L]
            else:
                out.append((mode, mode, 1))
        return out


def available_congestion_control() -> list[str] | None:
    """The TCP congestion controls this kernel offers (None: not Linux, not known)."""
    try:
        return Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    except OSError:
        return None


def job_config(b: ClusterBench, data: Path, run_dir: Path, n: int, mode: str, L: int, cache_rows: int) -> TrainConfig:
    """The TrainConfig of one job of the sweep (``n`` trainers, ``mode`` at lookahead ``L``)."""
    emulated = b.emulated_compute()
    return TrainConfig.of(
        **only_applicable(  # a baseline's cache is not sized, nor does it look ahead
            dict(
                mode=mode,
                cache_rows=cache_rows,
                lookahead=L,
                trainers=n,
                servers=b.servers,
                cache_sync=b.cache_sync,
                ddp_bucket_mb=b.ddp_bucket_mb,
            )
        ),
        **({"emulate_compute": emulated} if emulated else {}),
        data=str(data),
        out=str(run_dir),
        model=b.model,
        recipe=b.recipe,
        embedding_dim=b.embedding_dim,
        batch_size=b.batch_size * n,
        optimizer=b.optimizer,
        lr=b.lr,
        steps=b.steps,
        warmup_steps=b.warmup,
        eval_samples=b.eval_samples,
        threads=1,
        progress=False,
        final_checkpoint=False,
        digest=b.digest,
        rendezvous_timeout=120.0,
    )
