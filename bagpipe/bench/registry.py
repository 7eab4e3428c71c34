"""Every benchmark scenario: its settings class, the function that runs it, one line about it.

``bagpipe bench`` (:mod:`bagpipe.commands.bench`) builds one subcommand per entry, its
options generated from the settings class, and dispatches to ``run``; a new scenario is
a module with a :class:`~bagpipe.bench.harness.settings.BenchConfig` subclass and a ``run(config)
-> payload`` function, plus one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bagpipe.bench.harness.settings import BenchConfig
from bagpipe.bench.scenarios.approx import scenario as approx
from bagpipe.bench.scenarios.cluster import scenario as cluster
from bagpipe.bench.scenarios.convergence import scenario as convergence
from bagpipe.bench.scenarios.embedding_servers import scenario as embedding_servers
from bagpipe.bench.scenarios.hot_tiers import scenario as hot_tiers
from bagpipe.bench.scenarios.mlperf import scenario as mlperf
from bagpipe.bench.scenarios.modes import scenario as modes
from bagpipe.bench.scenarios.oracle_throughput import scenario as oracle_throughput
from bagpipe.bench.scenarios.peak_memory import scenario as peak_memory
from bagpipe.bench.scenarios.peers import scenario as peers
from bagpipe.bench.scenarios.recovery import scenario as recovery
from bagpipe.bench.scenarios.scale import scenario as scale
from bagpipe.bench.scenarios.sweep import scenario as sweep


@dataclass(frozen=True)
class Scenario:
    config: type[BenchConfig]
    """Its settings (the options of ``bagpipe bench NAME``)."""
    run: Callable[..., dict]
    """Runs it with an instance of ``config``; returns the payload written to results.json."""
    about: str
    """One line, for ``bagpipe bench --help``."""


SCENARIOS: dict[str, Scenario] = {
    s.config.name: s
    for s in (
        Scenario(modes.ModesBench, modes.run, "full / nocache / lru / lookahead side by side, memory and disk stores"),
        Scenario(
            oracle_throughput.OracleBench,
            oracle_throughput.run,
            "the lookahead oracle's planning throughput alone vs batch size and L",
        ),
        Scenario(peers.PeersBench, peers.run, "TorchRec's DLRM beside bagpipe full and lookahead (needs `make peers`)"),
        Scenario(sweep.SweepBench, sweep.run, "lookahead over cache size x L, and the --cache-budget-mb auto-tuner"),
        Scenario(
            embedding_servers.DistributedBench,
            embedding_servers.run,
            "embedding servers vs the in-process store; partitioned vs replicated cache",
        ),
        Scenario(
            convergence.ConvergenceBench, convergence.run, "eval curves of full vs lookahead, which must be identical"
        ),
        Scenario(
            recovery.RecoveryBench,
            recovery.run,
            "checkpoint cost (every N steps vs none), bytes against rows trained, and recovery time by phase of a killed role",
        ),
        Scenario(
            hot_tiers.AccelBench,
            hot_tiers.run,
            "BagPipe (with and without a hot tier), FAE and Hotline under one memory budget",
        ),
        Scenario(
            approx.ApproxBench,
            approx.run,
            "exact vs Slipstream's stale-input skip and cDLRM's periodic averaging: speed, AUC, bytes synchronised",
        ),
        Scenario(
            mlperf.MLPerfBench,
            mlperf.run,
            "MLPerf DLRM-DCNv2 at full size (204M rows, 105 GB) for a bounded number of steps on the disk store",
        ),
        Scenario(
            peak_memory.PeakMemoryBench,
            peak_memory.run,
            "bagpipe plan's estimate against the measured peak memory of real runs (modes, stores, servers)",
        ),
        Scenario(
            cluster.ClusterBench,
            cluster.run,
            "an emulated cluster: every role in its own network namespace, shaped links; "
            "nocache/lru/lookahead vs link rate and trainers",
        ),
        Scenario(
            scale.ScaleBench,
            scale.run,
            "tables larger than memory: the disk store's modes inside a cgroup memory limit, full unlimited",
        ),
    )
}
