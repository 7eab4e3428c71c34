"""The one small interface every distributed role talks through.

A :class:`Transport` moves messages (dicts of numpy arrays and numbers, plans, the
oracle's report) between ranks, on a *stream* (a tag): messages on one stream between
two ranks arrive in the order they were sent. Nothing else in bagpipe touches the wire.

Why gloo point-to-point and not ``torch.distributed.rpc``: both ship with torch 2.13,
but rpc (TensorPipe) is no longer developed upstream, and for the messages bagpipe
sends -- one step's fetch split over the servers, a few hundred KiB -- a round trip
through this transport took 0.67-0.82 ms against 1.17-1.38 ms for ``rpc_sync`` on
this machine (``benchmarks/transport.py``; latency dominates at that size; at 4.9 MiB
TensorPipe moved the bytes faster, see docs/distributed.md). gloo is also the backend
DDP already uses on CPU, so one library carries every byte.

**Data only, and authenticated.** A message is a fixed :data:`HEADER_BYTES` header --
magic, stream, sequence number, body length and an HMAC-SHA256 -- then its body, the
data-only encoding of :mod:`bagpipe.distributed.wire` (never a pickle). A body of at
most :data:`INLINE_BYTES` travels inside the header (one gloo message, as most
requests); a larger one follows as one gloo message, arrays included (one copy on the
sender, none on the receiver: arrays arrive as views of the received body). The MAC
covers the header's fields and the body, under the key of the pair and direction,
agreed when the two roles joined (:meth:`Transport.join`, :mod:`bagpipe.distributed.auth`);
the sequence number, one counter per peer and stream, makes a replayed message fail.

A received message that is garbage (wrong magic, stream or length), oversized (more
than ``max_message_bytes``), truncated (gloo fills a shorter message into the posted
buffer: the rest stays zero, so its MAC fails), forged or replayed is **refused**:
logged with its sender, counted in :attr:`Transport.refused`, and the receiver waits
for the next message -- nothing of it is decoded, let alone acted on.

The point-to-point calls themselves go through a *wire* (:class:`GlooWire` unless
another is given): the framing above can then be tested without a process group,
over an in-memory wire (``tests/unit/distributed/test_servers.py``, ``tests/unit/distributed/test_wire.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import struct
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from bagpipe.config.agreement import differences
from bagpipe.distributed import auth
from bagpipe.distributed.wire import (  # noqa: F401 - the streams are part of this interface
    CONTROL,
    CREDIT,
    HELLO,
    PART,
    PLAN,
    REPLY,
    REQUEST,
    STREAM_NAMES,
    WireError,
    decode,
    encode,
)
from bagpipe.errors import BagpipeError

MAGIC = b"BPW1"
_FIXED = struct.Struct("<4sHHQQ")  # magic, stream, flags, sequence number, body length
MAC_BYTES = 32
_MAC_AT = _FIXED.size
_BODY_AT = _MAC_AT + MAC_BYTES  # 56: 8-byte aligned, so inline arrays are too
HEADER_BYTES = 256
INLINE_BYTES = HEADER_BYTES - _BODY_AT
INLINE = 1  # flag: the body is inside the header
MAX_MESSAGE_BYTES = 1 << 32  # a read_range chunk of 2^20 rows of D = 128 with Adam's state is ~1 GiB
LOG_REFUSALS = 20  # refusals logged one by one per peer; then one line every 1,000


class SettingsDiffer(BagpipeError):
    """Two roles of a job were started with different settings that shape its result."""


class PeerLost(BagpipeError):
    """A peer's connection broke (it died, or its machine did): names the peer's role."""


class Wire(Protocol):
    """What moves a :class:`Transport`'s tensors, one at a time (:class:`GlooWire`, or a
    test's in-memory one)."""

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> None: ...

    def recv(self, tensor: torch.Tensor, peer: int, tag: int) -> None: ...

    def rank(self) -> int | None: ...


class GlooWire:
    """The wire a :class:`Transport` uses by default: gloo point-to-point on the default
    process group. A wire moves one tensor at a time; a test may pass another object
    with the same three methods."""

    def send(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        dist.send(tensor, dst=peer, tag=tag)

    def recv(self, tensor: torch.Tensor, peer: int, tag: int) -> None:
        """Fill ``tensor`` with the next message from ``peer`` on ``tag`` (gloo takes a
        message shorter than ``tensor`` into its start)."""
        dist.recv(tensor, src=peer, tag=tag)

    def rank(self) -> int | None:
        """This process's rank, None outside a process group (for error messages)."""
        return dist.get_rank() if dist.is_initialized() else None


class Refused(Exception):
    """A received message that is not taken (internal: becomes a log line, or AuthError in a handshake)."""


#: The attribute of a thread inside :meth:`Transport.recv`: the transport it receives from.
_INSIDE = "bagpipe_inside_receive"


def receiving_elsewhere(transport: Transport | None = None) -> bool:
    """Whether a thread other than the caller is inside a receive (of ``transport``; of any
    transport of this process when None).

    The one test of what makes a role's exit different: leaving the process group, or the
    interpreter's teardown, under a thread blocked inside a gloo receive aborts the process
    (SIGABRT, after the role's error line). So a role that stops with such a thread does not
    leave the group (:func:`bagpipe.distributed.roles.joined`), and the process ends past it
    with its exit code (a role's worker at once, the command line after its message)."""
    me = threading.current_thread()
    for t in threading.enumerate():
        inside = getattr(t, _INSIDE, None)
        if t is not me and inside is not None and (transport is None or inside is transport):
            return True
    return False


class Transport:
    """Authenticated, data-only messages over gloo send/recv on the default process group.

    Args:
        name: the role name of a rank (for error messages), e.g. ``Layout.name``.
        wire: what moves the tensors; :class:`GlooWire` when None (tests pass an
            in-memory one).
        log: where refused messages are reported (a line each); stderr when None.
        max_message_bytes: a header announcing a longer body is refused.

    Call :meth:`join` with the peers this role talks to before sending or receiving.
    Thread safety: any number of threads may send (one message at a time per peer and
    stream); at most one thread may receive from a given (peer, stream).
    """

    def __init__(
        self,
        name: Callable[[int], str] | None = None,
        wire: Wire | None = None,
        log: Callable[[str], None] | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ):
        self.name = name or (lambda rank: f"rank {rank}")
        self.wire: Wire = wire or GlooWire()
        self.log = log if log is not None else (lambda line: print(line, file=sys.stderr, flush=True))
        self.max_message_bytes = int(max_message_bytes)
        self._locks: dict[tuple[int, int], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._keys: dict[int, tuple[bytes, bytes]] = {}  # peer -> (key of my messages to it, key of its messages)
        self._sent_seq: Counter = Counter()  # (peer, stream) -> messages sent
        self._recv_seq: dict[tuple[int, int], int] = {}  # (peer, stream) -> last sequence number taken
        self.bytes_sent = 0
        self.bytes_received = 0
        self.refused: Counter = Counter()  # (peer, reason) -> messages refused

    def _lock(self, peer: int, stream: int) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((peer, stream), threading.Lock())

    def _count(self, counter: str, n: int) -> None:
        with self._locks_guard:  # several threads send and receive at once
            setattr(self, counter, getattr(self, counter) + n)

    def _me(self) -> str:
        rank = self.wire.rank()
        return self.name(rank) if rank is not None else "this process"

    # the handshake -----------------------------------------------------------------
    def join(self, peers: Iterable[int], secret: bytes, settings: Mapping[str, str] | None = None) -> None:
        """Prove to every one of ``peers`` that this role holds the job's ``secret`` and
        check that it does too (challenge and response), then agree the pair's keys.

        ``settings``: what this role was started with that every role must share
        (:func:`bagpipe.config.agreement.job_settings`); each pair exchanges theirs in the
        handshake and, once every pair has met, a role whose settings differ from a
        peer's raises SettingsDiffer naming the settings and the peers (every role of the
        pair says so, and none starts training).

        Every role walks its pairs in ascending order of the peer's rank -- the global
        order of the pairs (lower rank, higher rank) -- so no two roles ever wait for
        each other in a cycle (a gloo send may wait for its receiver). Raises AuthError
        naming a peer that fails, PeerLost naming one that leaves (it refused us)."""
        me = self.wire.rank()
        if me is None:
            raise BagpipeError("Transport.join needs this process's rank (a process group, or a wire that knows it)")
        mine = dict(settings or {})
        differ = []
        for peer in sorted(set(peers) - {me}):
            with self._guard(
                peer,
                "proving the job's secret to",
                during="the handshake (did it refuse this role? every role needs the same secret)",
            ):
                self._keys[peer], theirs = self._handshake(me, peer, secret, mine)
            if diff := differences(mine, theirs):
                differ.append(f"{self.name(peer)} (rank {peer}): " + ", ".join(diff))
        if differ:
            raise SettingsDiffer(
                f"{self._me()} was started with other settings than "
                + "; ".join(differ)
                + ": start every role of a job with the same options and data set"
            )

    def _handshake(
        self, me: int, peer: int, secret: bytes, settings: dict[str, str]
    ) -> tuple[tuple[bytes, bytes], dict[str, str]]:
        """The pair's session keys, and the settings the peer sent."""
        keys = auth.hello_key(secret, me, peer), auth.hello_key(secret, peer, me)
        mine = auth.token_nonce()

        def expect() -> dict:
            try:
                return self._recv_message(peer, HELLO, keys[1])
            except Refused as e:
                raise auth.AuthError(
                    f"{self._me()} refused {self.name(peer)} (rank {peer}): it did not prove it holds the "
                    f"job's secret ({e}); start every role with the same secret ({auth.SECRET_ENV} or "
                    "--secret-file)"
                ) from None

        def check(answer: bytes, theirs: bytes) -> None:
            if not auth.same(answer, auth.proof(secret, peer, me, mine, theirs)):
                raise auth.AuthError(
                    f"{self._me()} refused {self.name(peer)} (rank {peer}): its answer to the challenge "
                    "is wrong (another job's secret?)"
                )

        if me < peer:  # the lower rank challenges first
            self._send_message(
                peer, HELLO, {"version": auth.PROTOCOL_VERSION, "nonce": mine, "settings": settings}, keys[0]
            )
            got = expect()
            if "proof" not in got or "nonce" not in got:
                raise auth.AuthError(f"{self._me()} refused {self.name(peer)} (rank {peer}): a handshake out of order")
            theirs = got["nonce"]
            check(got["proof"], theirs)
            their_settings = got.get("settings", {})
            self._send_message(peer, HELLO, {"proof": auth.proof(secret, me, peer, theirs, mine)}, keys[0])
        else:
            got = expect()
            if got.get("version") != auth.PROTOCOL_VERSION:
                raise auth.AuthError(
                    f"{self._me()} refused {self.name(peer)} (rank {peer}): handshake version "
                    f"{got.get('version')}, this role speaks {auth.PROTOCOL_VERSION} (another bagpipe version?)"
                )
            theirs, their_settings = got["nonce"], got.get("settings", {})
            self._send_message(
                peer,
                HELLO,
                {"nonce": mine, "proof": auth.proof(secret, me, peer, theirs, mine), "settings": settings},
                keys[0],
            )
            got = expect()
            if set(got) != {"proof"}:
                raise auth.AuthError(f"{self._me()} refused {self.name(peer)} (rank {peer}): a handshake out of order")
            check(got["proof"], theirs)
        return auth.session_keys(secret, me, peer, mine, theirs), their_settings

    # messages ----------------------------------------------------------------------
    def send(self, peer: int, stream: int, obj: Any) -> None:
        with self._guard(peer, "sending to"):
            self._send_message(peer, stream, obj, self._session(peer)[0])

    def recv(self, peer: int, stream: int) -> Any:
        """The next message from ``peer`` on ``stream`` that passes every check; refused
        ones are logged and skipped. The calling thread is marked as inside a receive of this
        transport meanwhile (:func:`receiving_elsewhere`)."""
        key = self._session(peer)[1]
        me = threading.current_thread()
        outer = getattr(me, _INSIDE, None)
        setattr(me, _INSIDE, self)
        try:
            with self._guard(peer, "receiving from"):
                while True:
                    try:
                        return self._recv_message(peer, stream, key)
                    except Refused as e:
                        self._refused(peer, stream, str(e))
        finally:
            setattr(me, _INSIDE, outer)

    def receiving_elsewhere(self) -> bool:
        """Whether a thread other than the caller is inside a receive of this transport."""
        return receiving_elsewhere(self)

    def _session(self, peer: int) -> tuple[bytes, bytes]:
        keys = self._keys.get(peer)
        if keys is None:
            raise BagpipeError(f"{self._me()} has not joined {self.name(peer)}: call Transport.join first")
        return keys

    def _refused(self, peer: int, stream: int, reason: str) -> None:
        kind = reason.split(":")[0]
        with self._locks_guard:
            self.refused[(peer, kind)] += 1
            n = sum(v for (p, _), v in self.refused.items() if p == peer)
        if n <= LOG_REFUSALS or n % 1000 == 0:
            self.log(
                f"{self._me()}: refused a message from {self.name(peer)} (rank {peer}) on the "
                f"{STREAM_NAMES.get(stream, stream)} stream: {reason}"
                + (f" ({n} refused so far)" if n > LOG_REFUSALS else "")
            )

    @contextmanager
    def _guard(self, peer: int, doing: str, during: str = ""):
        try:
            yield
        except RuntimeError as e:  # gloo: "Connection closed by peer", "Connection reset", timeouts
            extra = f" during {during}" if during else ""
            raise PeerLost(
                f"{self._me()} lost contact with {self.name(peer)} while {doing} it{extra} ({gloo_reason(e)})"
            ) from e

    def _send_message(self, peer: int, stream: int, obj: Any, key: bytes) -> None:
        body = encode(stream, obj)
        header = np.zeros(HEADER_BYTES, dtype=np.uint8)
        inline = len(body) <= INLINE_BYTES
        with self._lock(peer, stream):
            seq = self._sent_seq[(peer, stream)]
            self._sent_seq[(peer, stream)] = seq + 1
            fixed = _FIXED.pack(MAGIC, stream, INLINE if inline else 0, seq, len(body))
            header[:_MAC_AT] = np.frombuffer(fixed, dtype=np.uint8)
            header[_MAC_AT:_BODY_AT] = np.frombuffer(_mac(key, fixed, body), dtype=np.uint8)
            if inline:
                header[_BODY_AT : _BODY_AT + len(body)] = body
            self.wire.send(torch.from_numpy(header), peer, stream)
            if not inline:
                self.wire.send(torch.from_numpy(body), peer, stream)
        self._count("bytes_sent", HEADER_BYTES + (0 if inline else len(body)))

    def _recv_message(self, peer: int, stream: int, key: bytes) -> Any:
        """One message, or Refused saying why it is not taken."""
        # numpy's zeros, not torch's: calloc'd pages, where torch fills them on its thread pool (ms on a busy machine)
        h = np.zeros(HEADER_BYTES, dtype=np.uint8)  # a shorter message leaves zeros: its MAC fails
        self.wire.recv(torch.from_numpy(h), peer, stream)
        magic, kind, flags, seq, n = _FIXED.unpack_from(h.data)
        self._count("bytes_received", HEADER_BYTES)
        if magic != MAGIC:
            raise Refused(f"garbage: no message header (starts {bytes(h[:8]).hex()})")
        if kind != stream or flags & ~INLINE:
            raise Refused(f"garbage: a header for stream {kind} with flags {flags}")
        inline = bool(flags & INLINE)
        if n > (INLINE_BYTES if inline else self.max_message_bytes):
            raise Refused(f"oversized: a body of {n:,} bytes announced (at most {self.max_message_bytes:,})")
        if inline:
            body = h[_BODY_AT : _BODY_AT + n]
        else:
            body = np.zeros(n, dtype=np.uint8)  # a shorter message leaves zeros: its MAC fails
            self.wire.recv(torch.from_numpy(body), peer, stream)
            self._count("bytes_received", n)
        if not auth.same(bytes(h[_MAC_AT:_BODY_AT]), _mac(key, bytes(h[:_MAC_AT]), body)):
            raise Refused("bad MAC: not signed with this job's key (forged, damaged or truncated)")
        last = self._recv_seq.get((peer, stream), -1)
        if seq <= last:
            raise Refused(f"replayed: sequence number {seq}, already at {last}")
        try:
            obj = decode(stream, body)
        except WireError as e:
            raise Refused(f"malformed: {e}") from None
        self._recv_seq[(peer, stream)] = seq
        return obj


def _mac(key: bytes, fixed: bytes, body: np.ndarray) -> bytes:
    m = hmac.new(key, fixed, hashlib.sha256)
    m.update(body.data)
    return m.digest()


def gloo_reason(e: BaseException) -> str:
    """The informative part of a gloo error: "Connection reset by peer [127.0.0.1]:53987"."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    first = re.sub(r"^\[[^\]]*\.cc:\d+\]\s*", "", first)  # gloo's source location
    return first.split(". This is typically")[0]
