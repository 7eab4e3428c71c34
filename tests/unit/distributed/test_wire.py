"""The wire between roles: data only, and no stranger can use it (no processes).

Over an in-memory gloo wire (``tests/fakes.py``: a shorter message fills the start of
the receive buffer, as gloo does), with real :class:`Transport` objects in threads:

* **Encoding** (``bagpipe/distributed/{wire,codec,schema}.py``): every message the roles exchange --
  each server request and reply, the set-up, the oracle's info, a partitioned
  lookahead plan with its batch's tensors, a hot-tier plan, the end with the oracle's
  report, credits, checkpoint requests -- arrives equal, field by field, dtype and shape;
  arrays arrive as aligned, writable views of the received body. A message its stream
  does not declare (an unknown op, a missing or extra field, a wrong dtype, any object
  that is not data) is refused by the *sender* with a message naming what is wrong,
  and nothing is sent. Crafted bodies (truncated, bytes left over, unknown tag, dtype
  or record, nested too deep, an array longer than its message, bad UTF-8) and 2,000
  random mutations of real bodies raise only :class:`WireError`; ``decode`` never runs
  code (the module imports no pickle).
* **Framing**: a body of at most ``INLINE_BYTES`` travels inside the header (one
  gloo message), a larger one as one more; the byte counters; streams kept apart;
  several sending threads never interleave; a broken wire is :class:`PeerLost` naming
  the peer's role; the default wire makes exactly gloo's ``send``/``recv`` calls.
* **Authentication**: roles with the same secret join (challenge and response) and
  talk; a role with another secret is refused by name (:class:`AuthError`), and the
  role it tried to join learns it lost that peer during the handshake; nothing can
  be sent before joining. On a joined pair a forged message (another key, a message of
  an earlier session, one reflected back to its sender), a flipped bit in a header or
  a body, a truncated header or body, an oversized announcement, garbage, a replay, and
  a well-signed body that is malformed are each **refused**: logged with the sender's
  role and rank and the reason, counted, and the next real message is taken as usual.
  Through an embedding server: a tampered write request changes no row, and the server
  goes on serving.
* **The secret**: read from a file of mode 0600 (a file others may read or write is
  refused, saying ``chmod 600``), from ``$BAGPIPE_JOB_SECRET`` or the file named by
  ``$BAGPIPE_JOB_SECRET_FILE``; too short or missing is a one-line error saying how to
  make one; the file the launcher's helper writes is 0600 from its creation.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import threading
from collections import deque
from functools import partial

import numpy as np
import pytest
import torch
from fakes import GLOO_CLOSED, SECRET, FakeNet, join_all, role_name

import bagpipe.distributed.transport as transport_mod
from bagpipe.accel.hot import HotPlan
from bagpipe.accel.profile import HotSet
from bagpipe.budget.estimate import Estimate, Part, Sizes
from bagpipe.budget.sizing import Budget, Fit
from bagpipe.cache.setup import CachePlan
from bagpipe.data.batch import Batch
from bagpipe.distributed import auth, codec, wire
from bagpipe.distributed.oracle_report import OracleReport
from bagpipe.distributed.partition import TrainerPlan, partition
from bagpipe.distributed.server import EmbeddingServer, RemoteStore, ShardInit
from bagpipe.distributed.transport import (
    HEADER_BYTES,
    INLINE_BYTES,
    PeerLost,
    Transport,
)
from bagpipe.distributed.wire import CONTROL, CREDIT, PLAN, REPLY, REQUEST, WireError, decode, encode
from bagpipe.errors import BagpipeError, ConfigError
from bagpipe.oracle import LookaheadOracle
from bagpipe.store.diskio import DiskIO
from bagpipe.store.init import RowInitializer
from bagpipe.store.memory import MemoryStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


# helpers ---------------------------------------------------------------------------
class Logged(list):
    def __call__(self, line: str) -> None:
        self.append(line)


@pytest.fixture
def pair():
    """Trainer 0 and server 0 (rank 1), joined over a fake wire; (a, b, net, b's log)."""
    net = FakeNet(timeout=5.0)
    name = role_name(1)
    log = Logged()
    a, b = Transport(name, net.wire(0), log=Logged()), Transport(name, net.wire(1), log=log)
    assert not join_all({0: a, 1: b}, {0: [1], 1: [0]})
    for t in (a, b):
        t.bytes_sent = t.bytes_received = 0  # the handshake's bytes are counted too: start from here
    return a, b, net, log


def roundtrip(pair, obj, stream: int = REQUEST):
    """obj sent 0 -> 1 and received; (received object, bytes of each part sent)."""
    a, b, *_ = pair
    n = len(a.wire.sent)
    a.send(1, stream, obj)
    got = b.recv(0, stream)
    return got, [nbytes for _, _, nbytes in a.wire.sent[n:]]


def assert_same(got, want) -> None:
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, (np.ndarray, torch.Tensor)):
        assert (got.dtype, tuple(got.shape)) == (want.dtype, tuple(want.shape))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            assert_same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)
    elif dataclasses.is_dataclass(want):
        for f in dataclasses.fields(want):
            assert_same(getattr(got, f.name), getattr(want, f.name))
    else:
        assert got == want


def batch(rows: list[int]) -> Batch:
    n = len(rows)
    return Batch(
        labels=torch.arange(n, dtype=torch.float32),
        dense=torch.randn(n, 3),
        rows=torch.tensor(rows, dtype=torch.int64),
        offsets=torch.arange(n + 1),
        num_features=1,
    )


def trainer_plans() -> list[TrainerPlan]:
    oracle = LookaheadOracle(num_rows=32, cache_rows=6, lookahead=2)
    seq = [[1, 2, 2, 3], [4, 4, 1, 5], [1, 6, 7, 7], [2, 9, 9, 1]]
    return [p for g in oracle.plans((i, batch(r)) for i, r in enumerate(seq)) for p in partition(g, 2)]


# encoding ----------------------------------------------------------------------------
def every_message() -> list[tuple[int, object]]:
    """One of every message the roles exchange, with realistic values."""
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 1000, 300).astype(np.int64)
    w, s = rng.standard_normal((300, 16)).astype(np.float32), rng.standard_normal((300, 1)).astype(np.float32)
    plan = trainer_plans()[3]
    hot = HotPlan(
        step=4,
        batch=batch([3, 3, 8]),
        rows=np.array([3, 8]),
        slots=np.array([6, 0]),
        inverse=np.array([0, 0, 1]),
        next_use=np.array([5, -1]),
        hot=np.array([True, False]),
        popular=np.array([True, True, False]),
    )
    report = OracleReport(
        plan={"steps": 4, "hit_rate": 0.25, "planning_ms_per_step": 0.1},
        cache_rows=6,
        lookahead=2,
        sync_rows=7,
        fetched_rows=[5, 6],
        seconds_planning=0.5,
        max_in_flight=3,
    )
    return [
        (REQUEST, {"op": "read", "rows": rows, "after": 12, "count": True}),
        (REQUEST, {"op": "read", "rows": rows[:3], "after": -1, "count": False}),
        (REQUEST, {"op": "range", "start": 0, "stop": 1 << 20, "after": 1 << 62}),
        (REQUEST, {"op": "write", "rows": rows, "w": w, "s": s}),
        (REQUEST, {"op": "mark", "label": 17}),
        (REQUEST, {"op": "flush"}),
        (REQUEST, {"op": "stats"}),
        (REQUEST, {"op": "bye"}),
        (REQUEST, {"op": "checkpoint", "step": 40}),
        (REQUEST, {"op": "checkpoint", "step": 40, "dir": "/runs/a/checkpoints/.staging-40", "kind": "full"}),
        (REPLY, {"w": w, "s": s}),
        (REPLY, {}),
        (REPLY, {"part": {"shard": 1, "shards": 2, "kind": "delta", "rows": 12, "bytes": 400}}),
        (REPLY, {"error": "server 1 could not write its checkpoint part: disk full"}),
        (REPLY, {"store": {"reads": 3, "rows_read": 40}, "requests": {"read": 3, "mark": 2}, "waited_s": 0.25}),
        (
            REPLY,
            {
                "store": {},
                "requests": {"read": 3},
                "waited_s": 0.25,
                "lock_s": 0.02,
                "read_s": 0.01,
                "reply_s": 0.5,
                "memory": {},
            },
        ),
        (CONTROL, {"table_sizes": [5, 3, 1000], "dim": 16, "seed": 7, "state_dim": 1, "restore": None}),
        (CONTROL, {"table_sizes": [5], "dim": 4, "seed": 1, "state_dim": 2, "restore": "/runs/a/checkpoints/step-40"}),
        (PLAN, CachePlan(cache_rows=6, lookahead=2)),
        (
            PLAN,
            CachePlan(
                cache_rows=6,
                lookahead=2,
                staged=3,
                hot=HotSet(np.array([3, 9], np.int64), 32, {"coverage": 0.4, "tables": [0.1, 0.5]}),
                autotune={"cache_rows": 6, "reason": "budget"},
                fit=Fit(
                    Budget(512 << 20, "--memory-budget-mb 512"),
                    Sizes(cache_rows=6, hot_rows=2, lookahead=2, staged=3, io=DiskIO(dirty_bytes=None)),
                    Estimate("remote-trainer", (Part("cache", 6 * 64, "C rows"), Part("dense model", 1 << 20))),
                    changes=("cache 10 -> 6 rows",),
                ),
            ),
        ),
        (  # a budget of none but the machine's memory (a tuple field there stopped every job)
            PLAN,
            CachePlan(
                cache_rows=6,
                lookahead=2,
                fit=Fit(
                    Budget(None, "no memory cgroup", False, 24 << 30, "MemTotal in /proc/meminfo", note="a note"),
                    Sizes(cache_rows=6, hot_rows=0, lookahead=2, staged=3, io=DiskIO(dirty_bytes=None)),
                    Estimate("remote-trainer", (Part("cache", 6 * 64, "C rows"),)),
                ),
            ),
        ),
        (PLAN, plan),
        (PLAN, hot),
        (PLAN, {"end": True, "report": report}),
        (CREDIT, 1),
        (CREDIT, None),
    ]


@pytest.mark.parametrize("stream,obj", every_message(), ids=lambda x: None)
def test_every_message_the_roles_exchange_arrives_equal(pair, stream, obj):
    got, parts = roundtrip(pair, obj, stream)
    assert_same(got, obj)
    body = len(encode(stream, obj))
    assert parts == ([HEADER_BYTES] if body <= INLINE_BYTES else [HEADER_BYTES, body])
    assert pair[0].bytes_sent == pair[1].bytes_received == sum(parts)


def test_a_plan_carries_every_field_of_its_class():
    """A field added to Plan, TrainerPlan, HotPlan, Batch or OracleReport travels (or the record refuses to encode)."""
    for cls in codec.RECORDS.values():
        for f in dataclasses.fields(cls):
            codec._field_spec(cls, f.name)  # raises TypeError for a field type the wire cannot carry


def test_arrays_arrive_as_aligned_writable_views_and_odd_arrays_travel_by_value(pair):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((100, 8)).astype(np.float32)
    ro = np.arange(64, dtype=np.float32).reshape(8, 8)
    ro.flags.writeable = False
    fortran = np.asfortranarray(rng.standard_normal((5, 3)).astype(np.float32))
    strided = np.arange(48, dtype=np.float32).reshape(4, 12)[:, ::4]
    for arr in (w, ro, fortran, strided):
        got, _ = roundtrip(pair, {"w": arr, "s": np.zeros((len(arr), 1), np.float32)}, REPLY)
        np.testing.assert_array_equal(got["w"], arr)
        assert got["w"].flags.writeable and got["w"].ctypes.data % 8 == 0
    np.testing.assert_array_equal(ro, np.arange(64, dtype=np.float32).reshape(8, 8))  # the sender's array is untouched
    got["w"][0, 0] = 1.0  # the receiver owns its arrays


@pytest.mark.parametrize(
    "values,stored_bytes",
    [
        (np.arange(1000, dtype=np.int64), 0),  # a range: its first value and step
        (np.arange(1000, dtype=np.int64) * -3 + 7, 0),
        (np.arange(1000, dtype=np.int64) % 200, 1000),  # uint8
        (np.arange(1000, dtype=np.int64) % 200 - 100, 1000),  # int8
        (np.arange(1000, dtype=np.int64) % 7 * 9000, 2000),  # uint16
        (np.arange(1000, dtype=np.int64) % 7 * 1_000_000, 4000),  # uint32
        (np.arange(1000, dtype=np.int64) % 7 * (1 << 40), 8000),  # as it is
        (np.arange(1000, dtype=np.int32) % 7 * 1_000_000, 4000),  # int32 stays int32
        (np.arange(63, dtype=np.int64) % 5, 63 * 8),  # too short to bother
    ],
)
def test_integer_arrays_travel_narrow_or_as_ranges_and_arrive_as_they_were(values, stored_bytes):
    msg = {"op": "read", "rows": values.astype(np.int64), "after": 1, "count": True}
    got = decode(REQUEST, encode(REQUEST, msg))["rows"]
    assert got.dtype == np.int64 and got.flags.writeable
    np.testing.assert_array_equal(got, values)
    empty = len(encode(REQUEST, msg | {"rows": np.zeros(0, np.int64)}))
    assert len(encode(REQUEST, msg)) - empty <= stored_bytes + 16


def test_a_plan_is_less_than_half_its_int64_size_on_the_wire():
    rng = np.random.default_rng(4)
    oracle = LookaheadOracle(num_rows=2_000_000, cache_rows=40_000, lookahead=4)
    batches = [
        (
            i,
            Batch(
                labels=torch.zeros(512),
                dense=torch.randn(512, 13),
                rows=torch.from_numpy((rng.zipf(1.2, 512 * 26) % 2_000_000).astype(np.int64)),
                offsets=torch.arange(512 * 26 + 1),
                num_features=26,
            ),
        )
        for i in range(6)
    ]
    plan = partition(list(oracle.plans(batches))[-1], 2)[0]
    raw = sum(
        np.asarray(v).nbytes
        for v in [
            *(getattr(plan, f.name) for f in dataclasses.fields(plan)),
            *(getattr(plan.batch, f.name) for f in dataclasses.fields(plan.batch)),
        ]
        if isinstance(v, (np.ndarray, torch.Tensor))
    )
    body = encode(PLAN, plan)
    assert len(body) < 0.5 * raw, (len(body), raw)
    assert_same(decode(PLAN, body), plan)


@pytest.mark.parametrize(
    "stream,obj,says",
    [
        (REQUEST, {"op": "frobnicate"}, r"unknown op 'frobnicate'"),
        (REQUEST, {"op": "read", "rows": np.arange(3), "after": 1}, r"request message\[read\]: missing count"),
        (REQUEST, {"op": "mark", "label": 3, "extra": 1}, r"request message\[mark\]: unexpected extra"),
        (
            REQUEST,
            {"op": "read", "rows": np.arange(3.0), "after": 1, "count": True},
            r"\.rows: expected an array of int64 with 1 dimension\(s\), got float64 array",
        ),
        (
            REQUEST,
            {"op": "write", "rows": np.arange(2), "w": np.zeros(2, np.float32), "s": np.zeros((2, 1), np.float32)},
            r"\.w: expected an array of float32 with 2 dimension\(s\)",
        ),
        (CREDIT, "one", r"credit message: expected an integer, got str"),
        (PLAN, {"end": True, "report": {"plan": {}}}, r"expected OracleReport, got dict"),
        (
            CONTROL,
            {"table_sizes": [5], "dim": 4, "seed": 1, "state_dim": 2, "restore": None, "code": print},
            r"unexpected code",
        ),
        (REPLY, {"part": {"call": print}}, r"a builtin_function_or_method cannot travel"),
        (REPLY, {"part": {1: 2}}, r"dict keys must be strings"),
        (
            REPLY,
            {"w": np.zeros((1, 1), np.complex64), "s": np.zeros((1, 1), np.float32)},
            r"expected an array of float32",
        ),
    ],
)
def test_the_sender_refuses_a_message_its_stream_does_not_declare(pair, stream, obj, says):
    a, *_ = pair
    with pytest.raises(WireError, match=says):
        a.send(1, stream, obj)
    assert a.wire.sent == [(1, 6, HEADER_BYTES)] * 2  # only the handshake's messages ever left


def _body(*parts: bytes) -> np.ndarray:
    return np.frombuffer(b"".join(parts), dtype=np.uint8).copy()


I64 = codec._I64.pack
U32 = codec._U32.pack


@pytest.mark.parametrize(
    "body,says",
    [
        (_body(), r"truncated"),
        (_body(bytes([codec.INT]), b"\x01\x02"), r"truncated"),
        (_body(bytes([codec.NONE]), b"\x00"), r"1 bytes left over"),
        (_body(bytes([99])), r"unknown value tag 99"),
        (_body(bytes([codec.STR]), U32(2), b"\xff\xfe"), r"not UTF-8"),
        (_body(bytes([codec.STR]), U32(1 << 30), b"ab"), r"truncated"),
        (_body(bytes([codec.LIST]), U32(1 << 30)), r"a list of 1073741824 values in 0 bytes"),
        (_body(bytes([codec.DICT]), U32(1)), r"a dict of 1 items in 0 bytes"),
        (_body(bytes([codec.DICT]), U32(1), U32(9), b"key"), r"truncated"),
        (_body(bytes([codec.ARRAY, 200, 1]), I64(3)), r"unknown dtype code 200"),
        (_body(bytes([codec.ARRAY, 4, 9])), r"an array of 9 dimensions"),
        (_body(bytes([codec.ARRAY, 4, 1]), I64(-1)), r"negative shape"),
        (_body(bytes([codec.ARRAY, 4, 2]), I64(1 << 40), I64(1 << 40), bytes([codec.RAW])), r"longer than the message"),
        (_body(bytes([codec.ARRAY, 4, 1]), I64(3), bytes([7])), r"unknown array encoding 7"),
        (_body(bytes([codec.ARRAY, 3, 1]), I64(3), bytes([codec.NARROW, 4])), r"int32 values stored as dtype code 4"),
        (
            _body(bytes([codec.ARRAY, 10, 1]), I64(3), bytes([codec.NARROW, 1])),
            r"float32 values stored as dtype code 1",
        ),
        (
            _body(bytes([codec.ARRAY, 4, 1]), I64(1 << 40), bytes([codec.RANGE]), I64(0), I64(1)),
            r"expands to more than",
        ),
        (
            _body(bytes([codec.ARRAY, 4, 2]), I64(2), I64(2), bytes([codec.RANGE]), I64(0), I64(1)),
            r"a range of int64 with 2 dim",
        ),
        (_body(bytes([codec.ARRAY, 4, 1]), I64(4), bytes(20)), r"longer than the message"),
        (_body(bytes([codec.ARRAY, 4, 1]), I64(3), bytes(25)), r"truncated"),
        (_body(bytes([codec.RECORD]), codec._U16.pack(77)), r"unknown record code 77"),
        (_body(*([bytes([codec.LIST]), U32(1)] * 20), bytes([codec.NONE])), r"nested deeper"),
    ],
)
def test_decode_refuses_crafted_bodies(body, says):
    with pytest.raises(WireError, match=says):
        decode(CREDIT, body)


def test_decode_of_a_well_formed_body_of_the_wrong_shape_is_refused():
    with pytest.raises(WireError, match=r"plan message: not plan .*not info .*not end"):
        decode(PLAN, encode(REQUEST, {"op": "mark", "label": 1}))
    ok = {"op": "read", "rows": np.arange(3), "after": 1, "count": True}
    with pytest.raises(WireError, match=r"^Batch\.labels: expected a tensor, got int$"):
        body = bytearray(encode(PLAN, trainer_plans()[0]))
        body[1:3] = codec._U16.pack(4)  # a Batch where a plan was: its fields no longer fit
        decode(PLAN, np.frombuffer(bytes(body), np.uint8).copy())
    assert_same(decode(REQUEST, encode(REQUEST, ok)), ok)


def test_a_cache_plan_arrives_typed_and_its_records_own_checks_are_wire_errors():
    """The oracle's CachePlan travels as a record (a Fit's tuples arrive as tuples); a hot
    set whose rows leave its row space is refused by the decoder, not by the trainer."""
    plan = next(obj for stream, obj in every_message() if isinstance(obj, CachePlan) and obj.fit is not None)
    got = decode(PLAN, encode(PLAN, plan))
    assert type(got.fit.estimate.parts) is tuple and got.fit == plan.fit
    bad = dataclasses.replace(plan, hot=HotSet(np.array([3, 9], np.int64), 32))
    assert bad.hot is not None
    bad.hot.rows = np.array([3, 40], np.int64)  # past R = 32 (a HotSet checks its rows when made)
    with pytest.raises(WireError, match=r"^HotSet: hot rows must be distinct, ascending rows in \[0, 32\)"):
        decode(PLAN, encode(PLAN, bad))


def test_random_damage_to_real_bodies_raises_only_wire_error():
    rng = np.random.default_rng(2)
    bodies = [(s, encode(s, m)) for s, m in every_message()]
    outcomes = {"refused": 0, "decoded": 0}
    for i in range(2000):
        stream, body = bodies[i % len(bodies)]
        b = body.copy()
        how = i % 3
        if how == 0:  # flip bytes
            for at in rng.integers(0, len(b), 1 + i % 4):
                b[at] ^= rng.integers(1, 256)
        elif how == 1:  # truncate
            b = b[: rng.integers(0, len(b))].copy()
        else:  # append
            b = np.concatenate([b, rng.integers(0, 256, 1 + i % 9).astype(np.uint8)])
        try:
            decode(stream, b)
            outcomes["decoded"] += 1  # e.g. a flipped bit inside a float: still a well-formed message
        except WireError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 1000


def test_nothing_that_reads_the_wire_can_unpickle_or_evaluate():
    import ast

    import bagpipe.distributed.schema as schema
    import bagpipe.distributed.transport as t

    for mod in (wire, codec, schema, t, auth):
        assert mod.__file__ is not None
        tree = ast.parse(open(mod.__file__).read())
        imported = {
            a.name.split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in (n.names if isinstance(n, ast.Import) else [ast.alias(n.module or "")])
        }
        assert not imported & {"pickle", "marshal", "shelve", "dill", "cloudpickle", "importlib"}, mod.__name__
        called = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert not called & {"eval", "exec", "torch.load", "np.load", "getattr(builtins)", "__import__"}, mod.__name__


# framing -----------------------------------------------------------------------------
def test_streams_are_kept_apart(pair):
    a, b, *_ = pair
    a.send(1, REQUEST, {"op": "mark", "label": 1})
    a.send(1, REPLY, {"w": np.ones((3, 2), np.float32), "s": np.ones((3, 1), np.float32)})
    assert b.recv(0, REPLY)["w"].shape == (3, 2)  # the later message, on its own stream
    assert b.recv(0, REQUEST)["label"] == 1


def test_threads_sending_to_one_peer_never_interleave_their_messages(pair):
    a, b, *_ = pair
    senders, messages = 4, 25

    def send_all(k: int):
        for i in range(messages):
            a.send(
                1,
                REQUEST,
                {
                    "op": "write",
                    "rows": np.full(i + 1, k, np.int64),
                    "w": np.full((i + 1, 3), i, np.float32),
                    "s": np.zeros((i + 1, 1), np.float32),
                },
            )

    threads = [threading.Thread(target=partial(send_all, k)) for k in range(senders)]
    for t in threads:
        t.start()
    seen: dict[int, list[int]] = {k: [] for k in range(senders)}
    for _ in range(senders * messages):
        msg = b.recv(0, REQUEST)
        k, i = int(msg["rows"][0]), len(msg["rows"]) - 1
        np.testing.assert_array_equal(msg["w"], np.full((i + 1, 3), i, np.float32))
        seen[k].append(i)
    for t in threads:
        t.join(10)
    assert seen == {k: list(range(messages)) for k in range(senders)}


@pytest.mark.parametrize("doing", ["sending to", "receiving from"])
def test_a_broken_wire_is_peer_lost_naming_the_peers_role(pair, doing):
    a, _, net, _ = pair
    net.kill(1)
    with pytest.raises(
        PeerLost,
        match=rf"^trainer 0 lost contact with server 0 while {doing} it \(Connection closed by peer \[127\.0\.0\.1\]:29501\)$",
    ) as caught:
        if doing == "sending to":
            a.send(1, REQUEST, {"op": "bye"})
        else:
            a.recv(1, REPLY)
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_the_default_wire_makes_the_gloo_calls_of_the_default_group(monkeypatch):
    calls: list[tuple[str, int, int, int]] = []
    fifo: deque[torch.Tensor] = deque()

    def send(tensor, *, dst, tag):  # keyword-only: the exact call Transport always made
        calls.append(("send", dst, tag, tensor.numel()))
        fifo.append(tensor.clone())

    def recv(tensor, *, src, tag):
        calls.append(("recv", src, tag, tensor.numel()))
        got = fifo.popleft()
        tensor[: got.numel()] = got

    monkeypatch.setattr(transport_mod.dist, "send", send)
    monkeypatch.setattr(transport_mod.dist, "recv", recv)
    t = Transport(role_name(1))
    t._keys[1] = (b"k" * 32, b"k" * 32)  # talking to itself through the fake gloo: one key both ways
    obj = {"w": np.ones((30, 4), np.float32), "s": np.ones((30, 1), np.float32)}
    t.send(1, REPLY, obj)
    assert_same(t.recv(1, REPLY), obj)
    parts = [HEADER_BYTES, len(encode(REPLY, obj))]
    assert calls == [("send", 1, REPLY, n) for n in parts] + [("recv", 1, REPLY, n) for n in parts]

    def refused(tensor, *, dst, tag):
        raise RuntimeError(GLOO_CLOSED.format(port=4242))

    monkeypatch.setattr(transport_mod.dist, "send", refused)
    with pytest.raises(
        PeerLost,
        match=r"^this process lost contact with server 0 while sending to it \(Connection closed by peer \[127\.0\.0\.1\]:4242\)$",
    ):
        t.send(1, REQUEST, {"op": "bye"})  # outside a process group the sender has no role name


# authentication ----------------------------------------------------------------------
def test_nothing_travels_before_joining():
    net = FakeNet(timeout=1.0)
    t = Transport(role_name(1), net.wire(0))
    with pytest.raises(BagpipeError, match=r"^trainer 0 has not joined server 0: call Transport.join first$"):
        t.send(1, REQUEST, {"op": "bye"})
    assert net.wire(0).sent == []


def test_a_role_with_another_secret_is_refused_by_name():
    net = FakeNet(timeout=5.0)
    name = role_name(1)
    a, b = Transport(name, net.wire(0), log=Logged()), Transport(name, net.wire(1), log=Logged())
    errors: dict = {}

    def join(t, peers, secret, rank):
        try:
            t.join(peers, secret)
        except BaseException as e:  # noqa: BLE001
            errors[rank] = e
            net.kill(rank)  # the refusing role exits, as a process would

    threads = [
        threading.Thread(target=join, args=(a, [1], SECRET, 0)),
        threading.Thread(target=join, args=(b, [0], b"another job's secret, 32 bytes..", 1)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert isinstance(errors[1], auth.AuthError)
    assert str(errors[1]).startswith(
        "server 0 refused trainer 0 (rank 0): it did not prove it holds the job's secret (bad MAC"
    )
    assert "start every role with the same secret (BAGPIPE_JOB_SECRET or --secret-file)" in str(errors[1])
    assert isinstance(errors[0], PeerLost)
    assert str(errors[0]).startswith(
        "trainer 0 lost contact with server 0 while proving the job's secret to it during the "
        "handshake (did it refuse this role? every role needs the same secret)"
    )


def test_a_wrong_answer_to_the_challenge_is_refused(monkeypatch):
    """A peer that signs its handshake messages but cannot answer the challenge (as a
    man in the middle replaying an old handshake could not) is refused."""
    net = FakeNet(timeout=5.0)
    a, b = Transport(role_name(1), net.wire(0)), Transport(role_name(1), net.wire(1))
    real = auth.proof
    server = "join-1"  # join_all's thread of rank 1: only the server's answers are wrong
    monkeypatch.setattr(
        auth, "proof", lambda *a: b"\x00" * 32 if threading.current_thread().name == server else real(*a)
    )
    errors = join_all({0: a, 1: b}, {0: [1], 1: [0]})
    assert (
        str(errors[0])
        == "trainer 0 refused server 0 (rank 1): its answer to the challenge is wrong (another job's secret?)"
    )


def signed(t: Transport, peer: int, stream: int, obj, key: bytes | None = None, seq: int | None = None) -> list[bytes]:
    """The bytes ``t`` would send ``peer`` (header, body if any), signed with ``key`` (default: its own)."""
    net = FakeNet()
    rank = t.wire.rank()
    assert rank is not None  # a FakeWire's
    capture = Transport(t.name, net.wire(rank))
    capture._keys[peer] = (key or t._keys[peer][0], b"")
    capture._sent_seq[(peer, stream)] = t._sent_seq[(peer, stream)] if seq is None else seq
    capture.send(peer, stream, obj)
    fifo = net._fifos[(rank, peer, stream)]
    return [fifo.popleft() for _ in range(len(fifo))]


MARK = {"op": "mark", "label": 5}
WRITE = {"op": "write", "rows": np.arange(40), "w": np.ones((40, 4), np.float32), "s": np.ones((40, 1), np.float32)}


def flip(data: bytes, at: int) -> bytes:
    b = bytearray(data)
    b[at] ^= 0x10
    return bytes(b)


ATTACKS = {
    # name: (messages injected from trainer 0 to server 0 given the pair, reason logged)
    "another key": (lambda a: signed(a, 1, REQUEST, MARK, key=b"x" * 32), "bad MAC"),
    "flipped header bit": (lambda a: [flip(signed(a, 1, REQUEST, MARK)[0], 9)], "bad MAC"),
    "flipped body bit": (lambda a: (lambda m: [m[0], flip(m[1], 300)])(signed(a, 1, REQUEST, WRITE)), "bad MAC"),
    "flipped MAC bit": (lambda a: [flip(signed(a, 1, REQUEST, MARK)[0], 40)], "bad MAC"),
    "truncated header": (lambda a: [signed(a, 1, REQUEST, MARK)[0][:60]], "bad MAC"),
    "truncated body": (lambda a: (lambda m: [m[0], m[1][:100]])(signed(a, 1, REQUEST, WRITE)), "bad MAC"),
    "oversized": (
        lambda a: [transport_mod._FIXED.pack(transport_mod.MAGIC, REQUEST, 0, 9, 1 << 40) + bytes(32)],
        "oversized",
    ),
    "garbage": (lambda a: [np.random.default_rng(3).bytes(HEADER_BYTES)], "garbage"),
    "empty": (lambda a: [b""], "garbage"),
    "another stream's header": (lambda a: [signed(a, 1, REPLY, {})[0]], "garbage"),
    "replayed": (lambda a: (lambda m: m + m)(signed(a, 1, REQUEST, MARK)), "replayed"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_forged_damaged_or_garbage_message_is_refused_logged_and_the_next_one_taken(pair, attack):
    a, b, net, log = pair
    make, reason = ATTACKS[attack]
    injected = make(a)
    if attack == "replayed":  # the real message is taken once, its copy refused
        for m in injected:
            net.inject(0, 1, REQUEST, m)
        a._sent_seq[(1, REQUEST)] += 1
        assert b.recv(0, REQUEST) == MARK
    else:
        for m in injected:
            net.inject(0, 1, REQUEST, m)
    a.send(1, REQUEST, {"op": "mark", "label": 6})
    assert b.recv(0, REQUEST) == {"op": "mark", "label": 6}
    assert len(log) == 1, log
    assert log[0].startswith(f"server 0: refused a message from trainer 0 (rank 0) on the request stream: {reason}")
    assert sum(b.refused.values()) == 1 and list(b.refused)[0][0] == 0


def test_a_message_of_an_earlier_session_or_reflected_back_is_refused(pair):
    a, b, net, log = pair
    old = signed(a, 1, REQUEST, MARK)
    # the same two roles join again (a restarted job): new nonces, new keys
    assert not join_all({0: a, 1: b}, {0: [1], 1: [0]})
    for m in old:
        net.inject(0, 1, REQUEST, m)
    reflected = signed(b, 0, REQUEST, MARK)  # what server 0 would send trainer 0, delivered back to server 0
    for m in reflected:
        net.inject(0, 1, REQUEST, m)
    a.send(1, REQUEST, {"op": "bye"})
    assert b.recv(0, REQUEST) == {"op": "bye"}
    assert [line.split(": ")[2] for line in log] == ["bad MAC", "bad MAC"]


def test_a_well_signed_malformed_body_is_refused(pair, monkeypatch):
    a, b, net, log = pair
    monkeypatch.setattr(transport_mod, "encode", lambda stream, obj: _unchecked(obj).join())
    a.send(1, REQUEST, {"op": "launch", "what": "missiles"})
    monkeypatch.undo()
    a.send(1, REQUEST, {"op": "bye"})
    assert b.recv(0, REQUEST) == {"op": "bye"}
    assert log == [
        "server 0: refused a message from trainer 0 (rank 0) on the request stream: malformed: "
        "request message: unknown op 'launch'"
    ]


def _unchecked(obj) -> codec._Writer:
    w = codec._Writer()
    codec._put(w, obj, 0)
    return w


def test_a_tampered_write_changes_no_row_and_the_server_goes_on():
    init = RowInitializer([6, 5], 4, seed=3)
    net = FakeNet(timeout=10.0)
    name = role_name(1)
    log = Logged()
    tc, ts = Transport(name, net.wire(0)), Transport(name, net.wire(1), log=log)
    assert not join_all({0: tc, 1: ts}, {0: [1], 1: [0]})
    store = MemoryStore(ShardInit(init, 0, 1), 1)
    server = EmbeddingServer(store, ts, [0])
    serving = threading.Thread(target=server.serve)
    serving.start()
    client = RemoteStore(init, 1, tc, [1])
    before_w, before_s = client.read_range(0, init.num_rows)

    def tamper(src, dst, tag, data):
        return [flip(data, 100)] if tag == REQUEST else [data]  # inside the (inline) body

    net.tamper = tamper
    rows = np.array([1, 7], np.int64)
    client.write(rows, np.full((2, 4), 9.0, np.float32), np.full((2, 1), 9.0, np.float32))  # body damaged on the way
    net.tamper = None
    w, s = client.read_range(0, init.num_rows)
    np.testing.assert_array_equal(w, before_w)
    np.testing.assert_array_equal(s, before_s)
    client.write(rows, np.full((2, 4), 8.0, np.float32), np.full((2, 1), 8.0, np.float32))
    w, _ = client.read(rows, after=-1)
    np.testing.assert_array_equal(w, np.full((2, 4), 8.0, np.float32))
    client.close()
    serving.join(10)
    assert not serving.is_alive()
    assert len(log) == 1 and "refused a message from trainer 0 (rank 0) on the request stream: bad MAC" in log[0]
    assert server.report.requests["write"] == 1  # the refused one never reached the server


# the secret --------------------------------------------------------------------------
def test_the_secret_comes_from_a_private_file_or_the_environment(tmp_path):
    path = auth.write_secret_file(tmp_path / "job.secret", b"0123456789abcdef0123\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert auth.load_secret(str(path), environ={}) == b"0123456789abcdef0123"
    assert auth.load_secret(None, environ={auth.SECRET_ENV: "a passphrase of 20 ch"}) == b"a passphrase of 20 ch"
    assert auth.load_secret(None, environ={auth.SECRET_FILE_ENV: str(path)}) == b"0123456789abcdef0123"
    assert len(auth.new_secret()) == 64 and auth.new_secret() != auth.new_secret()


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_a_secret_file_others_may_read_or_write_is_refused(tmp_path, mode):
    path = auth.write_secret_file(tmp_path / "job.secret", b"0123456789abcdef0123")
    os.chmod(path, mode)
    with pytest.raises(
        ConfigError,
        match=rf"^the job's secret file {path} has mode 0{mode:o}: others may read it; "
        rf"make it readable by its owner only \(chmod 600 {path}\)$",
    ):
        auth.load_secret(str(path), environ={})


def test_a_missing_or_short_secret_is_a_one_line_error(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"^a distributed role needs the job's secret: set BAGPIPE_JOB_SECRET .* "
        r"or give --secret-file FILE \(mode 0600\)",
    ):
        auth.load_secret(None, environ={})
    with pytest.raises(ConfigError, match=r"^the job's secret in \$BAGPIPE_JOB_SECRET is 5 bytes; use at least 16"):
        auth.load_secret(None, environ={auth.SECRET_ENV: "short"})
    with pytest.raises(ConfigError, match=rf"^the job's secret file {tmp_path / 'none'} cannot be read \(No such file"):
        auth.load_secret(str(tmp_path / "none"), environ={})
