"""The one small interface every distributed role talks through.

A :class:`Transport` moves Python objects (dicts of numpy arrays and numbers) between
ranks, on a *stream* (a tag): messages on one stream between two ranks arrive in the
order they were sent. Nothing else in bagpipe touches the wire.

Why gloo point-to-point and not ``torch.distributed.rpc``: both ship with torch 2.13,
but rpc (TensorPipe) is no longer developed upstream, and for the messages bagpipe
sends -- one step's fetch split over the servers, a few hundred KiB -- a round trip
through this transport took 0.67-0.82 ms against 1.17-1.38 ms for ``rpc_sync`` on
this machine (``benchmarks/transport.py``; latency dominates at that size; at 4.9 MiB
TensorPipe moved the bytes faster, see docs/distributed.md). gloo is also the backend
DDP already uses on CPU, so one library carries every byte.

A message is one fixed-size header send -- stream, sizes, and the pickle (protocol 5)
of the object when it is small, as most requests are -- then the pickle if it did not
fit, then every large numpy array of the object *out of band*, straight from its
memory into the receiver's (pickle's buffer_callback / buffers), so rows are never
copied through the pickle stream. Each gloo message costs ~0.15 ms on loopback, so
the header carries what it can. A per-peer lock keeps the sends of a message together
when several threads of one process talk to the same peer.

The point-to-point calls themselves go through a *wire* (:class:`GlooWire` unless
another is given): the framing above can then be tested without a process group,
over an in-memory wire (``tests/test_concurrency.py``).
"""

from __future__ import annotations

import pickle
import re
import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from bagpipe.errors import BagpipeError

# streams (gloo tags); one per direction of each conversation
REQUEST = 1  # client -> embedding server
REPLY = 2  # embedding server -> client
PLAN = 3  # oracle -> trainer
CREDIT = 4  # trainer -> oracle
CONTROL = 5  # trainer 0 -> other roles (setup, end)

HEADER_BYTES = 4096
_MAX_BUFFERS = 28  # out-of-band arrays per message; their sizes follow the 4 header fields
_INLINE_AT = 8 * (4 + _MAX_BUFFERS)  # where a small pickle starts inside the header
_INLINE_BYTES = HEADER_BYTES - _INLINE_AT


class PeerLost(BagpipeError):
    """A peer's connection broke (it died, or its machine did): names the peer's role."""


class GlooWire:
    """The wire a :class:`Transport` uses by default: gloo point-to-point on the default
    process group. A wire moves one tensor at a time; a test may pass another object
    with the same three methods."""

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        dist.send(tensor, dst=peer, tag=tag)

    def recv(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        """Fill ``tensor`` (its size is the message's) with the next message from ``peer`` on ``tag``."""
        dist.recv(tensor, src=peer, tag=tag)

    def rank(self) -> int | None:
        """This process's rank, None outside a process group (for error messages)."""
        return dist.get_rank() if dist.is_initialized() else None


class Transport:
    """Pickled objects over gloo send/recv on the default process group.

    Args:
        name: the role name of a rank (for error messages), e.g. ``Layout.name``.
        wire: what moves the tensors; :class:`GlooWire` when None (tests pass an
            in-memory one).

    Thread safety: any number of threads may send (one message at a time per peer and
    stream); at most one thread may receive from a given (peer, stream).
    """

    def __init__(self, name: Callable[[int], str] | None = None, wire: GlooWire | None = None):
        self.name = name or (lambda rank: f"rank {rank}")
        self.wire = wire or GlooWire()
        self._locks: dict[tuple[int, int], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.bytes_sent = 0
        self.bytes_received = 0

    def _lock(self, peer: int, stream: int) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((peer, stream), threading.Lock())

    def _count(self, counter: str, n: int) -> None:
        with self._locks_guard:  # several threads send and receive at once
            setattr(self, counter, getattr(self, counter) + n)

    def send(self, peer: int, stream: int, obj: Any) -> None:
        with self._guard(peer, "sending to"):
            self._send(peer, stream, obj)

    def recv(self, peer: int, stream: int) -> Any:
        with self._guard(peer, "receiving from"):
            return self._recv(peer, stream)

    @contextmanager
    def _guard(self, peer: int, doing: str):
        try:
            yield
        except RuntimeError as e:  # gloo: "Connection closed by peer", "Connection reset", timeouts
            rank = self.wire.rank()
            me = self.name(rank) if rank is not None else "this process"
            raise PeerLost(f"{me} lost contact with {self.name(peer)} while {doing} it ({gloo_reason(e)})") from e

    def _send(self, peer: int, stream: int, obj: Any) -> None:
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        if len(buffers) > _MAX_BUFFERS:  # many small arrays (a plan): in band
            buffers, data = [], pickle.dumps(obj, protocol=5)
        raws = [_as_tensor(b.raw()) for b in buffers]
        header = np.zeros(HEADER_BYTES // 8, dtype=np.int64)
        inline = len(data) <= _INLINE_BYTES
        header[:4] = (stream, len(data), len(raws), inline)
        header[4 : 4 + len(raws)] = [r.numel() for r in raws]
        if inline:
            header.view(np.uint8)[_INLINE_AT : _INLINE_AT + len(data)] = np.frombuffer(data, dtype=np.uint8)
        send = self.wire.send
        with self._lock(peer, stream):
            send(torch.from_numpy(header), peer, stream)
            if not inline:
                send(torch.frombuffer(bytearray(data), dtype=torch.uint8), peer, stream)
            for r in raws:
                if r.numel():
                    send(r, peer, stream)
        self._count("bytes_sent", HEADER_BYTES + (0 if inline else len(data)) + sum(r.numel() for r in raws))

    def _recv(self, peer: int, stream: int) -> Any:
        recv = self.wire.recv
        header = torch.empty(HEADER_BYTES // 8, dtype=torch.int64)
        recv(header, peer, stream)
        h = header.numpy()
        kind, nbytes, nbuf, inline = (int(x) for x in h[:4])
        if kind != stream:  # pragma: no cover - a protocol bug, not a user error
            raise RuntimeError(f"message from rank {peer} on stream {kind}, expected {stream}")
        if inline:
            payload = h.view(np.uint8)[_INLINE_AT : _INLINE_AT + nbytes]
        else:
            t = torch.empty(nbytes, dtype=torch.uint8)
            recv(t, peer, stream)
            payload = t.numpy()
        buffers = []
        for n in h[4 : 4 + nbuf].tolist():
            buf = torch.empty(n, dtype=torch.uint8)
            if n:
                recv(buf, peer, stream)
            buffers.append(buf.numpy())
        self._count("bytes_received", HEADER_BYTES + (0 if inline else nbytes) + sum(len(b) for b in buffers))
        return pickle.loads(payload, buffers=buffers)


def gloo_reason(e: BaseException) -> str:
    """The informative part of a gloo error: "Connection reset by peer [127.0.0.1]:53987"."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    first = re.sub(r"^\[[^\]]*\.cc:\d+\]\s*", "", first)  # gloo's source location
    return first.split(". This is typically")[0]


def _as_tensor(raw: memoryview) -> torch.Tensor:
    """A uint8 tensor over a pickle buffer's memory (copied only if it is read-only)."""
    arr = np.frombuffer(raw, dtype=np.uint8)
    if not arr.flags.writeable:
        arr = arr.copy()
    return torch.from_numpy(arr)
