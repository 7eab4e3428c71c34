"""What each stream between the roles carries: the schema of every message, and
:func:`encode` / :func:`decode`, which check it.

The body of a message is the data-only encoding of :mod:`bagpipe.distributed.codec`
(never a pickle); on top of it every stream has a schema (:data:`SCHEMAS`): the
messages allowed on it, field by field, with the dtype and number of dimensions of
every array -- each server request and reply, the set-up, the cache plan, plans,
the end of the plan stream with the oracle's report, credits, checkpoint requests and
the join handshake. A message that does not match raises :class:`WireError`: the
sender refuses to send it (a bug), the receiving transport refuses it (logged).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bagpipe.accel.hot import HotPlan
from bagpipe.cache.setup import CachePlan
from bagpipe.distributed.codec import decode_value, encode_value
from bagpipe.distributed.oracle_report import OracleReport
from bagpipe.distributed.partition import TrainerPlan
from bagpipe.distributed.schema import (
    BOOL_,
    BYTES_,
    DATA,
    FLOAT_,
    INT_,
    STR_,
    Spec,
    WireError,
    array,
    by_op,
    dict_of,
    list_of,
    maybe,
    one_of,
    record,
    struct_,
)
from bagpipe.oracle.plan import Plan

# streams (gloo tags); one per direction of each conversation
REQUEST = 1  # client -> embedding server
REPLY = 2  # embedding server -> client
PLAN = 3  # oracle -> trainer
CREDIT = 4  # trainer -> oracle
CONTROL = 5  # trainer 0 -> other roles (setup, end)
HELLO = 6  # the join handshake (bagpipe.distributed.auth)
PART = 7  # embedding server -> trainer 0: its part of a checkpoint is durable (or failed)
STREAM_NAMES = {
    REQUEST: "request",
    REPLY: "reply",
    PLAN: "plan",
    CREDIT: "credit",
    CONTROL: "control",
    HELLO: "hello",
    PART: "part",
}

ROWS = array("int64", 1)
VALUES = array("float32", 2)
REQUESTS = {
    "read": struct_({"rows": ROWS, "after": INT_, "count": BOOL_}),
    "range": struct_({"start": INT_, "stop": INT_, "after": INT_}),
    "write": struct_({"rows": ROWS, "w": VALUES, "s": VALUES}),
    "mark": struct_({"label": INT_}),
    "flush": struct_({}),
    "stats": struct_({}),
    "bye": struct_({}),
    "written": struct_({}),  # the rows the shard wrote since initialisation (the digest)
    # the cut of a checkpoint; trainer 0 names the folder, the kind, whether every written
    # row goes in, and the checkpoint a full one merges with
    "checkpoint": struct_({"step": INT_}, {"dir": STR_, "kind": STR_, "everything": BOOL_, "base": maybe(STR_)}),
}
SCHEMAS: dict[int, Spec] = {
    REQUEST: by_op(REQUESTS),
    REPLY: one_of(
        rows=struct_({"w": VALUES, "s": VALUES}),
        done=struct_({}),
        part=struct_({"part": DATA}),
        cut=struct_({"cut": INT_}),
        written=struct_({"rows": ROWS}),
        error=struct_({"error": STR_}),
        stats=struct_(
            {"store": DATA, "requests": DATA, "waited_s": FLOAT_},
            {"memory": DATA, "lock_s": FLOAT_, "read_s": FLOAT_, "reply_s": FLOAT_},
        ),
    ),
    CONTROL: struct_(
        {"table_sizes": list_of(INT_), "dim": INT_, "seed": INT_, "state_dim": INT_, "restore": maybe(STR_)}
    ),
    PLAN: one_of(
        plan=record(Plan, TrainerPlan, HotPlan),
        info=record(CachePlan),  # the stream's first message: the cache every trainer builds
        end=struct_({"end": BOOL_, "report": record(OracleReport)}),
    ),
    CREDIT: maybe(INT_),  # 1 per plan taken; None: no more
    PART: one_of(
        part=struct_({"step": INT_, "part": DATA}),
        error=struct_({"step": INT_, "error": STR_, "no_space": BOOL_}),
    ),
    HELLO: one_of(
        # settings: optional in the schema, so a peer of another version is told so by the version check
        hello=struct_({"version": INT_, "nonce": BYTES_}, {"settings": dict_of(STR_)}),
        answer=struct_({"nonce": BYTES_, "proof": BYTES_}, {"settings": dict_of(STR_)}),
        proof=struct_({"proof": BYTES_}),
    ),
}


def check(stream: int, obj: Any) -> None:
    """Raise WireError unless ``obj`` is a message ``stream`` carries."""
    spec = SCHEMAS.get(stream)
    if spec is None:
        raise WireError(f"no stream {stream}")
    spec(obj, f"{STREAM_NAMES[stream]} message")


def encode(stream: int, obj: Any) -> np.ndarray:
    """The body of message ``obj`` on ``stream`` as a uint8 array; raises WireError if
    ``obj`` is not a message the stream's schema allows (a bug in the sender)."""
    check(stream, obj)
    return encode_value(obj)


def decode(stream: int, body: np.ndarray) -> Any:
    """The message in ``body`` (a uint8 array the result's arrays may view), checked
    against ``stream``'s schema; raises WireError for anything else."""
    obj = decode_value(body)
    check(stream, obj)
    return obj


__all__ = ["WireError", "encode", "decode", "check", "SCHEMAS", "STREAM_NAMES"]
