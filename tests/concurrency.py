"""Threads and an in-memory network for the concurrency tests: no processes.

Shared by ``tests/unit/cache/test_executors.py``, ``tests/unit/distributed/test_servers.py``
and ``tests/unit/distributed/test_superseded.py``:

* :func:`wait_until` and :class:`Background` (a call in a thread of its own -- another
  trainer, a server process, a blocking call -- whose value or exception is taken back
  within a bound);
* :func:`threads_all_end` and the fixture ``every_thread_ends`` around it (a module asks for
  it with ``pytest.mark.usefixtures``): a test that leaves a thread running fails;
* :class:`Cluster`, :func:`cluster_maker` and the fixture ``clusters`` (S embedding servers
  serving N :class:`RemoteStore` clients over a :class:`FakeNet`, every one shut down
  afterwards);
* the small table the tests share (:func:`small_table`) and recognisable row values
  (:func:`row_values`).

The root ``conftest.py`` loads this module as a pytest plugin, so its fixtures are found
from every folder.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np
import pytest
from fakes import FakeNet, join_all, role_name

from bagpipe.distributed.server import EmbeddingServer, RemoteStore, ShardInit
from bagpipe.distributed.transport import Transport
from bagpipe.store.init import RowInitializer
from bagpipe.store.memory import MemoryStore

D = 4  # embedding dimension
S_DIM = 1  # optimizer state per row
SOON = 5.0  # "promptly": generous for two busy cores
HELD = 0.3  # how long a test watches something that must *not* happen


def small_table() -> RowInitializer:
    """Two tables of 5 and 3 rows, ``D`` wide."""
    return RowInitializer([5, 3], D, seed=7)


# threads ---------------------------------------------------------------------------
def wait_until(cond: Callable[[], bool], within: float = SOON) -> bool:
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


class Background:
    """``fn()`` in a thread of its own (another trainer, a server process, a blocking call)."""

    def __init__(self, fn: Callable, name: str = "test-background"):
        self.value: Any = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(fn,), name=name, daemon=True)
        self.thread.start()

    def _run(self, fn) -> None:
        try:
            self.value = fn()
        except BaseException as e:  # noqa: BLE001 - handed to result()
            self.error = e
        finally:
            self._done.set()

    def finished(self, within: float = 0.0) -> bool:
        return self._done.wait(within)

    def result(self, within: float = SOON):
        """fn's value, or its exception raised here; fails if fn is still running after ``within`` s."""
        assert self._done.wait(within), f"{self.thread.name} still running after {within} s"
        self.thread.join(within)
        if self.error is not None:
            raise self.error
        return self.value


@contextmanager
def threads_all_end() -> Iterator[None]:
    """Fails if a thread started inside the block is still running ``SOON`` after it."""
    before = set(threading.enumerate())
    yield

    def left():
        return [t.name for t in threading.enumerate() if t not in before and t.is_alive()]

    assert wait_until(lambda: not left()), f"threads still running: {left()}"


# EmbeddingServer and RemoteStore ---------------------------------------------------
class Cluster:
    """S embedding servers serving N RemoteStore clients over a :class:`FakeNet`.

    Trainers are ranks 0..N-1, servers N..N+S-1. Each server's ``serve()`` runs in a
    thread; when it ends, its "process" exits (its rank's connections close).
    """

    def __init__(self, init: RowInitializer, trainers: int, servers: int):
        self.net = FakeNet()
        name = role_name(trainers)
        self.trainer_ranks = list(range(trainers))
        self.server_ranks = list(range(trainers, trainers + servers))
        t = {r: Transport(name, self.net.wire(r)) for r in self.trainer_ranks + self.server_ranks}
        assert not join_all(t, {r: self.server_ranks if r < trainers else self.trainer_ranks for r in t})
        self.servers = [
            EmbeddingServer(MemoryStore(ShardInit(init, k, servers), S_DIM), t[r], self.trainer_ranks)
            for k, r in enumerate(self.server_ranks)
        ]
        self.serving = [
            Background(partial(self._serve, srv, r), f"server {k}")
            for k, (srv, r) in enumerate(zip(self.servers, self.server_ranks))
        ]
        self.clients = [RemoteStore(init, S_DIM, t[r], self.server_ranks) for r in self.trainer_ranks]

    def _serve(self, server: EmbeddingServer, rank: int):
        try:
            return server.serve()
        finally:
            self.net.kill(rank)

    def requests(self, op: str) -> list[int]:
        return [srv.report.requests.get(op, 0) for srv in self.servers]

    def shutdown(self) -> None:
        self.net.kill(*self.trainer_ranks, *self.server_ranks)
        for b in self.serving:
            b.finished(SOON)


@contextmanager
def cluster_maker() -> Iterator[Callable[..., Cluster]]:
    """``make(init, trainers=2, servers=2)``; every cluster made is shut down at the end."""
    made: list[Cluster] = []

    def make(init: RowInitializer, trainers: int = 2, servers: int = 2) -> Cluster:
        made.append(Cluster(init, trainers, servers))
        return made[-1]

    try:
        yield make
    finally:
        for c in made:
            c.shutdown()


def row_values(n: int, tag: float) -> tuple[np.ndarray, np.ndarray]:
    """Recognisable values for n rows: weights tag + 0.01 * i, state -tag."""
    w = (tag + 0.01 * np.arange(n * D, dtype=np.float32)).reshape(n, D).astype(np.float32)
    return w, np.full((n, S_DIM), -tag, np.float32)


@pytest.fixture
def every_thread_ends() -> Iterator[None]:
    """Fails a test that leaves a thread running (after its fixtures have cleaned up)."""
    with threads_all_end():
        yield


@pytest.fixture
def clusters() -> Iterator[Callable[..., Cluster]]:
    """``clusters(init, trainers=2, servers=2)``; every one shut down afterwards."""
    with cluster_maker() as make:
        yield make
