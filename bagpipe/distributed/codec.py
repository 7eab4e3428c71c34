"""The data-only encoding of a message body: typed values, raw array buffers, a few records.

Nothing that arrives from the network is unpickled or evaluated: a message body is a
tree of typed values written by :func:`encode_value` and read back by :func:`decode_value`, which
builds only numbers, strings, bytes, lists, dicts, numpy arrays, CPU tensors and the
few dataclasses listed in :data:`RECORDS` (plans, batches, the oracle's report, the
cache plan with its hot rows and memory fit), each from exactly its declared fields,
every field checked against its annotated type (a ``tuple[X, ...]`` field arrives as a
tuple). A
body that is truncated, has bytes left over, names an unknown type, dtype, encoding
or record, nests deeper than :data:`MAX_DEPTH`, claims more bytes than it has or
expands beyond :data:`MAX_DECODED_BYTES` raises :class:`WireError`. What each stream
may carry is checked on top of this by :mod:`bagpipe.distributed.wire`.

Layout of a body (little-endian; every value starts with a one-byte tag):

    NONE | FALSE | TRUE
    INT    i64                      FLOAT  f64
    STR    u32 n, n bytes of UTF-8  BYTES  u32 n, n bytes
    LIST   u32 n, n values          DICT   u32 n, n x (u32 key length, UTF-8 key, value)
    ARRAY / TENSOR  u8 dtype code, u8 ndim, ndim x i64 shape, u8 encoding, then
           RAW     zero padding to a multiple of 8 from the body's start, the C-order
                   data, zero padding to a multiple of 8
           NARROW  u8 code of the narrower integer dtype the values are stored in, then
                   the data in it as RAW
           RANGE   i64 first value, i64 step (a 1-D array of evenly spaced integers)
    RECORD u16 record code, then one value per field of the record, in declared order
           (a record whose own checks refuse the values, e.g. a HotSet's rows out of
           range, is a WireError too)

RAW arrays are received as views of the body (no copy): 8-byte aligned and writable.
Integer arrays are sent NARROW or as a RANGE when that is shorter (lossless, and
received with their own dtype): a plan's slots, its batch's one-hot offsets
(``arange``) and row ids all fit 32 bits or less, so a plan is less than half its
int64 size on the wire -- what reaches a trainer over a slow link matters (``bagpipe
bench cluster``). A body may not decode to more than :data:`MAX_DECODED_BYTES`.
"""

from __future__ import annotations

import dataclasses
import struct
import typing
from typing import Any

import numpy as np
import torch

from bagpipe.accel.hot import HotPlan
from bagpipe.accel.profile import HotSet
from bagpipe.budget.estimate import Estimate, Part, Sizes
from bagpipe.budget.sizing import Budget, Fit
from bagpipe.cache.setup import CachePlan
from bagpipe.data.batch import Batch
from bagpipe.distributed.oracle_report import OracleReport
from bagpipe.distributed.partition import TrainerPlan
from bagpipe.distributed.schema import Spec, WireError, spec_of
from bagpipe.errors import BagpipeError
from bagpipe.oracle.plan import Plan
from bagpipe.store.diskio import DiskIO

MAX_DEPTH = 16  # containers inside containers
MAX_NDIM = 4
MAX_DECODED_BYTES = 1 << 32  # what one body may expand to (a RANGE is 16 bytes however long)
NARROW_MIN = 64  # integer arrays of fewer elements are sent as they are
RAW, NARROW, RANGE = range(3)

NONE, FALSE, TRUE, INT, FLOAT, STR, BYTES, LIST, DICT, ARRAY, TENSOR, RECORD = range(12)
DTYPES = [
    np.dtype(t)
    for t in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
]
_DTYPE_CODE = {d: i for i, d in enumerate(DTYPES)}
# the only classes a message may build, by code (a record's code is part of the format)
RECORDS: dict[int, type] = {
    1: Plan,
    2: TrainerPlan,
    3: HotPlan,
    4: Batch,
    5: OracleReport,
    # the cache plan the oracle role sends every trainer, and the records inside it
    6: CachePlan,
    7: HotSet,
    8: Fit,
    9: Budget,
    10: Sizes,
    11: DiskIO,
    12: Estimate,
    13: Part,
}
_RECORD_CODE = {cls: code for code, cls in RECORDS.items()}

_U8, _U16, _U32, _I64, _F64 = (struct.Struct(f) for f in ("<B", "<H", "<I", "<q", "<d"))


# encoding ----------------------------------------------------------------------------
class _Writer:
    """Collects a body as small byte strings and arrays; :meth:`join` writes them into one
    buffer, casting a narrowed array on the way (each array is copied once)."""

    def __init__(self):
        self.parts: list[bytes | tuple[np.ndarray, np.dtype]] = []
        self.size = 0

    def put(self, b: bytes) -> None:
        self.parts.append(b)
        self.size += len(b)

    def put_array(self, a: np.ndarray, stored: np.dtype) -> None:
        self.parts.append((a, stored))
        self.size += a.size * stored.itemsize

    def pad(self) -> None:
        if self.size % 8:
            self.put(bytes(8 - self.size % 8))

    def join(self) -> np.ndarray:
        out = np.empty(self.size, dtype=np.uint8)
        at = 0
        for p in self.parts:
            if isinstance(p, tuple):
                a, stored = p
                n = a.size * stored.itemsize
                out[at : at + n].view(stored).reshape(a.shape)[...] = a  # C order, cast to the stored dtype
            else:
                n = len(p)
                out[at : at + n] = np.frombuffer(p, dtype=np.uint8)
            at += n
        return out


def encode_value(obj: Any) -> np.ndarray:
    """The body that carries ``obj``, as a uint8 array; WireError if it is not data."""
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
        raise WireError(
            f"a {type(v).__name__} cannot travel (only data: numbers, strings, lists, dicts, arrays, "
            f"tensors and the records {', '.join(c.__name__ for c in RECORDS.values())})"
        )


def _put_array(w: _Writer, tag: int, a: np.ndarray) -> None:
    dt = a.dtype.newbyteorder("=") if a.dtype.byteorder == ">" else a.dtype
    if dt not in _DTYPE_CODE:
        raise WireError(f"arrays of {a.dtype} cannot travel (allowed: {', '.join(str(d) for d in DTYPES)})")
    if a.ndim > MAX_NDIM:
        raise WireError(f"arrays of more than {MAX_NDIM} dimensions cannot travel, got {a.ndim}")
    w.put(bytes((tag, _DTYPE_CODE[dt], a.ndim)) + b"".join(_I64.pack(n) for n in a.shape))
    stored = dt
    if dt.kind == "i" and dt.itemsize > 1 and a.size >= NARROW_MIN:
        flat = a.reshape(-1)
        first, step = int(flat[0]), int(flat[1]) - int(flat[0])
        if a.ndim == 1 and int(flat[-1]) == first + (a.size - 1) * step and bool(np.all(flat[1:] - flat[:-1] == step)):
            w.put(bytes((RANGE,)) + _I64.pack(first) + _I64.pack(step))
            return
        stored = _narrowest(int(flat.min()), int(flat.max()), dt)
    if stored == dt:
        w.put(bytes((RAW,)))
    else:
        w.put(bytes((NARROW, _DTYPE_CODE[stored])))
    w.pad()
    if a.size:
        w.put_array(a, stored.newbyteorder("<"))
    w.pad()


_NARROWER = [np.dtype(t) for t in ("uint8", "int8", "uint16", "int16", "uint32", "int32")]
_BOUNDS = [(n, int(np.iinfo(n).min), int(np.iinfo(n).max)) for n in _NARROWER]


def _narrowest(lo: int, hi: int, dt: np.dtype) -> np.dtype:
    """The smallest integer dtype holding every value in [lo, hi] (``dt`` itself if none is narrower)."""
    for n, nlo, nhi in _BOUNDS:
        if n.itemsize < dt.itemsize and nlo <= lo and hi <= nhi:
            return n
    return dt


# decoding ----------------------------------------------------------------------------
class _Reader:
    def __init__(self, body: np.ndarray):
        self.body = body
        self.mv = body.data  # a memoryview of the body
        self.at = 0
        self.expanded = 0  # bytes of the arrays made (not views) so far

    def expand(self, nbytes: int) -> None:
        self.expanded += nbytes
        if self.expanded > MAX_DECODED_BYTES:
            raise WireError(f"a body that expands to more than {MAX_DECODED_BYTES:,} bytes")

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


def decode_value(body: np.ndarray) -> Any:
    """The value in ``body`` (a uint8 array its RAW arrays will view); WireError for anything else."""
    r = _Reader(body)
    v = _get(r, 0)
    if r.at != len(body):
        raise WireError(f"{len(body) - r.at} bytes left over after the message")
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
            if f.name in _tuple_fields(cls):  # a tuple travels as a list
                values[f.name] = tuple(values[f.name])
        try:
            return cls(**values)
        except (BagpipeError, ValueError) as e:  # the record's own checks (__post_init__)
            raise WireError(f"{cls.__name__}: {e}") from None
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
    encoding = r.unpack(_U8)
    count = 1
    for n in shape:
        count = min(count * n, 1 << 62)
    if encoding == RANGE:
        if ndim != 1 or dt.kind != "i":
            raise WireError(f"a range of {dt} with {ndim} dimensions")
        first, step = r.unpack(_I64), r.unpack(_I64)
        r.expand(count * dt.itemsize)
        return (first + step * np.arange(count, dtype=np.int64)).astype(dt, copy=False)
    stored = dt
    if encoding == NARROW:
        scode = r.unpack(_U8)
        if (
            scode >= len(DTYPES)
            or DTYPES[scode] not in _NARROWER
            or DTYPES[scode].itemsize >= dt.itemsize
            or dt.kind != "i"
        ):
            raise WireError(f"{dt} values stored as dtype code {scode}")
        stored = DTYPES[scode]
    elif encoding != RAW:
        raise WireError(f"unknown array encoding {encoding}")
    if count * stored.itemsize > len(r.body):
        raise WireError(f"an array of shape {shape} ({dt}) longer than the message")
    r.skip_pad()
    at = r.take(count * stored.itemsize)
    r.skip_pad()
    data = r.body[at : at + count * stored.itemsize].view(stored.newbyteorder("<"))
    if stored != dt:
        r.expand(count * dt.itemsize)
        data = data.astype(dt)
    return data.reshape(shape)


# records -----------------------------------------------------------------------------
_FIELDS: dict[type, tuple] = {}
_FIELD_SPECS: dict[tuple[type, str], Spec] = {}
_TUPLES: dict[type, frozenset[str]] = {}


def _fields(cls: type) -> tuple:
    if cls not in _FIELDS:
        _FIELDS[cls] = dataclasses.fields(cls)
    return _FIELDS[cls]


def _tuple_fields(cls: type) -> frozenset[str]:
    """The names of the fields of ``cls`` annotated as tuples."""
    if cls not in _TUPLES:
        hints = typing.get_type_hints(cls)
        _TUPLES[cls] = frozenset(f.name for f in _fields(cls) if typing.get_origin(hints[f.name]) is tuple)
    return _TUPLES[cls]


def _field_spec(cls: type, name: str) -> Spec:
    """The spec of a record's field, from its type annotation."""
    key = (cls, name)
    if key not in _FIELD_SPECS:
        _FIELD_SPECS[key] = spec_of(typing.get_type_hints(cls)[name], f"{cls.__name__}.{name}")
    return _FIELD_SPECS[key]
