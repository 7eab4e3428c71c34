"""argparse types of the hand-written options (the generated ones check through :mod:`bagpipe.config.typed`).

Each refuses a bad value while the command line is parsed, so the error is argparse's
one line naming the option (``argument --samples: must be an integer >= 1, got 0``):

* :func:`count` -- an integer in [lo, 2^63) (numpy's and torch's int64);
* :func:`real` -- a finite number in a range (NaN and infinity mean nothing as a size,
  a rate or a time-out);
* :func:`path` -- a non-empty path (an empty one would silently mean the current folder);
  :func:`text` -- non-empty text.
"""

from __future__ import annotations

import argparse
import math

from bagpipe.config.typed import INT_LIMIT


def count(lo: int = 0, hi: int = INT_LIMIT - 1):
    """An argparse type: an integer in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not lo <= value <= hi:
            bound = f">= {lo}" if hi == INT_LIMIT - 1 else f"in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"must be an integer {bound}, got {value}")
        return value

    parse.__name__ = "integer"  # what argparse names in its own messages
    return parse


def real(lo: float = 0.0, hi: float = math.inf, *, lo_open: bool = False, hi_open: bool = False):
    """An argparse type: a finite number in the range from lo to hi (open ends as asked)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        ok = (
            math.isfinite(value)
            and (value > lo if lo_open else value >= lo)
            and (value < hi if hi_open else value <= hi)
        )
        if not ok:
            left, right = "(" if lo_open else "[", ")" if hi_open or hi == math.inf else "]"
            raise argparse.ArgumentTypeError(f"must be a finite number in {left}{lo:g}, {hi:g}{right}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def path(text: str) -> str:
    """An argparse type: a non-empty path."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path (it would mean the current folder); give a file or folder")
    return text


def text(value: str) -> str:
    """An argparse type: non-empty text (a host name, ...)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("empty")
    return value


def given_once(why: str) -> type[argparse.Action]:
    """An option's action that takes one value: a second is a usage error saying ``why``
    (after "given twice (A and B): "), not silently the one used (``predict --input A
    --input B`` scored only B, round 19; ``train --config a.toml --config b.toml`` read only
    b.toml, round 22)."""

    class GivenOnce(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None) -> None:
            before = getattr(namespace, self.dest, None)
            if before is not None:
                parser.error(f"{option_string} given twice ({before} and {values}): {why}")
            setattr(namespace, self.dest, values)

    return GivenOnce
