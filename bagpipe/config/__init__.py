"""Typed configuration: dataclass sections with docstrings, validation, and the
command-line options and TOML keys generated from them (one source of truth)."""

from bagpipe.config.options import (
    add_options,
    build,
    flatten,
    given,
    read_toml,
    settings,
    to_flat,
)
from bagpipe.config.typed import Section, field_docs, need

__all__ = [
    "Section",
    "add_options",
    "build",
    "field_docs",
    "flatten",
    "given",
    "need",
    "read_toml",
    "settings",
    "to_flat",
]
