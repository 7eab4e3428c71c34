"""The one small interface every distributed role talks through.

A :class:`Transport` moves Python objects (dicts of numpy arrays and numbers) between
ranks, on a *stream* (a tag): messages on one stream between two ranks arrive in the
order they were sent. Nothing else in bagpipe touches the wire.

Why gloo point-to-point and not ``torch.distributed.rpc``: both ship with torch 2.13,
but rpc (TensorPipe) is no longer developed upstream, and moving 20k rows x 64 floats
took 2.3-2.7 ms with gloo send/recv against 4.8-5.1 ms with ``rpc_sync`` on this
machine (``benchmarks/transport.py`` measures both). gloo is also the backend DDP
already uses on CPU, so one library carries every byte.

A message is two gloo sends: an int64 header (stream kind, payload bytes) and the
payload, a pickle (protocol 5) of the object. A per-peer lock keeps the two sends of a
message together when several threads of one process talk to the same peer.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import torch
import torch.distributed as dist

# streams (gloo tags); one per direction of each conversation
REQUEST = 1  # client -> embedding server
REPLY = 2  # embedding server -> client
PLAN = 3  # oracle -> trainer
CREDIT = 4  # trainer -> oracle
CONTROL = 5  # trainer 0 -> other roles (setup, end)


class Transport:
    """Pickled objects over gloo send/recv on the default process group.

    Thread safety: any number of threads may send (one message at a time per peer and
    stream); at most one thread may receive from a given (peer, stream).
    """

    def __init__(self):
        self._locks: dict[tuple[int, int], threading.Lock] = {}
        self._guard = threading.Lock()
        self.bytes_sent = 0
        self.bytes_received = 0

    def _lock(self, peer: int, stream: int) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((peer, stream), threading.Lock())

    def send(self, peer: int, stream: int, obj: Any) -> None:
        data = pickle.dumps(obj, protocol=5)
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        header = torch.tensor([stream, len(data)], dtype=torch.int64)
        with self._lock(peer, stream):
            dist.send(header, dst=peer, tag=stream)
            dist.send(payload, dst=peer, tag=stream)
        self.bytes_sent += len(data)

    def recv(self, peer: int, stream: int) -> Any:
        header = torch.empty(2, dtype=torch.int64)
        dist.recv(header, src=peer, tag=stream)
        if int(header[0]) != stream:  # pragma: no cover - a protocol bug, not a user error
            raise RuntimeError(f"message from rank {peer} on stream {int(header[0])}, expected {stream}")
        payload = torch.empty(int(header[1]), dtype=torch.uint8)
        dist.recv(payload, src=peer, tag=stream)
        self.bytes_received += int(header[1])
        return pickle.loads(payload.numpy().tobytes())
