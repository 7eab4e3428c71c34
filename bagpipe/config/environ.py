"""Settings read from the environment (``MASTER_PORT``, ``RANK``, ``OMP_NUM_THREADS``, ...).

A variable someone else set (torchrun, a shell profile, a job scheduler) is input like
any option: a value that is not an integer in its range is a one-line
:class:`~bagpipe.errors.ConfigError` naming the variable, raised only by the command
that reads it (never while the command line is parsed, so ``--version`` and ``--help``
work whatever the environment holds).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from bagpipe.errors import ConfigError

#: The highest TCP port.
MAX_PORT = 65535


def env_int(
    name: str,
    default: int | None = None,
    *,
    lo: int = 0,
    hi: int = 2**31 - 1,
    environ: Mapping[str, str] | None = None,
) -> int:
    """``$name`` as an int in [lo, hi]; ``default`` when it is unset or empty (a
    ConfigError naming the variable when there is no default)."""
    env = os.environ if environ is None else environ
    text = env.get(name, "")
    if not text.strip():
        if default is None:
            raise ConfigError(f"environment variable {name} is not set")
        return default
    return parse_int(text, f"environment variable {name}", lo=lo, hi=hi)


def parse_int(text: str, what: str, *, lo: int, hi: int) -> int:
    """``text`` as an int in [lo, hi], or a ConfigError naming ``what``."""
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(f"{what} must be an integer in [{lo}, {hi}], got {text!r}") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{what} must be an integer in [{lo}, {hi}], got {value}")
    return value


def port(text: str, what: str) -> int:
    """A TCP port (1..65535) from ``text``."""
    return parse_int(str(text), what, lo=1, hi=MAX_PORT)
