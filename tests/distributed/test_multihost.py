"""Real multi-host jobs: two network namespaces as two hosts, torchrun on each.

Each host is a network namespace with its own address on a bridge
(``bagpipe/testbed/netns.py``); on each, ``torchrun --nnodes 2 --rdzv-backend static``
starts two roles of a job of 1 trainer + 2 embedding servers + the oracle, the
rendezvous at host 0's address (never loopback), gloo bound to ``eth0``, the job's
secret in a file of mode 0600. Proves:

* one job, two things: a *stranger* -- a third host on the same bridge that knows no
  secret -- connects to every port of the roles another host can reach (the
  rendezvous store, gloo's listeners) and sends garbage, a forged message header, an
  oversized length and 100 kB of 0xff, and writes keys into the rendezvous store as a
  client; no role notices (none restarts). (The roles are held with SIGSTOP while the
  stranger works, so that a loaded machine cannot let the job finish first; its
  connections wait in the kernel and are read on SIGCONT.) Then every role of host 1
  (server 1 and the oracle) is SIGKILLed after the first checkpoint: both torchruns
  (``--max-restarts 1``) restart their roles -- host 0's roles, when they do not fail on
  their own, see host 1's restarted roles begin the next attempt in the store and exit
  (``bagpipe/distributed/superseded.py``) -- and the roles continue from the latest
  checkpoint. The job ends with ``params_sha256`` equal to the one-host run's, the
  uninterrupted digest (for one trainer, bitwise ``--mode full``'s on one process), and
  no process is left in any namespace;
* ``bagpipe bench cluster --quick`` (every role in its own namespace, links shaped at
  20 / 50 Mbit/s): nocache and lookahead both end with ``--mode full``'s digest, the
  probe never exceeds the shaped rate and achieves at least 75% of it, lookahead is faster than nocache, the
  bytes per step of every link that carries more than 10 kB a step are at most 15% above
  the cost model and at most 25% below it (the quick run is ten steps: its start and end
  weigh more than at full size, where they agree within a few %, and write-backs still
  queued on a link slowed by a loaded machine are not yet counted), and no namespace is left. (Where namespaces
  cannot be made it prints its one skip line: ``tests/unit/bench/test_bench_cli.py``.)

Skipped, with the reason in one line, where namespaces cannot be made (not root, no
``ip``/``tc``); CI runs as root. Every namespace is removed at the end of each test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from runs import trained

from bagpipe.cli import main
from bagpipe.config.train import TrainConfig
from bagpipe.distributed.auth import new_secret, write_secret_file
from bagpipe.testbed.netns import EmulatedNet, run_namespaces, unavailable

REASON = unavailable()
pytestmark = [
    pytest.mark.distributed,
    pytest.mark.timeout(300),
    pytest.mark.skipif(REASON is not None, reason=f"no emulated hosts here: {REASON}"),
]

STEPS, BATCH, EVERY = 24, 64, 6
PORT = 29600
JOB_TIMEOUT = 360
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def job_args(data: str, out: Path, secret: Path, steps: int, *extra) -> list[str]:
    return [
        "--data",
        data,
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--batch-size",
        str(BATCH),
        "--optimizer",
        "adagrad",
        "--lr",
        "0.05",
        "--threads",
        "1",
        "--no-progress",
        "--mode",
        "lookahead",
        "--cache-rows",
        "1000",
        "--lookahead",
        "4",
        "--trainers",
        "1",
        "--servers",
        "2",
        "--secret-file",
        str(secret),
        *map(str, extra),
    ]


@pytest.fixture(scope="module")
def full_digest(tiny_data, tmp_path_factory):
    """--mode full on one process for ``steps``: what a one-trainer job on any number of hosts ends with, bitwise."""
    done: dict[int, str] = {}

    def get(steps: int) -> str:
        if steps not in done:
            out = tmp_path_factory.mktemp("full") / "run"
            cfg = TrainConfig.of(
                data=tiny_data,
                out=str(out),
                steps=steps,
                batch_size=BATCH,
                optimizer="adagrad",
                lr=0.05,
                threads=1,
                progress=False,
            )
            done[steps] = trained(cfg)["params_sha256"]
        return done[steps]

    return get


def start_hosts(net: EmulatedNet, data: str, out: Path, steps: int, *extra) -> list[subprocess.Popen]:
    """torchrun on two hosts; host 0 (trainer 0, server 0) also serves the rendezvous."""
    secret = write_secret_file(out.parent / "job.secret", new_secret())
    hosts = [net.add("h0"), net.add("h1")]
    procs = []
    for k, h in enumerate(hosts):
        cmd = [
            TORCHRUN,
            "--nnodes",
            "2",
            "--node-rank",
            str(k),
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "static",
            "--master-addr",
            hosts[0].addr,
            "--master-port",
            str(PORT),
            "--max-restarts",
            "1",
            "-m",
            "bagpipe.cli",
            "worker",
            *job_args(data, out, secret, steps, *extra),
        ]
        env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
        env.pop("BAGPIPE_JOB_SECRET", None)
        procs.append(
            net.popen(h, cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=out.parent)
        )
    return procs


def finish(net: EmulatedNet, procs: list[subprocess.Popen]) -> list[str]:
    """Every host's torchrun output once it has ended; after JOB_TIMEOUT every process in the
    hosts is killed (a torchrun's workers hold its output pipe) and the test fails with their logs."""
    outs = [""] * len(procs)

    def read(i: int) -> None:  # drained all along: a full pipe would stall torchrun
        outs[i] = procs[i].communicate()[0]

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(procs))]
    for t in readers:
        t.start()
    deadline = time.monotonic() + JOB_TIMEOUT
    for t in readers:
        t.join(max(0.0, deadline - time.monotonic()))
    late = any(t.is_alive() for t in readers)
    if late:
        for h in list(net.hosts.values()):
            for pid in net.pids(h):
                os.kill(pid, signal.SIGKILL)
        for t in readers:
            t.join(30)
    assert not late, f"the hosts' torchruns did not finish within {JOB_TIMEOUT} s:\n" + "\n".join(
        o[-3000:] for o in outs
    )
    return outs


def heartbeat(run: Path) -> int:
    try:
        return int.from_bytes((run / ".step").read_bytes()[:8], "little")
    except (OSError, ValueError):
        return 0


def wait_for(cond, procs, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if any(p.poll() is not None for p in procs):
            raise AssertionError(
                f"a host's torchrun ended before {what}: " + "".join(p.communicate()[0][-2000:] for p in procs)
            )
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def digest(run: Path) -> str:
    return json.loads((run / "summary.json").read_text())["params_sha256"]


def workers(net: EmulatedNet, host, agent: subprocess.Popen) -> list[int]:
    """The role processes inside ``host`` (torchrun's children), not torchrun itself."""
    return [p for p in net.pids(host) if p != agent.pid and "bagpipe.cli" in " ".join(psutil.Process(p).cmdline())]


STRANGER = r"""
import os, socket, struct, sys, time
targets = [(a, int(p)) for a, p in (t.split(":") for t in sys.argv[1:])]
magic = b"BPW1"
payloads = [os.urandom(7), os.urandom(4096), (8).to_bytes(8, "little") + os.urandom(200),
            magic + struct.pack("<HHQQ", 1, 0, 0, 1 << 40) + bytes(32),  # a bagpipe header announcing 1 TiB
            magic + struct.pack("<HHQQ", 1, 1, 0, 20) + os.urandom(232),  # a forged inline message
            b"\x00" * 64, b"\xff" * 100000]
hits = 0
for addr, port in targets:
    for data in payloads:
        try:
            s = socket.create_connection((addr, port), timeout=2)
        except OSError as e:
            print(f"stranger: could not connect to {addr}:{port}: {e}", flush=True)
            continue
        hits += 1
        try:
            with s:
                s.sendall(data)
                time.sleep(0.005)
        except OSError as e:  # the peer hung up on the garbage: fine
            print(f"stranger: {addr}:{port} hung up: {e}", flush=True)
print(f"stranger: {hits} connections", flush=True)
# the rendezvous store, as a client: a key of its own, and bagpipe's arrival counter
import datetime
import torch.distributed as dist
store = dist.TCPStore(targets[0][0], int(os.environ["STORE_PORT"]), is_master=False, timeout=datetime.timedelta(seconds=5))
store.set("stranger", "was here")
store.add("bagpipe/attempt-0/arrived", 100)
print("stranger: wrote to the store", flush=True)
"""


@pytest.mark.timeout(540)
def test_a_two_host_job_shrugs_off_a_stranger_and_recovers_from_losing_a_host(tiny_data, tmp_path, full_digest):
    out = tmp_path / "job"
    out.mkdir()
    with EmulatedNet("mh") as net:
        procs = start_hosts(net, tiny_data, out, STEPS, "--checkpoint-every", EVERY)
        wait_for(lambda: heartbeat(out) >= 2, procs, "step 2")
        # 1. a stranger, while the job runs
        roles = [pid for h, agent in zip(net.hosts.values(), procs) for pid in workers(net, h, agent)]
        assert len(roles) == 4, roles
        for pid in roles:  # hold the job still (its sockets stay open) while the stranger works at its own pace
            os.kill(pid, signal.SIGSTOP)
        # every port another host can reach: on the host's address or any address (not its loopback)
        targets = sorted(
            f"{h.addr}:{port}"
            for h in net.hosts.values()
            for ip, port in net.listening(h)
            if ip in (h.addr, "0.0.0.0", "::")
        )
        assert f"{net.hosts['h0'].addr}:{PORT}" in targets and len(targets) > 1  # the store and gloo's listeners
        stranger = net.add("x")
        r = net.run(
            stranger,
            [sys.executable, "-c", STRANGER, *targets],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ, STORE_PORT=str(PORT)),
        )
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"stranger: {7 * len(targets)} connections" in r.stdout and "wrote to the store" in r.stdout, r.stdout
        assert heartbeat(out) < STEPS and all(p.poll() is None for p in procs), "the job ended before the stranger did"
        for pid in roles:
            os.kill(pid, signal.SIGCONT)
        # 2. every role of host 1 (server 1, the oracle) killed after the first checkpoint: once
        # it is complete (its LATEST written; the parts are written while training goes on, so a
        # few steps after it are not enough on a loaded machine)
        wait_for(
            lambda: heartbeat(out) >= EVERY + 3 and (out / "checkpoints" / "LATEST").exists(),
            procs,
            f"step {EVERY + 3} and the first complete checkpoint",
        )
        assert sorted(p for h, agent in zip(net.hosts.values(), procs) for p in workers(net, h, agent)) == sorted(
            roles
        ), "a role was restarted before the kill: the stranger did something"
        victims = workers(net, net.hosts["h1"], procs[1])
        assert len(victims) == 2, victims
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        logs = finish(net, procs)
        for k, text in enumerate(logs):  # kept beside the run, to read after a failure
            (tmp_path / f"host{k}.log").write_text(text)
        assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
        assert digest(out) == full_digest(STEPS)
        assert f"resumed from step {EVERY}" in logs[0] or f"resumed from step {2 * EVERY}" in logs[0], logs[0][-3000:]
        for h in net.hosts.values():
            assert net.pids(h) == []


def test_bench_cluster_quick(tmp_path, capsys):
    out = tmp_path / "cluster"
    assert main(["bench", "cluster", "--quick", "--out", str(out)]) == 0
    payload = json.loads((out / "results.json").read_text())
    res = payload["results"]
    assert set(res) == {"20/1/nocache", "20/1/lookahead-L4"}
    assert all(v["digest_equals_full"] is True for v in res.values())
    for role, p in payload["probes_mbit"]["20"].items():
        want = 20 if role == "trainer 0" else 50
        # never above the shaped rate; below it only as far as a loaded 2-core machine slows
        # the probe's sender (16% seen with two other jobs running)
        assert all(0.75 < p[d] / want < 1.10 for d in ("sent", "received")), (role, p)
    assert res["20/1/lookahead-L4"]["speedup_over_nocache"] > 1
    for v in res.values():
        for role, dirs in v["bytes_vs_model"].items():
            for d, ratio in dirs.items():
                if (
                    v["model_bytes_per_step"][role][d] > 10_000
                ):  # not the oracle's credits: start-up chatter weighs more
                    # below the model as far as write-backs still queued on a slowed link when the
                    # counters are read (17% seen under load); never more than 15% above it
                    assert 0.75 < ratio < 1.15, (v["config"], role, d, ratio)
        # the steps after the warm-up against the model of the same steps (a synchronous mode:
        # no prefetch runs ahead of the counters)
        if v["mode"] == "nocache":
            for d, ratio in v["bytes_vs_model_measured_steps"]["trainer 0"].items():
                assert 0.85 < ratio < 1.15, (d, ratio)
        # every host's TCP counted over the run: what it sent, and the share it sent again
        assert set(v["tcp"]) == set(v["bytes_per_step"]), v["config"]
        assert v["tcp"]["trainer 0"]["segments_per_step"] > 0 and v["tcp"]["server 0"]["segments_per_step"] > 0
        assert all(0 <= t["retransmitted_share"] <= 1 for t in v["tcp"].values())
    assert "TCP segments sent again" in (out / "results.md").read_text()
    # every host ran Linux's default congestion control, not whatever this machine's is
    assert payload["config"]["congestion_control"] == "cubic" and "(TCP: cubic)" in (out / "results.md").read_text()
    assert (out / "cluster.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.getpid() not in run_namespaces()
