"""The checks of a message's shape: small composable specs (a spec raises WireError unless a value fits).

A spec is a function ``spec(value, where)``; :mod:`bagpipe.distributed.wire` builds the
schema of every stream from these, and :mod:`bagpipe.distributed.codec` checks each
field of a record against the spec of its type annotation (:func:`spec_of`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bagpipe.errors import BagpipeError


class WireError(BagpipeError):
    """A message body that is not a well-formed message of its stream."""


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
    if dataclasses.is_dataclass(v):
        _fail(where, "plain data", v)


def array(dtype: str | None = None, ndim: int | None = None, tensor: bool = False) -> Spec:
    want = f"{'a tensor' if tensor else 'an array'}{' of ' + dtype if dtype else ''}{f' with {ndim} dimension(s)' if ndim is not None else ''}"

    def spec(v: Any, where: str) -> None:
        a = v.numpy() if tensor and isinstance(v, torch.Tensor) else v
        if (
            not isinstance(a, np.ndarray)
            or (tensor and not isinstance(v, torch.Tensor))
            or (dtype and a.dtype != np.dtype(dtype))
            or (ndim is not None and a.ndim != ndim)
        ):
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


def dict_of(spec: Spec) -> Spec:
    """A dict of text keys, each value as ``spec``."""

    def check_dict(v: Any, where: str) -> None:
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            _fail(where, "a dict with text keys", v)
        for k, x in v.items():
            spec(x, f"{where}[{k!r}]")

    return check_dict


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
            raise WireError(
                f"{where}: "
                + "; ".join(
                    ([f"missing {', '.join(missing)}"] if missing else [])
                    + ([f"unexpected {', '.join(extra)}"] if extra else [])
                )
            )
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


def spec_of(t: Any, where: str) -> Spec:
    """The spec of a value of annotated type ``t`` (a record's field); TypeError for a type the wire cannot carry."""
    args = typing.get_args(t)
    if type(None) in args:  # X | None
        (inner,) = [a for a in args if a is not type(None)]
        return maybe(spec_of(inner, where))
    if typing.get_origin(t) is tuple and len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]
        return list_of(spec_of(args[0], where))
    simple = {
        int: INT_,
        float: FLOAT_,
        bool: BOOL_,
        str: STR_,
        dict: DATA,
        list: DATA,
        np.ndarray: array(),
        torch.Tensor: array(tensor=True),
    }
    if t in simple:
        return simple[t]
    if isinstance(t, type) and dataclasses.is_dataclass(t):
        return record(t)
    raise TypeError(f"{where}: a field of type {t} has no wire type")  # a record declared with a new kind of field
