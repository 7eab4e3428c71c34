"""The data-only encoding of every message the roles exchange, and its schemas.

Nothing that arrives from the network is unpickled or evaluated: a message body is a
tree of typed values written by :func:`encode` and read back by :func:`decode`, which
builds only numbers, strings, bytes, lists, dicts, numpy arrays, CPU tensors and the
few dataclasses listed in :data:`RECORDS` (plans, batches, the oracle's report), each
from exactly its declared fields. Every stream then has a schema (:data:`SCHEMAS`):
the messages allowed on it, field by field, with the dtype and number of dimensions
of every array. A body that is truncated, has bytes left over, names an unknown type,
dtype or record, nests deeper than :data:`MAX_DEPTH`, claims more bytes than it has,
or does not match its stream's schema raises :class:`WireError` -- the transport then
refuses the message (and the sender's own check refuses to send it).

Layout of a body (little-endian; every value starts with a one-byte tag):

    NONE | FALSE | TRUE
    INT    i64                      FLOAT  f64
    STR    u32 n, n bytes of UTF-8  BYTES  u32 n, n bytes
    LIST   u32 n, n values          DICT   u32 n, n x (u32 key length, UTF-8 key, value)
    ARRAY / TENSOR  u8 dtype code, u8 ndim, ndim x i64 shape, zero padding to a multiple
           of 8 from the body's start, the C-order data, zero padding to a multiple of 8
    RECORD u16 record code, then one value per field of the record, in declared order

Arrays are received as views of the body (no copy): 8-byte aligned and writable.
"""

from __future__ import annotations

import dataclasses
import struct
import typing
from typing import Any, Callable

import numpy as np
import torch

from bagpipe.accel.hot import HotPlan
from bagpipe.data.batch import Batch
from bagpipe.distributed.oracle_report import OracleReport
from bagpipe.distributed.partition import TrainerPlan
from bagpipe.errors import BagpipeError
from bagpipe.oracle.plan import Plan

# streams (gloo tags); one per direction of each conversation
REQUEST = 1  # client -> embedding server
REPLY = 2  # embedding server -> client
PLAN = 3  # oracle -> trainer
CREDIT = 4  # trainer -> oracle
CONTROL = 5  # trainer 0 -> other roles (setup, end)
HELLO = 6  # the join handshake (bagpipe.distributed.auth)
STREAM_NAMES = {REQUEST: "request", REPLY: "reply", PLAN: "plan", CREDIT: "credit", CONTROL: "control", HELLO: "hello"}

MAX_DEPTH = 16  # containers inside containers
MAX_NDIM = 4

NONE, FALSE, TRUE, INT, FLOAT, STR, BYTES, LIST, DICT, ARRAY, TENSOR, RECORD = range(12)
DTYPES = [np.dtype(t) for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                                "float16", "float32", "float64")]
_DTYPE_CODE = {d: i for i, d in enumerate(DTYPES)}
# the only classes a message may build, by code (a record's code is part of the format)
RECORDS: dict[int, type] = {1: Plan, 2: TrainerPlan, 3: HotPlan, 4: Batch, 5: OracleReport}
_RECORD_CODE = {cls: code for code, cls in RECORDS.items()}

_U8, _U16, _U32, _I64, _F64 = (struct.Struct(f) for f in ("<B", "<H", "<I", "<q", "<d"))


class WireError(BagpipeError):
    """A message body that is not a well-formed message of its stream."""


# encoding ----------------------------------------------------------------------------
class _Writer:
    """Collects a body as small byte strings and array buffers; :meth:`join` copies them once."""

    def __init__(self):
        self.parts: list[bytes | memoryview] = []
        self.size = 0

    def put(self, b: bytes | memoryview) -> None:
        self.parts.append(b)
        self.size += len(b)

    def pad(self) -> None:
        if self.size % 8:
            self.put(bytes(8 - self.size % 8))

    def join(self) -> np.ndarray:
        out = np.empty(self.size, dtype=np.uint8)
        at = 0
        for p in self.parts:
            n = len(p)
            out[at : at + n] = np.frombuffer(p, dtype=np.uint8)
            at += n
        return out


def encode(stream: int, obj: Any) -> np.ndarray:
    """The body of message ``obj`` on ``stream`` as a uint8 array; raises WireError if
    ``obj`` is not a message the stream's schema allows (a bug in the sender)."""
    check(stream, obj)
    w = _Writer()
    _put(w, obj, 0)
    return w.join()


def _put(w: _Writer, v: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise WireError(f"values nested deeper than {MAX_DEPTH}")
    if v is None:
        w.put(bytes((NONE,)))
    elif isinstance(v, (bool, np.bool_)):
        w.put(bytes((TRUE if v else FALSE,)))
    elif isinstance(v, (int, np.integer)):
        w.put(bytes((INT,)) + _I64.pack(int(v)))
    elif isinstance(v, (float, np.floating)):
        w.put(bytes((FLOAT,)) + _F64.pack(float(v)))
    elif isinstance(v, str):
        b = v.encode()
        w.put(bytes((STR,)) + _U32.pack(len(b)) + b)
    elif isinstance(v, (bytes, bytearray)):
        w.put(bytes((BYTES,)) + _U32.pack(len(v)) + bytes(v))
    elif isinstance(v, (list, tuple)):
        w.put(bytes((LIST,)) + _U32.pack(len(v)))
        for x in v:
            _put(w, x, depth + 1)
    elif isinstance(v, dict):
        w.put(bytes((DICT,)) + _U32.pack(len(v)))
        for k, x in v.items():
            if not isinstance(k, str):
                raise WireError(f"dict keys must be strings, got {type(k).__name__}")
            kb = k.encode()
            w.put(_U32.pack(len(kb)) + kb)
            _put(w, x, depth + 1)
    elif isinstance(v, np.ndarray):
        _put_array(w, ARRAY, v)
    elif isinstance(v, torch.Tensor):
        if v.device.type != "cpu":
            raise WireError(f"only CPU tensors travel, got one on {v.device}")
        _put_array(w, TENSOR, v.detach().numpy())
    elif type(v) in _RECORD_CODE:
        w.put(bytes((RECORD,)) + _U16.pack(_RECORD_CODE[type(v)]))
        for f in _fields(type(v)):
            _put(w, getattr(v, f.name), depth + 1)
    else:
        raise WireError(f"a {type(v).__name__} cannot travel (only data: numbers, strings, lists, dicts, arrays, "
                        f"tensors and the records {', '.join(c.__name__ for c in RECORDS.values())})")


def _put_array(w: _Writer, tag: int, a: np.ndarray) -> None:
    dt = a.dtype.newbyteorder("=") if a.dtype.byteorder == ">" else a.dtype
    if dt not in _DTYPE_CODE:
        raise WireError(f"arrays of {a.dtype} cannot travel (allowed: {', '.join(str(d) for d in DTYPES)})")
    if a.ndim > MAX_NDIM:
        raise WireError(f"arrays of more than {MAX_NDIM} dimensions cannot travel, got {a.ndim}")
    w.put(bytes((tag, _DTYPE_CODE[dt], a.ndim)) + b"".join(_I64.pack(n) for n in a.shape))
    w.pad()
    data = np.ascontiguousarray(a, dtype=dt.newbyteorder("<"))
    if data.nbytes:
        w.put(memoryview(data.reshape(-1).view(np.uint8)))
    w.pad()


# decoding ----------------------------------------------------------------------------
class _Reader:
    def __init__(self, body: np.ndarray):
        self.body = body
        self.mv = memoryview(body)
        self.at = 0

    def take(self, n: int) -> int:
        """Advance over ``n`` bytes; their offset."""
        if n < 0 or self.at + n > len(self.body):
            raise WireError(f"truncated: a value needs {n} bytes at offset {self.at} of {len(self.body)}")
        at, self.at = self.at, self.at + n
        return at

    def unpack(self, s: struct.Struct):
        return s.unpack_from(self.mv, self.take(s.size))[0]

    def skip_pad(self) -> None:
        if self.at % 8:
            self.take(8 - self.at % 8)


def decode(stream: int, body: np.ndarray) -> Any:
    """The message in ``body`` (a uint8 array the result's arrays will view), checked
    against ``stream``'s schema; raises WireError for anything else."""
    r = _Reader(body)
    v = _get(r, 0)
    if r.at != len(body):
        raise WireError(f"{len(body) - r.at} bytes left over after the message")
    check(stream, v)
    return v


def _get(r: _Reader, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise WireError(f"values nested deeper than {MAX_DEPTH}")
    tag = r.unpack(_U8)
    if tag == NONE:
        return None
    if tag in (FALSE, TRUE):
        return tag == TRUE
    if tag == INT:
        return r.unpack(_I64)
    if tag == FLOAT:
        return r.unpack(_F64)
    if tag in (STR, BYTES):
        n = r.unpack(_U32)
        raw = bytes(r.mv[r.take(n) : r.at])
        if tag == BYTES:
            return raw
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise WireError("a string that is not UTF-8") from None
    if tag == LIST:
        n = r.unpack(_U32)
        if n > len(r.body) - r.at:  # each value takes at least one byte
            raise WireError(f"a list of {n} values in {len(r.body) - r.at} bytes")
        return [_get(r, depth + 1) for _ in range(n)]
    if tag == DICT:
        n = r.unpack(_U32)
        if n > len(r.body) - r.at:
            raise WireError(f"a dict of {n} items in {len(r.body) - r.at} bytes")
        out = {}
        for _ in range(n):
            k = bytes(r.mv[r.take(r.unpack(_U32)) : r.at])
            try:
                key = k.decode()
            except UnicodeDecodeError:
                raise WireError("a dict key that is not UTF-8") from None
            out[key] = _get(r, depth + 1)
        return out
    if tag in (ARRAY, TENSOR):
        a = _get_array(r)
        return torch.from_numpy(a) if tag == TENSOR else a
    if tag == RECORD:
        code = r.unpack(_U16)
        cls = RECORDS.get(code)
        if cls is None:
            raise WireError(f"unknown record code {code}")
        values = {f.name: _get(r, depth + 1) for f in _fields(cls)}
        for f in _fields(cls):
            _field_spec(cls, f.name)(values[f.name], f"{cls.__name__}.{f.name}")
        return cls(**values)
    raise WireError(f"unknown value tag {tag}")


def _get_array(r: _Reader) -> np.ndarray:
    code, ndim = r.unpack(_U8), r.unpack(_U8)
    if code >= len(DTYPES):
        raise WireError(f"unknown dtype code {code}")
    if ndim > MAX_NDIM:
        raise WireError(f"an array of {ndim} dimensions (at most {MAX_NDIM})")
    shape = tuple(r.unpack(_I64) for _ in range(ndim))
    if any(n < 0 for n in shape):
        raise WireError(f"an array of negative shape {shape}")
    dt = DTYPES[code]
    count = 1
    for n in shape:
        count *= n
        if count * dt.itemsize > len(r.body):
            raise WireError(f"an array of shape {shape} ({dt}) longer than the message")
    r.skip_pad()
    at = r.take(count * dt.itemsize)
    r.skip_pad()
    return r.body[at : at + count * dt.itemsize].view(dt.newbyteorder("<")).reshape(shape)


# schemas -----------------------------------------------------------------------------
Spec = Callable[[Any, str], None]  # raises WireError naming ``where`` unless the value fits


def _fail(where: str, want: str, v: Any) -> None:
    got = type(v).__name__
    if isinstance(v, np.ndarray):
        got = f"{v.dtype} array of shape {v.shape}"
    raise WireError(f"{where}: expected {want}, got {got}")


def INT_(v: Any, where: str) -> None:
    if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)):
        _fail(where, "an integer", v)


def FLOAT_(v: Any, where: str) -> None:
    if not isinstance(v, (int, float, np.integer, np.floating)) or isinstance(v, (bool, np.bool_)):
        _fail(where, "a number", v)


def BOOL_(v: Any, where: str) -> None:
    if not isinstance(v, (bool, np.bool_)):
        _fail(where, "true or false", v)


def STR_(v: Any, where: str) -> None:
    if not isinstance(v, str):
        _fail(where, "a string", v)


def BYTES_(v: Any, where: str) -> None:
    if not isinstance(v, (bytes, bytearray)):
        _fail(where, "bytes", v)


def DATA(v: Any, where: str) -> None:
    """Any plain data (what the codec carries, records excepted): statistics, reports."""
    if type(v) in _RECORD_CODE:
        _fail(where, "plain data", v)


def array(dtype: str | None = None, ndim: int | None = None, tensor: bool = False) -> Spec:
    want = f"{'a tensor' if tensor else 'an array'}{' of ' + dtype if dtype else ''}{f' with {ndim} dimension(s)' if ndim is not None else ''}"

    def spec(v: Any, where: str) -> None:
        a = v.numpy() if tensor and isinstance(v, torch.Tensor) else v
        if not isinstance(a, np.ndarray) or (tensor and not isinstance(v, torch.Tensor)) \
                or (dtype and a.dtype != np.dtype(dtype)) or (ndim is not None and a.ndim != ndim):
            _fail(where, want, v)
    return spec


def maybe(spec: Spec) -> Spec:
    def check_maybe(v: Any, where: str) -> None:
        if v is not None:
            spec(v, where)
    return check_maybe


def list_of(spec: Spec) -> Spec:
    def check_list(v: Any, where: str) -> None:
        if not isinstance(v, (list, tuple)):
            _fail(where, "a list", v)
        for i, x in enumerate(v):
            spec(x, f"{where}[{i}]")
    return check_list


def record(*classes: type) -> Spec:
    def check_record(v: Any, where: str) -> None:
        if type(v) not in classes:
            _fail(where, " or ".join(c.__name__ for c in classes), v)
    return check_record


def struct_(required: dict[str, Spec], optional: dict[str, Spec] | None = None) -> Spec:
    """A dict with exactly the ``required`` keys and any of the ``optional`` ones."""
    optional = optional or {}

    def check_struct(v: Any, where: str) -> None:
        if not isinstance(v, dict):
            _fail(where, f"a dict of {', '.join(required) or 'nothing'}", v)
        missing = [k for k in required if k not in v]
        extra = [k for k in v if k not in required and k not in optional]
        if missing or extra:
            raise WireError(f"{where}: " + "; ".join(
                ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unexpected {', '.join(extra)}"] if extra else [])))
        for k, x in v.items():
            (required.get(k) or optional[k])(x, f"{where}.{k}")
    return check_struct


def one_of(**shapes: Spec) -> Spec:
    """One of several message shapes (named for the error message)."""
    def check_one(v: Any, where: str) -> None:
        errors = []
        for name, spec in shapes.items():
            try:
                spec(v, where)
                return
            except WireError as e:
                errors.append(f"not {name} ({e})")
        raise WireError(f"{where}: " + "; ".join(errors))
    return check_one


def by_op(ops: dict[str, Spec]) -> Spec:
    """A request: a dict whose "op" names one of ``ops``, the rest that op's fields."""
    def check_op(v: Any, where: str) -> None:
        if not isinstance(v, dict) or not isinstance(v.get("op"), str):
            _fail(where, "a request (a dict with an op)", v)
        spec = ops.get(v["op"])
        if spec is None:
            raise WireError(f"{where}: unknown op {v['op']!r}")
        spec({k: x for k, x in v.items() if k != "op"}, f"{where}[{v['op']}]")
    return check_op


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
    "checkpoint": struct_({"step": INT_}, {"dir": STR_, "kind": STR_}),  # trainer 0 names the folder and kind
}
SCHEMAS: dict[int, Spec] = {
    REQUEST: by_op(REQUESTS),
    REPLY: one_of(
        rows=struct_({"w": VALUES, "s": VALUES}),
        done=struct_({}),
        part=struct_({"part": DATA}),
        error=struct_({"error": STR_}),
        stats=struct_({"store": DATA, "requests": DATA, "waited_s": FLOAT_}),
    ),
    CONTROL: struct_({"table_sizes": list_of(INT_), "dim": INT_, "seed": INT_, "state_dim": INT_, "restore": maybe(STR_)}),
    PLAN: one_of(
        plan=record(Plan, TrainerPlan, HotPlan),
        info=struct_({"cache_rows": INT_, "lookahead": INT_, "trainers": INT_, "autotune": DATA,
                      "hot": maybe(struct_({"rows": ROWS, "report": DATA}))}),
        end=struct_({"end": BOOL_, "report": record(OracleReport)}),
    ),
    CREDIT: maybe(INT_),  # 1 per plan taken; None: no more
    HELLO: one_of(
        hello=struct_({"version": INT_, "nonce": BYTES_}),
        answer=struct_({"nonce": BYTES_, "proof": BYTES_}),
        proof=struct_({"proof": BYTES_}),
    ),
}


def check(stream: int, obj: Any) -> None:
    """Raise WireError unless ``obj`` is a message ``stream`` carries."""
    spec = SCHEMAS.get(stream)
    if spec is None:
        raise WireError(f"no stream {stream}")
    spec(obj, f"{STREAM_NAMES[stream]} message")


# records -----------------------------------------------------------------------------
_FIELDS: dict[type, tuple] = {}
_FIELD_SPECS: dict[tuple[type, str], Spec] = {}


def _fields(cls: type) -> tuple:
    if cls not in _FIELDS:
        _FIELDS[cls] = dataclasses.fields(cls)
    return _FIELDS[cls]


def _field_spec(cls: type, name: str) -> Spec:
    """The spec of a record's field, from its type annotation."""
    key = (cls, name)
    if key not in _FIELD_SPECS:
        _FIELD_SPECS[key] = _spec_of(typing.get_type_hints(cls)[name], f"{cls.__name__}.{name}")
    return _FIELD_SPECS[key]


def _spec_of(t: Any, where: str) -> Spec:
    args = typing.get_args(t)
    if type(None) in args:  # X | None
        (inner,) = [a for a in args if a is not type(None)]
        return maybe(_spec_of(inner, where))
    simple = {int: INT_, float: FLOAT_, bool: BOOL_, str: STR_, dict: DATA, list: DATA,
              np.ndarray: array(), torch.Tensor: array(tensor=True)}
    if t in simple:
        return simple[t]
    if t in _RECORD_CODE:
        return record(t)
    raise TypeError(f"{where}: a field of type {t} has no wire type")  # a record declared with a new kind of field
