"""``bagpipe bench cluster``: BagPipe's headline measured on an emulated cluster.

Every role of a distributed job -- N trainers, S embedding servers, the oracle -- runs
in a network namespace of its own with its own address on a bridge
(:mod:`bagpipe.testbed.netns`); the job starts through the same rendezvous as a
multi-machine job, at trainer 0's address (never loopback); gloo binds to ``eth0``;
TSO/GSO/GRO are off and the MTU is 1500; both directions of every link are shaped
(``tbf``) to the link rate, a trainer's at ``rate`` and a server's and the oracle's at
``server_ratio`` x ``rate`` (the paper's 10 : 25 Gbit/s); every role runs one OpenMP
thread. The job's secret reaches the roles in their environment.

Sweep (interleaved over repetitions): link rates x trainers (batch per trainer fixed)
x modes (``nocache``, ``lru``, ``lookahead`` at each L), and ``--mode full`` on one
process with no network at all as the ideal (per trainer; N trainers ideally reach N
times it). For each configuration: samples/s and its spread; speedups over nocache and
lru; bytes per step on every host's link (its interface counters, read when trainer 0
starts and when trainer 0 finishes the last step) beside the cost model's
(:mod:`bagpipe.bench.scenarios.cluster.cost_model`); the rate a TCP probe achieves on each link under
the same shaping; trainer 0's time per step split into compute (forward, backward,
optimizer), waiting for rows (fetch waits and synchronous write-backs) and
synchronisation (waiting for deferred embedding sync); each role's CPU use over the
measured steps (share of one core); and the model's predicted step time.

All roles share this machine's cores: the CPU column says how much each took, and so
how far compute is inflated against a machine per role (docs/distributed.md).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bagpipe.bench.harness.report import header, write_results
from bagpipe.bench.harness.runner import data_samples, ensure_synth
from bagpipe.bench.harness.runner import launch as launch_train
from bagpipe.bench.scenarios.cluster.report import plot, summarise
from bagpipe.bench.scenarios.cluster.settings import ClusterBench, job_config
from bagpipe.bench.scenarios.cluster.tcp import tcp_figures
from bagpipe.data.schema import DatasetMeta
from bagpipe.distributed.launch import Placement, launch
from bagpipe.distributed.layout import Layout
from bagpipe.jsonout import json_text
from bagpipe.testbed.netns import EmulatedNet, Host, probe_rate, terminate_as_interrupt, unavailable
from bagpipe.testbed.tcpstats import TcpCounters

PORT = 29500


def _hosts(net: EmulatedNet, b: ClusterBench) -> dict[str, Host]:
    """Trainers t0.., servers s0.., the oracle and an unshaped probe host."""
    names = [f"t{i}" for i in range(max(b.trainers))] + [f"s{k}" for k in range(b.servers)] + ["or"]
    hosts = {n: net.add(n) for n in names}
    hosts["probe"] = net.add("pr")
    return hosts


def _rank_hosts(hosts: dict[str, Host], layout: Layout) -> list[Host]:
    return (
        [hosts[f"t{r}"] for r in layout.trainer_ranks] + [hosts[f"s{k}"] for k in range(layout.servers)] + [hosts["or"]]
    )


def _shape(net: EmulatedNet, hosts: dict[str, Host], b: ClusterBench, rate: float) -> None:
    for name, h in hosts.items():
        if name != "probe":
            net.shape(h, rate if name.startswith("t") else rate * b.server_ratio)


def _probe(net: EmulatedNet, hosts: dict[str, Host], b: ClusterBench) -> dict[str, dict[str, float]]:
    """Mbit/s a TCP stream achieves out of and into trainer 0, server 0 and the oracle (to and from the probe host)."""
    out = {}
    for name, role in (("t0", "trainer 0"), ("s0", "server 0"), ("or", "oracle")):
        out[role] = {
            "sent": probe_rate(net, hosts[name], hosts["probe"], b.probe_s),
            "received": probe_rate(net, hosts["probe"], hosts[name], b.probe_s),
        }
    return out


class _Window:
    """What a job did on the network and the CPUs: every host's interface counters and TCP
    counters from before its roles start to when trainer 0 finishes the last step (every
    step's traffic, the cold start's included), the interface counters again at the end of
    the warm-up (the measured steps' bytes alone), and every role's CPU time from the end of
    the warm-up to the last step (polling trainer 0's heartbeat). ``at_end`` runs once the last step is
    done (the links are unshaped for the evaluation and the digest, which are not measured)."""

    def __init__(
        self, net: EmulatedNet, hosts: list[Host], names: list[str], run_dir: Path, warmup: int, steps: int, at_end
    ):
        self.net, self.hosts, self.names, self.run = net, hosts, names, run_dir
        self.warmup, self.steps, self.at_end = max(warmup, 1), steps, at_end
        self.start = self._bytes()
        self.tcp_start = self._tcp()
        self.snaps: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="cluster-window")
        self._thread.start()

    def _step(self) -> int:
        try:
            return int.from_bytes((self.run / ".step").read_bytes()[:8], "little")
        except (OSError, ValueError):
            return 0

    def _bytes(self) -> dict[str, tuple[int, int]]:
        every = self.net.all_counters()  # one instant for every host
        return {n: every[h.name] for n, h in zip(self.names, self.hosts)}

    def _tcp(self) -> dict[str, TcpCounters]:
        return {n: self.net.tcp_counters(h) for n, h in zip(self.names, self.hosts)}

    def _cpu(self) -> dict[str, float]:
        import psutil

        cpu = {}
        try:
            for r in json.loads((self.run / "roles.json").read_text()):
                try:
                    t = psutil.Process(r["pid"]).cpu_times()
                    cpu[r["role"]] = t.user + t.system
                except psutil.Error:
                    pass
        except (OSError, ValueError):
            pass
        return cpu

    def _waits(self) -> dict[str, float]:
        """Seconds every role's threads have waited on a run queue (``/proc/PID/task/*/schedstat``)."""
        out = {}
        try:
            for r in json.loads((self.run / "roles.json").read_text()):
                out[r["role"]] = run_queue_wait_s(r["pid"])
        except (OSError, ValueError):
            pass
        return {role: w for role, w in out.items() if w is not None}

    def _watch(self) -> None:
        # a role that has finished keeps its last reading (the oracle, which may have sent
        # its last plan before the warm-up ends: then it used no CPU in the window)
        last_cpu: dict[str, float] = {}
        last_wait: dict[str, float] = {}
        for mark in (self.warmup, self.steps):
            polled = 0.0
            while self._step() < mark:
                if time.monotonic() - polled > 0.2:
                    last_cpu.update(self._cpu())
                    last_wait.update(self._waits())
                    polled = time.monotonic()
                if self._stop.wait(0.005):
                    return
            self.snaps.append(
                {
                    "t": time.perf_counter(),
                    "step": self._step(),
                    "bytes": self._bytes(),  # right after the step: the counters of that instant
                    "cpu": last_cpu | self._cpu(),
                    "wait": last_wait | self._waits(),
                    "tcp": self._tcp() if mark == self.steps else None,
                }
            )
        self.at_end()

    def result(self) -> dict | None:
        self._stop.set()
        self._thread.join(5)
        if len(self.snaps) < 2:
            return None
        a, z = self.snaps
        wall = z["t"] - a["t"]
        steps = max(z["step"], 1)
        measured = max(z["step"] - a["step"], 1)
        return {
            "steps": steps,
            "bytes_per_step": {
                n: {
                    "sent": (z["bytes"][n][0] - self.start[n][0]) / steps,
                    "received": (z["bytes"][n][1] - self.start[n][1]) / steps,
                }
                for n in self.names
            },
            # the steps after the warm-up alone: no start-up (DDP's first broadcast of the dense model, the handshakes)
            "bytes_per_measured_step": {
                n: {
                    "sent": (z["bytes"][n][0] - a["bytes"][n][0]) / measured,
                    "received": (z["bytes"][n][1] - a["bytes"][n][1]) / measured,
                }
                for n in self.names
            },
            "tcp": {n: tcp_figures(z["tcp"][n] - self.tcp_start[n], steps) for n in self.names},
            "cpu_share": {role: (z["cpu"][role] - a["cpu"][role]) / wall for role in z["cpu"] if role in a["cpu"]},
            "run_queue_share": {
                role: (z["wait"][role] - a["wait"][role]) / wall for role in z["wait"] if role in a["wait"]
            },
        }


def run_queue_wait_s(pid: int) -> float | None:
    """Seconds the threads of process ``pid`` now alive have waited on a run queue, ready
    to run but not running (the second field of ``/proc/PID/task/TID/schedstat``); None
    when the process is gone or the kernel keeps no such figures."""
    total, seen = 0, False
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[1])
            seen = True
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9 if seen else None


def _unshape(net: EmulatedNet, hosts: list[Host]) -> None:
    for h in hosts:
        net.unshape(h)


@contextmanager
def _roles_logged_to(path: Path) -> Iterator[None]:
    """The launcher's lines (every role's output) into ``path`` instead of the bench's own output."""
    logger = logging.getLogger("bagpipe.distributed.launch")
    handler = logging.FileHandler(path)
    old = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()
        logger.propagate = old


def _job(
    b: ClusterBench,
    net: EmulatedNet,
    hosts: dict[str, Host],
    data: Path,
    run_dir: Path,
    n: int,
    mode: str,
    L: int,
    cache_rows: int,
    log: Path,
) -> dict:
    cfg = job_config(b, data, run_dir, n, mode, L, cache_rows)
    layout = Layout(n, b.servers)
    by_rank = _rank_hosts(hosts, layout)
    placement = Placement(
        master_addr=by_rank[0].addr, prefix=lambda r: by_rank[r].exec_prefix(), iface="eth0", port=PORT
    )
    window = _Window(
        net,
        by_rank,
        [layout.name(r) for r in range(layout.world_size)],
        run_dir,
        b.warmup,
        b.steps,
        at_end=lambda: _unshape(net, by_rank),
    )
    t0 = time.perf_counter()
    try:
        with _roles_logged_to(log):
            summary = launch(cfg, placement=placement)
    finally:
        measured = window.result()
    return {"summary": summary, "window": measured, "wall_s": time.perf_counter() - t0, "config": cfg}


def run(b: ClusterBench) -> dict:
    assert b.out is not None  # set by BenchConfig
    if b.project:  # the cost model alone: no job, no network
        from bagpipe.bench.scenarios.cluster.projection import project

        return project(b)
    out = Path(b.out)
    reason = unavailable()
    if reason:
        why = f"bench cluster: skipped: {reason}"
        print(why, flush=True)
        payload = {**header(b), "skipped": why, "table": why}
        write_results(out, "cluster", payload, why)
        return payload
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    ensure_synth(data, b.profile, data_samples(b.batch_size * max(b.trainers), b.steps), b.scale, seed=1)
    meta = DatasetMeta.load(data)
    cache_rows = b.cache_rows(meta.total_rows, b.batch_size * max(b.trainers) * meta.num_features)
    ideal = _ideal_runs(b, data, out) if not b.dilation else [_emulated_ideal(b)]
    results: dict[tuple[int, float, str], list[dict]] = {}
    probes: dict[float, dict] = {}
    log = out / "roles.log"  # every role's output, run after run
    log.unlink(missing_ok=True)
    (out / "runs.jsonl").unlink(missing_ok=True)

    with terminate_as_interrupt(), EmulatedNet("cl", b.host_congestion_control()) as net:
        hosts = _hosts(net, b)
        for rep in range(b.reps):
            rates = (
                b.link_rates() if rep % 2 == 0 else b.link_rates()[::-1]
            )  # alternate the order: drift hits all alike
            for rate in rates:
                _shape(net, hosts, b, rate)
                if rate not in probes:
                    probes[rate] = _probe(net, hosts, b)
                    (out / "probes.json").write_text(json_text({f"{r:g}": p for r, p in probes.items()}))
                for n in b.trainers:
                    for key, mode, L in b.configs():
                        _shape(net, hosts, b, rate)  # the previous job's evaluation ran unshaped
                        print(f"[rep {rep + 1}/{b.reps}] {rate:g} Mbit/s, {n} trainer(s), {key} ...", flush=True)
                        run_dir = out / "runs" / f"{rate:g}-{n}-{key}"
                        shutil.rmtree(run_dir, ignore_errors=True)
                        r = _job(b, net, hosts, data, run_dir, n, mode, L, cache_rows, log)
                        results.setdefault((n, rate, key), []).append(r)
                        with open(out / "runs.jsonl", "a") as f:  # what a long sweep has measured so far
                            f.write(
                                json_text(
                                    {
                                        "rate": rate,
                                        "trainers": n,
                                        "config": key,
                                        "rep": rep,
                                        "wall_s": r["wall_s"],
                                        "summary": r["summary"],
                                        "window": r["window"],
                                    }
                                )
                                + "\n"
                            )
                        print(f"    {r['summary']['samples_per_s']:,.0f} samples/s ({r['wall_s']:.0f} s)", flush=True)
                        if not (rep == b.reps - 1 and rate == rates[-1]):
                            shutil.rmtree(run_dir, ignore_errors=True)
    payload = summarise(b, results, ideal, probes, cache_rows, meta)
    plot(out, payload)
    write_results(out, "cluster", payload, payload["table"])
    return payload


def report_again(b: ClusterBench) -> dict:
    """The report of a sweep that ran before (its ``runs.jsonl`` and ``probes.json`` in
    ``--out``), with this code's model and tables: no job runs."""
    out = Path(b.out or ".")
    data = out / "data"
    meta = DatasetMeta.load(data)
    cache_rows = b.cache_rows(meta.total_rows, b.batch_size * max(b.trainers) * meta.num_features)
    saved = out / "probes.json"
    if not saved.exists():  # a sweep from before probes.json: its results.json
        probes_by_rate = json.loads((out / "results.json").read_text())["probes_mbit"]
    else:
        probes_by_rate = json.loads(saved.read_text())
    configs = {key: (mode, L) for key, mode, L in b.configs()}
    results: dict[tuple[int, float, str], list[dict]] = {}
    for line in (out / "runs.jsonl").read_text().splitlines():
        r = json.loads(line)
        mode, L = configs[r["config"]]
        run_dir = out / "runs" / f"{r['rate']:g}-{r['trainers']}-{r['config']}"
        r["config"] = job_config(b, data, run_dir, r["trainers"], mode, L, cache_rows)
        results.setdefault((r["trainers"], r["rate"], r.pop("config_key", None) or _key(r)), []).append(r)
    # probes.json names a rate as "{rate:g}" (six digits): a dilated rate (10,000 / 300) is not that float
    probes = {rate: probes_by_rate[f"{rate:g}"] for _, rate, _ in results}
    ideal = [_emulated_ideal(b)] if b.dilation else [{"samples_per_s": float("nan"), "params_sha256": None}]
    payload = summarise(b, results, ideal, probes, cache_rows, meta)
    plot(out, payload)
    write_results(out, "cluster", payload, payload["table"])
    return payload


def _key(r: dict) -> str:
    cfg = r["config"]
    return f"{cfg.cache.mode}-L{cfg.cache.lookahead}" if cfg.cache.spec.looks_ahead else cfg.cache.mode


def _emulated_ideal(b: ClusterBench) -> dict:
    """With --dilation: the ideal is a trainer's emulated compute alone (no embedding traffic, no sync)."""
    return {"samples_per_s": b.batch_size / b.compute_ms() * 1000, "params_sha256": None, "emulated": True}


def _ideal_runs(b: ClusterBench, data: Path, out: Path) -> list[dict]:
    """--mode full on one process, one thread, the batch of one trainer, no network: the ideal."""
    runs = []
    for rep in range(b.reps):
        print(f"[rep {rep + 1}/{b.reps}] full, one process, no network (the ideal) ...", flush=True)
        run_dir = out / "runs" / "full"
        shutil.rmtree(run_dir, ignore_errors=True)
        s = launch_train(
            b, data, run_dir, "full", digest=b.digest, threads=1, embedding_dim=b.embedding_dim, mode="full"
        )
        runs.append(s)
        print(f"    {s['samples_per_s']:,.0f} samples/s", flush=True)
    return runs
