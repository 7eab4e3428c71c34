"""Command-line options and TOML files generated from typed config dataclasses.

A *root* config is either one :class:`Section` (flat) or a dataclass whose fields are
sections (``TrainConfig``: ``dataset``, ``arch``, ``optim``, ...). Field names are
unique across a root's sections, so every setting has one name, used everywhere:

* on the command line as ``--field-name`` (a bool as ``--name`` / ``--no-name``), with
  the choices of a ``Literal`` type, the field's docstring as help and its default;
* in a TOML file as ``field_name = value``, either at the top level or inside a table
  named after its section (``[cache]``), as the ``--help`` of the command says.

:func:`build` merges the sources (defaults < file < command line) and constructs the
root; a wrong type or an unknown key is a one-line :class:`ConfigError` naming the
file and the key.
"""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import re
from pathlib import Path
from typing import Any

import tomllib

from bagpipe.config.typed import (
    Section,
    choices,
    closest,
    coerce,
    field_docs,
    field_types,
    get_args,
    get_origin,
    not_a,
    strip_optional,
)
from bagpipe.errors import ConfigError


def sections(root: type) -> dict[str, type[Section]]:
    """Attribute name -> section class of a root config (``{"": root}`` for a flat one)."""
    if issubclass(root, Section):
        return {"": root}
    assert dataclasses.is_dataclass(root), f"{root!r} is not a config dataclass"
    return {f.name: field_types(root)[f.name] for f in dataclasses.fields(root)}


def settings(root: type) -> dict[str, tuple[str, type[Section]]]:
    """Every setting's name -> (its section's attribute, the section class)."""
    out: dict[str, tuple[str, type[Section]]] = {}
    for attr, cls in sections(root).items():
        for f in dataclasses.fields(cls):
            if f.name in out:  # pragma: no cover - a programming error caught by the tests
                raise TypeError(f"setting {f.name!r} is declared in two sections of {root.__name__}")
            out[f.name] = (attr, cls)
    return out


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _parse_tuple(item: type):
    def parse(text: str) -> tuple:
        try:
            return tuple(item(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {item.__name__}s, got {text!r}") from None

    return parse


def add_options(
    parser: argparse.ArgumentParser, root: type, titles: dict[str, str] | None = None, skip: tuple[str, ...] = ()
) -> None:
    """One option per setting of ``root``, grouped by section (``titles``: attr -> group title).

    Every option defaults to None, meaning "not given": :func:`build` then keeps the
    value of the config file or the field's default.
    """
    for attr, cls in sections(root).items():
        title = (titles or {}).get(attr) or (cls.__doc__ or attr).strip().splitlines()[0]
        if attr:
            title += f" (TOML table [{attr}])"
        group = parser.add_argument_group(title)
        docs, types_ = field_docs(cls), field_types(cls)
        for f in dataclasses.fields(cls):
            if f.name in skip:
                continue
            tp = types_[f.name]
            base = strip_optional(tp)
            default = _default(f)
            help_ = docs.get(f.name, "").replace("%", "%%")
            if default is dataclasses.MISSING:
                help_ += " (required)"
            elif default is not None and base is not bool:
                help_ += f" (default: {_show(default)})"
            kw: dict[str, Any] = {"dest": f.name, "default": None, "help": help_}
            if base is bool:
                kw["action"] = argparse.BooleanOptionalAction
                if default is not dataclasses.MISSING:
                    kw["help"] += f" (default: {'on' if default else 'off'})"
            elif (allowed := choices(tp)) is not None:
                kw["choices"] = allowed
                kw["type"] = type(allowed[0])
            elif get_origin(base) is tuple:
                kw["type"] = _parse_tuple(get_args(base)[0])
                kw["metavar"] = "A,B,..."
            else:
                kw["type"] = base
                kw["metavar"] = {int: "N", float: "X", str: "TEXT"}.get(base, "VALUE")
            group.add_argument(flag(f.name), **kw)


def read_toml(path: str | Path) -> dict:
    """A TOML file as a dict; a missing file or a syntax error is a one-line ConfigError."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"--config {path}: is a folder, not a file; give the TOML file of settings (e.g. run.toml)")
    if str(path) == "-" or (path.exists() and not path.is_file()):  # a pipe, <(...), standard input, a device
        raise ConfigError(
            f"--config {path}: the settings are read more than once (and by every role of a job), so a pipe or "
            "standard input cannot be used; write them to a file (e.g. run.toml) and give --config run.toml"
        )
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    skip = 0
    try:
        raw = path.read_bytes()
        # a UTF-8 byte-order mark (Windows editors write one) is not TOML: dropped; CRLF line ends are TOML
        skip = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
        return tomllib.loads(raw[skip:].decode("utf-8"))
    except tomllib.TOMLDecodeError as e:
        text = raw[skip:].decode("utf-8", "replace")
        raise ConfigError(f"{path}: {value_and_table(text) or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start + skip}); a TOML file must be UTF-8") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror})") from None


_BARE = r"[A-Za-z0-9_-]+(?:\s*\.\s*[A-Za-z0-9_-]+)*"  # a bare or dotted key (quoted keys are not looked at)
_HEADER_RE = re.compile(rf"\s*\[\s*({_BARE})\s*\]\s*(?:#.*)?$")
_ASSIGN_RE = re.compile(rf"\s*({_BARE})\s*=")


def value_and_table(text: str) -> str | None:
    """Why a TOML file tomllib refused is invalid, where a key was given a value and is also
    a table -- a top-level ``data = "..."`` (the option --data) and a ``[data]`` table (its
    group's), one TOML key -- and what to write instead; None for any other mistake. A
    line-by-line look at bare keys and table headers, only after tomllib has refused the file."""
    table: tuple[str, ...] = ()
    values: dict[tuple[str, ...], tuple[int, str]] = {}  # a key given a value -> (its line, the line)
    for n, line in enumerate(text.splitlines(), 1):
        header = _HEADER_RE.match(line)
        found = header or _ASSIGN_RE.match(line)
        if found is None:
            continue
        parts = tuple(p.strip() for p in found.group(1).split("."))
        key = parts if header else table + parts
        # a table's header may be a key given a value; an assignment's key may lie below one
        clash = next((key[:k] for k in range(1, len(key) + (1 if header else 0)) if key[:k] in values), None)
        if clash is not None:
            at, given = values[clash]
            name = ".".join(clash)
            where = (
                f"the top-level key {clash[-1]!r}"
                if len(clash) == 1
                else f"the key {clash[-1]!r} in [{'.'.join(clash[:-1])}]"
            )
            return (
                f"{where} (line {at}) and the table [{name}] (line {n}) are the same TOML key, which cannot hold both "
                f"a value and a table: write {given.strip()} on a line below [{name}] instead "
                "(a setting may be given in the table of its group)"
            )
        if header:
            table = parts
        else:
            values.setdefault(key, (n, line))
    return None


def flatten(root: type, values: dict, source: str) -> dict:
    """Settings from a nested or flat mapping (a TOML file, a config.json) as one flat dict.

    A table named after a section holds that section's settings; any other key must be
    a setting's name. ``source`` (a file name) starts every error message.
    """
    known = settings(root)
    secs = sections(root)
    out: dict[str, Any] = {}

    def put(key: str, value: Any, where: str) -> None:
        if (
            key not in known and isinstance(value, dict) and not where and any(secs)
        ):  # a table, not a key: a section's name mistyped
            near = closest(key, [s for s in secs if s])
            hint = f"; did you mean [{near}]?" if near else f"; the tables are {', '.join(f'[{s}]' for s in secs if s)}"
            raise ConfigError(f"{source}: unknown table [{key}]{hint}")
        if key not in known:
            near = closest(key, list(known))
            hint = f"; did you mean {near!r}?" if near else ""
            raise ConfigError(f"{source}: unknown key {where}{key!r}{hint}")
        if key in out:
            raise ConfigError(f"{source}: key {key!r} is given twice")
        out[key] = value

    for key, value in values.items():
        if key in secs and isinstance(value, dict):  # a section (no setting takes a table)
            for k, v in value.items():
                if k in known and known[k][0] != key:
                    raise ConfigError(f"{source}: key {k!r} belongs in [{known[k][0]}], not [{key}]")
                put(k, v, f"[{key}] ")
        else:
            put(key, value, "")
    return out


def build(root: type, values: dict, source: str = "configuration"):
    """Construct ``root`` from flat ``values`` (missing ones keep their defaults).

    Each value is checked against its field's type first, so the error names
    ``source`` and the key; the sections' own validation runs after.
    """
    known = settings(root)
    parts: dict[str, dict] = {attr: {} for attr in sections(root)}
    for key, value in values.items():
        attr, cls = known[key]
        tp = field_types(cls)[key]
        try:
            coerce(tp, value)
        except ValueError:
            raise ConfigError(f"{source}: {not_a(key, tp, value)}") from None
        parts[attr][key] = value
    for attr, cls in sections(root).items():
        missing = [
            f.name for f in dataclasses.fields(cls) if _default(f) is dataclasses.MISSING and f.name not in parts[attr]
        ]
        if missing:
            raise ConfigError(f"{flag(missing[0])} is required (on the command line or in the config file)")
    try:
        if issubclass(root, Section):
            return root(**parts[""])
        return root(**{attr: cls(**parts[attr]) for attr, cls in sections(root).items()})
    except TypeError as e:  # pragma: no cover - a programming error
        raise ConfigError(str(e)) from None


def given(args: argparse.Namespace, root: type) -> dict:
    """The settings given on the command line (options left at None are not)."""
    return {k: getattr(args, k) for k in settings(root) if getattr(args, k, None) is not None}


def to_flat(cfg) -> dict:
    """A root config as one flat dict of settings (the inverse of :func:`build`)."""
    if isinstance(cfg, Section):
        return dataclasses.asdict(cfg)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        out.update(dataclasses.asdict(getattr(cfg, f.name)))
    return out
