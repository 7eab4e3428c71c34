"""Emulated hosts on one machine: network namespaces on a bridge, every link shaped.

An :class:`EmulatedNet` is a set of hosts, each a network namespace with one
interface (``eth0``, MTU 1500, TSO/GSO/GRO off so that every packet on the wire is at
most one MTU, as on a real NIC without offloads) and its own address in a private
/24, joined by a bridge that lives in a namespace of its own (the *switch*): nothing
is added to the machine's own network namespace, and only addresses of namespaces
this run made are used. A host's link is shaped in both directions with ``tbf`` at
its rate: on ``eth0`` (what the host sends) and on its port of the bridge (what it
receives). ``netem`` is not needed (there is no added delay: bandwidth only). Every host
runs TCP with :data:`CONGESTION_CONTROL` (cubic, Linux's default) unless told otherwise,
set on its route to the others (``congctl``): a new namespace inherits the machine's
default, which may be another (bbr here), and may only change it to one the machine allows.

Names: every namespace of a run is ``bp<pid>s<start>-<name>``, ``<pid>`` the process
that made it and ``<start>`` that process's start time (clock ticks after boot, from
/proc/<pid>/stat), so that a pid the kernel has given to another process since is not
taken for the run's. The bridge and every veth live inside these namespaces: nothing
of a run is outside them. At start the namespaces of runs whose process is gone (a
crash, a SIGKILL) are removed, with every process left inside them, and said in one
line per run; on leaving the ``with`` block -- normally, on an exception, on Ctrl-C,
and on SIGTERM, which :func:`terminate_as_interrupt` turns into KeyboardInterrupt --
every process left in the run's namespaces is killed and the namespaces removed.

Where namespaces cannot be made (not root, no ``ip``/``tc``, a kernel without network
namespaces or ``tbf``), :func:`unavailable` says why in one line; tests and the
``bench cluster`` scenario skip with it.

Used by ``bagpipe bench cluster`` and by the multi-host tests (``tests/distributed/test_multihost.py``).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bagpipe import lifeline
from bagpipe.errors import BagpipeError
from bagpipe.testbed.tcpstats import TcpCounters

PREFIX = "bp"
SUBNET = "10.77.0"  # inside the run's own namespaces only: it never meets the machine's network
MTU = 1500
IFACE = "eth0"
SWITCH = "sw"
BURST_BYTES = 16 * 1024  # tbf bucket at the lowest rates (a few frames); 1 ms of traffic at high ones
LATENCY_MS = 50  # tbf queue: how long a packet may wait before it is dropped
#: TCP congestion control of every emulated host: Linux's default. A new namespace
#: inherits the machine's (bbr on some), which is not what the emulated hosts would run.
CONGESTION_CONTROL = "cubic"


log = logging.getLogger(__name__)
#: A run's namespace: ``bp<pid>s<start>-<name>`` (``s<start>`` absent in older names).
NAME = re.compile(rf"^{PREFIX}(\d+)(?:s(\d+))?-\S+$")


def run_tag(pid: int | None = None) -> str:
    """The prefix of every namespace name of the run of process ``pid`` (this one by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{PREFIX}{pid}s{lifeline.start_time(pid) or 0}"


def owner_gone(ns: str) -> bool:
    """Whether the process that made namespace ``ns`` (a name of :data:`NAME`) has ended:
    no process with its pid, or one that started at another time (the pid reused)."""
    m = NAME.match(ns)
    if m is None:
        return False  # not a run's namespace: never ours to remove
    pid, start = int(m.group(1)), m.group(2)
    if start is None or start == "0":
        return not _alive(pid)
    return lifeline.start_time(pid) != int(start)


class NetnsError(BagpipeError):
    """A namespace, link or shaping command failed."""


@dataclass
class Host:
    """One emulated host: a namespace with ``eth0`` at ``addr``."""

    name: str
    ns: str
    addr: str
    port: str  # its interface on the switch (the bridge's port)
    rate_mbit: float | None = None  # both directions; None: not shaped
    procs: list[subprocess.Popen] = field(default_factory=list)

    def exec_prefix(self) -> list[str]:
        """Prefix of a command run inside this host."""
        return ["ip", "netns", "exec", self.ns]


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise NetnsError(f"`{' '.join(cmd)}` failed: {(r.stderr or r.stdout).strip()}")
    return r


def unavailable() -> str | None:
    """Why namespaces with shaped links cannot be made here (one line), or None."""
    if sys.platform != "linux":
        return "emulated hosts need Linux network namespaces"
    if os.geteuid() != 0:
        return "emulated hosts need root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"emulated hosts need `{tool}` (iproute2), not found"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        r = _run("ip", "netns", "add", probe, check=False)
        if r.returncode != 0:
            return f"cannot make a network namespace: {r.stderr.strip()}"
        r = _run("ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1", check=False)
        if r.returncode != 0:
            return f"cannot make a veth pair: {r.stderr.strip()}"
        r = _run(*f"tc -n {probe} qdisc add dev p0 root tbf rate 100mbit burst 64kb latency 50ms".split(), check=False)
        if r.returncode != 0:
            return f"cannot shape a link with tbf: {r.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


def run_namespaces() -> dict[int, list[str]]:
    """Every namespace made by a bagpipe run on this machine, by the pid of its run."""
    out: dict[int, list[str]] = {}
    r = _run("ip", "netns", "list", check=False)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = NAME.match(name)
        if m:
            out.setdefault(int(m.group(1)), []).append(name)
    return out


def remove_stale() -> list[str]:
    """Remove the namespaces of runs whose process is gone (crashed, killed), and every
    process left inside them; says so in one line per run; returns their names."""
    removed = []
    for pid, names in run_namespaces().items():
        stale = [ns for ns in names if owner_gone(ns)]
        killed = sum(_remove(ns) for ns in stale)
        if stale:
            more = f", and stopped the {killed} process(es) left in them" if killed else ""
            log.info(
                f"removed the {len(stale)} network namespace(s) of bagpipe pid {pid}, which is gone "
                f"({', '.join(stale)}){more}"
            )
        removed += stale
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _remove(ns: str) -> int:
    """Kill every process inside ``ns`` (only this run's), then remove it; returns how
    many processes were killed."""
    killed: set[int] = set()
    for _ in range(50):
        pids = [int(p) for p in _run("ip", "netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
                killed.add(p)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    _run("ip", "netns", "del", ns, check=False)
    return len(killed)


class EmulatedNet:
    """Hosts on one bridge (see the module docstring). Use as a context manager::

    with EmulatedNet("bench") as net:
        a = net.add("t0", rate_mbit=1000)
        b = net.add("s0", rate_mbit=2500)
        net.popen(a, ["python", ...])
    """

    def __init__(self, label: str = "", congestion_control: str | None = CONGESTION_CONTROL):
        self.tag = run_tag()
        self.congestion_control = congestion_control  # None: the machine's, inherited
        self.label = re.sub(r"[^a-z0-9]", "", label.lower())[:6]
        self.switch = f"{self.tag}-{self.label}{SWITCH}"
        self.hosts: dict[str, Host] = {}
        self._up = False

    def __enter__(self) -> EmulatedNet:
        reason = unavailable()
        if reason:
            raise NetnsError(reason)
        remove_stale()
        self._remove_mine()  # a name of this run left over (an earlier net of this process)
        _run("ip", "netns", "add", self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        self._up = True
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every process this net started, then remove its namespaces (idempotent)."""
        for h in self.hosts.values():
            for p in h.procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        p.kill()
                    p.wait()
        self._remove_mine()
        self.hosts.clear()
        self._up = False

    def _remove_mine(self) -> None:
        prefix = f"{self.tag}-{self.label}"
        for ns in run_namespaces().get(os.getpid(), []):
            if ns.startswith(prefix):
                _remove(ns)

    def add(self, name: str, rate_mbit: float | None = None) -> Host:
        """A new host ``name`` on the bridge, its link shaped to ``rate_mbit`` both ways."""
        if not self._up:
            raise NetnsError("the emulated net is not up (use it as a context manager)")
        index = len(self.hosts) + 1
        if index > 250:
            raise NetnsError("at most 250 emulated hosts")
        ns = f"{self.tag}-{self.label}{name}"[:64]
        port = f"p{index}"
        host = Host(name, ns, f"{SUBNET}.{index}", port)
        _run("ip", "netns", "add", ns)
        _run("ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", IFACE, "netns", ns)
        _run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
        for where, dev in ((self.switch, port), (ns, IFACE)):
            _run("ip", "-n", where, "link", "set", dev, "mtu", str(MTU), "up")
            self._offloads_off(where, dev)
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", ns, "addr", "add", f"{host.addr}/24", "dev", IFACE)
        if self.congestion_control:  # on the route: the namespace's default may only be an "allowed" one
            _run("ip", "-n", ns, "route", "replace", f"{SUBNET}.0/24", "dev", IFACE, "congctl", self.congestion_control)
        self.hosts[name] = host
        if rate_mbit:
            self.shape(host, rate_mbit)
        return host

    def shape(self, host: Host, rate_mbit: float) -> None:
        """Shape both directions of ``host``'s link to ``rate_mbit`` (replacing any earlier shaping)."""
        for where, dev in ((host.ns, IFACE), (self.switch, host.port)):
            _run(
                "tc",
                "-n",
                where,
                "qdisc",
                "replace",
                "dev",
                dev,
                "root",
                "tbf",
                "rate",
                f"{rate_mbit:g}mbit",
                "burst",
                str(max(BURST_BYTES, int(rate_mbit * 1e6 / 8 / 1000))),
                "latency",
                f"{LATENCY_MS}ms",
            )
        host.rate_mbit = rate_mbit

    def unshape(self, host: Host) -> None:
        """Remove the shaping of ``host``'s link (both directions)."""
        for where, dev in ((host.ns, IFACE), (self.switch, host.port)):
            _run("tc", "-n", where, "qdisc", "del", "dev", dev, "root", check=False)
        host.rate_mbit = None

    def _offloads_off(self, ns: str, dev: str) -> None:
        _run("ip", "netns", "exec", ns, sys.executable, "-m", "bagpipe.testbed.netns", "offloads-off", dev)

    def popen(self, host: Host, cmd: list[str], **kwargs) -> subprocess.Popen:
        """Start ``cmd`` inside ``host`` (its own session, so it and its children can be stopped together)."""
        p = subprocess.Popen(host.exec_prefix() + [str(c) for c in cmd], start_new_session=True, **kwargs)
        host.procs.append(p)
        return p

    def run(self, host: Host, cmd: list[str], timeout: float | None = None, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(host.exec_prefix() + [str(c) for c in cmd], timeout=timeout, **kwargs)

    def pids(self, host: Host) -> list[int]:
        """Every process inside ``host``."""
        return [int(p) for p in _run("ip", "netns", "pids", host.ns, check=False).stdout.split()]

    def listening(self, host: Host) -> set[tuple[str, int]]:
        """(address, port) of every TCP socket listening inside ``host`` (from /proc/PID/net/tcp of
        a process inside it, which shows that process's namespace); 0.0.0.0 for any address."""
        found: set[tuple[str, int]] = set()
        for pid in self.pids(host)[:1]:
            for name in ("tcp", "tcp6"):
                try:
                    lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
                except OSError:
                    continue
                for line in lines:
                    local, state = line.split()[1], line.split()[3]
                    if state != "0A":  # LISTEN
                        continue
                    addr, port = local.rsplit(":", 1)
                    if len(addr) == 8:  # IPv4, little-endian hex
                        ip = socket.inet_ntoa(bytes.fromhex(addr)[::-1])
                    else:
                        ip = "::" if int(addr, 16) == 0 else "::1" if addr.endswith("01000000") else addr
                    found.add((ip, int(port, 16)))
        return found

    def all_counters(self) -> dict[str, tuple[int, int]]:
        """(bytes sent, bytes received) so far of every host, read at one instant from the
        bridge's ports (what a port receives, its host sent)."""
        ports = {h.port: name for name, h in self.hosts.items()}
        out = {}
        for link in json.loads(_run("ip", "-n", self.switch, "-s", "-j", "link", "show").stdout):
            name = ports.get(link.get("ifname", "").split("@")[0])
            if name is not None:
                st = link["stats64"]
                out[name] = (int(st["rx"]["bytes"]), int(st["tx"]["bytes"]))
        return out

    def tcp_counters(self, host: Host) -> TcpCounters:
        """TCP's counters of ``host``'s namespace so far (every socket of the host)."""
        r = _run("ip", "netns", "exec", host.ns, "cat", "/proc/net/snmp", "/proc/net/netstat")
        return TcpCounters.parse(r.stdout)

    def counters(self, host: Host) -> tuple[int, int]:
        """(bytes sent, bytes received) on ``host``'s eth0 so far (Ethernet frames, headers included)."""
        info = json.loads(_run("ip", "-n", host.ns, "-s", "-j", "link", "show", IFACE).stdout)[0]["stats64"]
        return int(info["tx"]["bytes"]), int(info["rx"]["bytes"])


def probe_rate(net: EmulatedNet, src: Host, dst: Host, seconds: float, port: int = 5201) -> float:
    """Mbit/s one TCP stream achieves from ``src`` to ``dst`` in ``seconds`` (what the receiver
    counts from its first byte to the last)."""
    recv = net.popen(
        dst,
        [sys.executable, "-m", "bagpipe.testbed.netns", "probe-recv", dst.addr, str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        r = net.run(
            src,
            [sys.executable, "-m", "bagpipe.testbed.netns", "probe-send", dst.addr, str(port), str(seconds)],
            timeout=seconds + 30,
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise NetnsError(f"the link probe from {src.name} to {dst.name} failed: {r.stderr.strip()[-300:]}")
        got = recv.communicate(timeout=30)[0]
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    return float(got.strip().splitlines()[-1])


def _probe_recv(addr: str, port: int) -> None:
    with socket.create_server((addr, port)) as srv:
        conn, _ = srv.accept()
        with conn:
            n, first, last = 0, 0.0, 0.0
            buf = bytearray(1 << 20)
            while True:
                k = conn.recv_into(buf)
                if not k:
                    break
                last = time.perf_counter()
                first = first or last
                n += k
    print(f"{n * 8 / (last - first) / 1e6 if n and last > first else 0.0:.3f}")


def _probe_send(addr: str, port: int, seconds: float) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    chunk = b"\0" * (1 << 18)
    with conn:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.sendall(chunk)


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises KeyboardInterrupt, so ``with EmulatedNet`` still cleans up."""

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


# TSO/GSO/GRO off without ethtool: the SIOCETHTOOL ioctl it makes -------------------------
_SIOCETHTOOL = 0x8946
_SET = {"tso": 0x1F, "gso": 0x24, "gro": 0x2C}  # ETHTOOL_STSO, ETHTOOL_SGSO, ETHTOOL_SGRO


def offloads_off(dev: str) -> None:
    """Turn TCP segmentation, generic segmentation and generic receive offload off on ``dev``
    (in the calling process's namespace)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name, cmd in _SET.items():
            buf = ctypes.create_string_buffer(struct.pack("II", cmd, 0))
            ifr = struct.pack("16sP", dev.encode(), ctypes.addressof(buf))
            try:
                fcntl.ioctl(s.fileno(), _SIOCETHTOOL, ifr)
            except OSError as e:
                raise NetnsError(f"cannot turn {name} off on {dev}: {e.strerror}") from None


def main(argv: list[str]) -> int:
    """``python -m bagpipe.testbed.netns offloads-off DEV | probe-recv ADDR PORT | probe-send ADDR PORT SECONDS``
    (run inside a namespace), or ``clean`` (remove the namespaces of runs that are gone)."""
    lifeline.watch("bagpipe.testbed.netns")  # a probe started by bench ends with it
    if argv[:1] == ["offloads-off"] and len(argv) == 2:
        offloads_off(argv[1])
        return 0
    if argv[:1] == ["probe-recv"] and len(argv) == 3:
        _probe_recv(argv[1], int(argv[2]))
        return 0
    if argv[:1] == ["probe-send"] and len(argv) == 4:
        _probe_send(argv[1], int(argv[2]), float(argv[3]))
        return 0
    if argv == ["clean"]:
        for ns in remove_stale():
            print(f"removed {ns}")
        return 0
    print(
        "usage: python -m bagpipe.testbed.netns offloads-off DEV | probe-recv ADDR PORT | probe-send ADDR PORT SECONDS | clean",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
