"""The rendezvous store of a local job listens on loopback only.

torch's TCPStore listens on every interface whatever address it is given; for a
MASTER_ADDR on loopback (every local job's) rank 0 hands it a socket bound there
(:func:`bagpipe.distributed.rendezvous.loopback_listener`), so nothing outside the machine
can reach a local job's rendezvous. A multi-host job's address is left to torch.
"""

from __future__ import annotations

import socket
import threading

import pytest

from bagpipe.distributed.layout import Layout
from bagpipe.distributed.rendezvous import loopback_listener, rendezvous
from bagpipe.errors import BagpipeError, ConfigError

pytestmark = pytest.mark.unit


def listening(port: int) -> list[str]:
    """The local addresses listening on TCP ``port`` (from /proc/net/tcp and tcp6)."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            host, hport = local.split(":")
            if state == "0A" and int(hport, 16) == port:  # 0A: LISTEN
                found.append(host if len(host) == width else "?")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_local_jobs_rendezvous_listens_on_loopback_only(monkeypatch):
    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    seen: list[list[str]] = []
    failed: list[BaseException] = []

    def rank0():
        try:
            rendezvous(Layout(trainers=1, servers=1), 0, timeout_s=3)  # the others never come
        except BagpipeError as e:
            failed.append(e)

    t = threading.Thread(target=rank0)
    t.start()
    for _ in range(200):  # until the store listens
        seen.append(listening(port))
        if seen[-1]:
            break
        threading.Event().wait(0.02)
    t.join(30)
    assert seen[-1] == ["0100007F"], seen[-1]  # 127.0.0.1, little-endian hex; not 0.0.0.0 or ::
    assert failed and "did not all arrive" in str(failed[0])


def test_the_listener_is_for_loopback_addresses_only():
    port = free_port()
    fd = loopback_listener("127.0.0.1", port, "trainer 0")
    assert fd is not None
    try:
        assert listening(port) == ["0100007F"]
        with pytest.raises(ConfigError, match=f"trainer 0: port {port} on 127.0.0.1 is taken"):
            loopback_listener("127.0.0.1", port, "trainer 0")
    finally:
        socket.socket(fileno=fd).close()
    assert loopback_listener("192.0.2.1", port, "trainer 0") is None  # another host's address: torch's way
