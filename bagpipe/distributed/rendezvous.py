"""Meeting the job's other processes: the rendezvous store at MASTER_ADDR:MASTER_PORT.

Rank 0 listens there (a local job's store on loopback only: :func:`loopback_listener`),
every role counts its arrival; a rendezvous that cannot finish -- a port held by a
stranger, roles started with another WORLD_SIZE -- fails in one line within a bounded
time (:func:`bounded`); one that fails before its time-out (the process serving the
store stopped) says so, and after how long."""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
import threading
import time
from datetime import timedelta

from bagpipe.config.environ import MAX_PORT, env_int
from bagpipe.distributed.layout import Layout, check_shapes
from bagpipe.distributed.superseded import attempt_prefix
from bagpipe.errors import BagpipeError, ConfigError

log = logging.getLogger(__name__)

# Beyond --rendezvous-timeout, how long a rendezvous may take to report its own time-out
# before the role stops waiting for it.
RENDEZVOUS_GRACE_S = 3.0


def rendezvous(layout: Layout, rank: int, timeout_s: float):
    """Meet the job's other processes at MASTER_ADDR:MASTER_PORT (rank 0 listens there);
    says what it waits for, and fails in one line when the port is taken or the others
    do not come within ``timeout_s``. Returns the job's TCPStore."""
    import torch.distributed as dist

    name, world = layout.name(rank), layout.world_size
    addr, port = os.environ["MASTER_ADDR"], env_int("MASTER_PORT", lo=1, hi=MAX_PORT)
    try:
        socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise ConfigError(
            f"{name}: cannot resolve the master host {addr!r} ({getattr(e, 'strerror', None) or e}); "
            "check MASTER_ADDR / --master-addr"
        ) from None
    log.info(
        f"{name} (rank {rank} of {world}): waiting for the job's other processes at {addr}:{port} "
        f"(up to {timeout_s:.0f} s)"
    )
    # Under torchrun the agent already serves a store at MASTER_ADDR:MASTER_PORT (every
    # rank is its client, as torch's own env:// rendezvous does), and it keeps it across
    # restarts: each attempt counts its arrivals under its own prefix.
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    prefix = attempt_prefix(env_int("TORCHELASTIC_RESTART_COUNT", 0))
    deadline = time.monotonic() + timeout_s

    master = rank == 0 and not agent

    def meet():
        store = dist.TCPStore(
            addr,
            port,
            world,
            is_master=master,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            multi_tenant=not agent,
            master_listen_fd=loopback_listener(addr, port, name) if master else None,
        )
        store = dist.PrefixStore(prefix, store)
        store.add("arrived", 1)
        store.set(f"layout/{rank}", layout.shape)
        while store.add("arrived", 0) < world:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Timed out: {store.add('arrived', 0)} of {world} arrived")
            time.sleep(0.05)
        check_shapes(store, layout, name, deadline, master)  # a role of another job shape counts as arrived too
        return store

    timed_out = BagpipeError(
        f"{name}: the job's other processes did not all arrive at {addr}:{port} within {timeout_s:.0f} s "
        f"(rank {rank} of {world}); start every role with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, "
        "or raise --rendezvous-timeout"
    )
    started = time.monotonic()
    try:
        return bounded(meet, timeout_s + RENDEZVOUS_GRACE_S)
    except TimeoutError:  # still waiting for an answer: a stranger holds the port, or nobody does
        if not _listening(addr, port):
            raise timed_out from None
        raise BagpipeError(
            f"{name}: nothing answered as a bagpipe job at {addr}:{port} within {timeout_s:.0f} s (is another "
            "program listening on that port?); choose another MASTER_PORT / --master-port, or raise "
            "--rendezvous-timeout"
        ) from None
    except RuntimeError as e:  # DistNetworkError, DistStoreError
        text = str(e)
        if "EADDRINUSE" in text or "address already in use" in text:
            raise ConfigError(
                f"{name}: port {port} on {addr} is taken (another job, or a process left over?); "
                "choose another MASTER_PORT / --master-port"
            ) from None
        waited = time.monotonic() - started
        if waited >= timeout_s:
            raise timed_out from None
        raise BagpipeError(  # not a time-out: say what happened, and when
            f"{name}: the rendezvous at {addr}:{port} failed after {waited:.1f} s (rank {rank} of {world}): "
            f"{_reason(text)}; is the job's rank 0 (or torchrun's agent) running there? start it, then this role again"
        ) from None


def _reason(text: str) -> str:
    """What torch's store error says happened, in a few words."""
    if "Connection was likely closed" in text or "Connection reset" in text:
        return "the process serving it closed the connection (it stopped, or refused this role)"
    first = text.strip().splitlines()[0] if text.strip() else "no reason given"
    return first[:200]


def loopback_listener(addr: str, port: int, name: str) -> int | None:
    """A listening socket's file descriptor for the rendezvous store at a loopback
    ``addr`` (a local job's: torch's store would otherwise listen on every interface), or
    None for another address (a host of a multi-host job must be reachable from the others).
    The store takes the descriptor over."""
    try:
        infos = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except OSError:
        return None
    family, _, _, _, sockaddr = infos[0]
    if not ipaddress.ip_address(sockaddr[0]).is_loopback:
        return None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(socket.SOMAXCONN)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"{name}: port {port} on {addr} is taken (another job, or a process left over?); "
                "choose another MASTER_PORT / --master-port"
            ) from None
        raise
    return sock.detach()


def _listening(addr: str, port: int) -> bool:
    """Whether something accepts TCP connections at addr:port."""
    try:
        with socket.create_connection((addr, port), timeout=2):
            return True
    except OSError:
        return False


def bounded(fn, seconds: float):
    """``fn()`` on a daemon thread, waited for at most ``seconds``: its result, its
    exception, or TimeoutError when it has not returned by then. A TCPStore client
    connected to a listener that is not a store (any program can hold the port) waits
    for an answer that never comes, whatever its own time-out says; the thread is left
    behind blocked (the process is about to report and exit)."""
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=run, daemon=True, name="bagpipe-rendezvous")
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise TimeoutError
    if "error" in box:
        raise box["error"]
    return box["result"]
