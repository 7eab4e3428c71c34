"""Stand-ins for torch.distributed in thread tests: trainers are threads of one process, and
gloo point-to-point is an in-memory network (:class:`FakeNet`)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from bagpipe.distributed.transport import Transport


class FakeAllReduce:
    """Sums the k-th ``all_reduce`` of each of ``n`` threads (each thread passes its index as ``group``)."""

    def __init__(self, n: int):
        self.n = n
        self.calls: dict[int, dict] = {}
        self.count = [0] * n
        self.lock = threading.Lock()

    def __call__(self, tensor, op=None, group=None, async_op=False):
        me = int(group)
        with self.lock:
            k = self.count[me]
            self.count[me] += 1
            call = self.calls.setdefault(k, {"parts": {}, "done": threading.Event()})
            call["parts"][me] = tensor
            if len(call["parts"]) == self.n:
                total = sum(t.clone() for t in call["parts"].values())
                for t in call["parts"].values():
                    t.copy_(total)
                call["done"].set()
        work = _Work(call["done"])
        if async_op:
            return work
        work.wait()
        return None


class _Work:
    def __init__(self, done: threading.Event):
        self.done = done

    def wait(self) -> None:
        assert self.done.wait(timeout=10), "the other trainer never joined the all-reduce"


# a fake wire -----------------------------------------------------------------------
GLOO_CLOSED = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:{port}"
SECRET = b"a test job's secret, 32+ bytes.."


class FakeNet:
    """gloo point-to-point in memory, for :class:`Transport` instances in threads of one process.

    One FIFO per (src, dst, tag); a send copies its tensor (the sender may reuse it) and
    returns at once; a recv takes the next message into the start of its tensor as gloo
    does: a shorter message leaves the rest of the tensor as it was, a longer one is a
    test failure (gloo would abort the receiving process). ``kill(rank)`` is a process
    dying: what it sent before still arrives, then every send or recv to or from it
    raises gloo's RuntimeError. A recv that waits longer than ``timeout`` fails the test.

    ``tamper(src, dst, tag, data)`` (None: off) sees the bytes of every send and returns
    the list of messages to deliver instead (a man in the middle); ``inject`` delivers
    raw bytes as if ``src`` had sent them.
    """

    def __init__(self, timeout: float = 20.0):
        self.timeout = timeout
        self._cond = threading.Condition()
        self._fifos: dict[tuple[int, int, int], deque] = defaultdict(deque)
        self._dead: set[int] = set()
        self.tamper: Callable[[int, int, int, bytes], list[bytes]] | None = None

    def wire(self, rank: int) -> FakeWire:
        return FakeWire(self, rank)

    def kill(self, *ranks: int) -> None:
        with self._cond:
            self._dead.update(ranks)
            self._cond.notify_all()

    def inject(self, src: int, dst: int, tag: int, data: bytes) -> None:
        with self._cond:
            self._fifos[(src, dst, tag)].append(bytes(data))
            self._cond.notify_all()

    def _check(self, a: int, b: int) -> None:
        for r in (a, b):
            if r in self._dead:
                raise RuntimeError(GLOO_CLOSED.format(port=29500 + r))


class FakeWire:
    """One rank's end of a :class:`FakeNet`; ``sent`` lists (peer, tag, bytes) of every send."""

    def __init__(self, net: FakeNet, rank: int):
        self.net, self._rank = net, rank
        self.sent: list[tuple[int, int, int]] = []

    def rank(self) -> int:
        return self._rank

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        net = self.net
        data = tensor.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
        with net._cond:
            net._check(self._rank, peer)
            self.sent.append((peer, tag, len(data)))
            out = [data] if net.tamper is None else net.tamper(self._rank, peer, tag, data)
            net._fifos[(self._rank, peer, tag)].extend(out)
            net._cond.notify_all()
        time.sleep(0)  # let another thread run between the parts of a message

    def recv(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        net = self.net
        deadline = time.monotonic() + net.timeout
        with net._cond:
            # under the lock: a defaultdict's missing key made by two threads at once gives
            # each its own deque, and a message sent to the other one is never received
            fifo = net._fifos[(peer, self._rank, tag)]
            while not fifo:
                net._check(self._rank, peer)
                left = deadline - time.monotonic()
                assert left > 0, f"fake wire: rank {self._rank} got nothing from rank {peer} on tag {tag}"
                net._cond.wait(left)
            got = fifo.popleft()
        room = tensor.numel() * tensor.element_size()
        assert len(got) <= room, f"gloo would abort: a message of {len(got)} bytes received into {room}"
        if got:
            tensor.view(torch.uint8).reshape(-1)[: len(got)] = torch.frombuffer(bytearray(got), dtype=torch.uint8)


def role_name(trainers: int) -> Callable[[int], str]:
    return lambda r: f"trainer {r}" if r < trainers else f"server {r - trainers}"


def join_all(
    transports: dict[int, Transport], peers: dict[int, list[int]], secret: bytes | dict[int, bytes] = SECRET
) -> dict[int, BaseException]:
    """Run every transport's ``join(peers[rank], secret)`` at once, each in a thread, as the
    processes of a job do (one that fails leaves the net); returns the exceptions raised, by rank.
    ``secret`` is one for all, or each rank's own (a dict by rank). Every transport's wire is a
    :class:`FakeWire`."""
    errors: dict[int, BaseException] = {}

    def run(rank: int) -> None:
        try:
            transports[rank].join(peers[rank], secret if not isinstance(secret, dict) else secret[rank])
        except BaseException as e:  # noqa: BLE001 - returned
            errors[rank] = e
            wire = transports[rank].wire
            assert isinstance(wire, FakeWire)
            wire.net.kill(rank)  # a role that fails to join exits, as its process would

    threads = [threading.Thread(target=run, args=(r,), name=f"join-{r}") for r in transports]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return errors
