"""Typed, documented, validated dataclass configs: the machinery every config shares.

A config is a keyword-only dataclass whose fields carry a type annotation (``int``,
``float``, ``bool``, ``str``, ``X | None``, ``Literal[...]``, ``tuple[int, ...]``) and a
docstring right below the field, torchtitan-style::

    @dataclass(kw_only=True)
    class CacheConfig(Section):
        mode: Literal["full", "lookahead"] = "full"
        \"\"\"full (every table in memory) or lookahead (the oracle).\"\"\"

:class:`Section` checks every value against its annotation before the class's own
``validate()`` runs, so a value from a TOML file that has the wrong type is a one-line
:class:`ConfigError` naming the key. :func:`field_docs` reads the docstrings back from
the source (what ``--help`` prints), so each field is documented once, where it is
declared.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import linecache
import math
import sys
import textwrap
import types
import typing
from collections.abc import Sequence
from functools import cache
from typing import Any, Literal, Union, get_args, get_origin

from bagpipe.errors import ConfigError


def field_docs(cls: type) -> dict[str, str]:
    """``{field: docstring}`` of a dataclass, from the string literal below each field.

    Inherited fields are included; a class whose source is unavailable gives ``{}``.
    """
    return _field_docs(cls)


def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass's fields (postponed annotations evaluated).

    Each class of the MRO has its annotations evaluated in its own module, so a section
    may subclass one from another module whose annotations use names it does not import.
    """
    return _field_types(cls)


# Cached by class. (Behind a plain function: a type checker takes a dataclass whose
# instances are unhashable for an unhashable argument of the cache.)
@cache
def _field_docs(cls: type) -> dict[str, str]:
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        body = _class_body(klass)
        for node, nxt in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[node.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return docs


def _class_body(klass: type) -> list[ast.stmt]:
    """The statements of ``klass``'s definition; [] where its source is unavailable. Found
    by its qualified name in its module's syntax tree, parsed once per module --
    ``inspect.getsource`` would parse the module again for each class (most of the time
    ``bagpipe train --help`` took to build its options)."""
    module = sys.modules.get(klass.__module__)
    tree = _module_tree(getattr(module, "__file__", None) or "")
    scope: list[ast.stmt] = tree.body if tree is not None else []
    *outer, name = [part for part in klass.__qualname__.split(".") if part != "<locals>"]
    for part in outer:  # the classes and functions it is defined in
        named = [
            n for n in scope if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == part
        ]
        scope = named[-1].body if named else []  # a name defined twice: the later definition is the one in use
    found = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == name]
    if found:
        return found[-1].body
    try:  # defined where a plain walk does not reach (inside an `if`, say): inspect's search
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError, SyntaxError):
        return []
    return tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []


@cache
def _module_tree(filename: str) -> ast.Module | None:
    """The syntax tree of the source file ``filename`` (None: none, or not Python)."""
    lines = linecache.getlines(filename) if filename.endswith(".py") else []
    try:
        return ast.parse("".join(lines)) if lines else None
    except (SyntaxError, ValueError):
        return None


@cache
def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def is_optional(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


def strip_optional(tp: Any) -> Any:
    """``X | None`` -> ``X``; anything else unchanged."""
    if is_optional(tp):
        rest = [a for a in get_args(tp) if a is not type(None)]
        return rest[0] if len(rest) == 1 else Union[tuple(rest)]  # noqa: UP007 - a runtime union of a tuple
    return tp


def choices(tp: Any) -> tuple | None:
    """The allowed values of a ``Literal[...]`` type (optional or not), else None."""
    tp = strip_optional(tp)
    return get_args(tp) if get_origin(tp) is Literal else None


def describe(tp: Any) -> str:
    """A type as a message names it: "an int", "one of 'sgd', 'adagrad'", ..."""
    opt = is_optional(tp)
    tp = strip_optional(tp)
    if get_origin(tp) is Literal:
        text = "one of " + ", ".join(repr(c) for c in get_args(tp))
    elif get_origin(tp) is tuple:
        text = f"a list of {describe(get_args(tp)[0]).split(' ', 1)[1]}s"
    else:
        text = {int: "an int", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))
    return text + (" (or nothing)" if opt else "")


def closest(typed: str, known: Sequence[str]) -> str | None:
    """The one of ``known`` closest to ``typed`` (a misspelling of it), or None: the one
    "did you mean" of the command line (a command, an option, a choice) and of a config
    file (a key, a table, a value)."""
    import difflib

    return next(iter(difflib.get_close_matches(typed, known, n=1)), None)


def not_a(name: str, tp: Any, value: Any) -> str:
    """The message on ``value``, which is not a ``tp``, given for setting ``name``: a string
    close to one of a ``Literal``'s choices offers it, as the command line does
    (``mode must be one of 'full', ..., got 'lookahed'; did you mean 'lookahead'?``)."""
    text = f"{name} must be {describe(tp)}, got {value!r}"
    allowed = choices(tp)
    near = closest(value, [c for c in allowed if isinstance(c, str)]) if allowed and isinstance(value, str) else None
    return text + (f"; did you mean {near!r}?" if near is not None else "")


def coerce(tp: Any, value: Any) -> Any:
    """``value`` checked against ``tp`` and normalised (an int for a float field becomes a
    float, a list for a tuple field a tuple); raises ValueError when it does not fit."""
    if value is None:
        if is_optional(tp):
            return None
        raise ValueError
    tp = strip_optional(tp)
    origin = get_origin(tp)
    if origin is Literal:
        if value in get_args(tp) and type(value) in {type(c) for c in get_args(tp)}:
            return value
        raise ValueError
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError
        item = get_args(tp)[0]
        return tuple(coerce(item, v) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ValueError
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ValueError
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError
    raise TypeError(f"unsupported config type {tp!r}")


@dataclasses.dataclass(kw_only=True)
class Section:
    """Base of every config dataclass: type-checks fields, then runs :meth:`validate`."""

    def __post_init__(self) -> None:
        for name, tp in field_types(type(self)).items():
            value = getattr(self, name)
            try:
                value = coerce(tp, value)
            except ValueError:
                raise ConfigError(not_a(name, tp, value)) from None
            in_range(name, value)
            object.__setattr__(self, name, value)
        self.validate()

    def validate(self) -> None:
        """Cross-field checks of the subclass; raise ConfigError with one line."""


#: Every int setting fits a signed 64-bit integer (numpy's and torch's): a larger one
#: would fail deep inside, not as a message.
INT_LIMIT = 2**63


def in_range(name: str, value: Any) -> None:
    """The checks every setting of a type gets: a float is finite (NaN and infinity
    mean nothing as a rate, a size or a time-out), an int fits in 64 bits, a string is
    not empty (an empty path would silently mean the current folder)."""
    if isinstance(value, str) and not value:
        raise ConfigError(f"{name} must not be empty")
    values = value if isinstance(value, tuple) else (value,)
    for v in values:
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{name} must be a finite number, got {v}")
        if isinstance(v, int) and not isinstance(v, bool) and not -INT_LIMIT <= v < INT_LIMIT:
            raise ConfigError(f"{name} must be below 2^63 in magnitude, got {v}")


def need(cond: bool, message: str) -> None:
    """Raise ConfigError(message) unless ``cond``: the one-liner validations are made of."""
    if not cond:
        raise ConfigError(message)


def finite(x: float) -> bool:
    return math.isfinite(x)
