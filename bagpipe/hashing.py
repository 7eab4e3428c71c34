"""SplitMix64, the one counter-based hash bagpipe draws its deterministic numbers from
(embedding row initial values, synthetic data)."""

from __future__ import annotations

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ROUNDS = ((30, np.uint64(0xBF58476D1CE4E5B9)), (27, np.uint64(0x94D049BB133111EB)))


def splitmix64_(x: np.ndarray) -> np.ndarray:
    """SplitMix64 of every element of the uint64 array ``x``, *in place* (wrapping
    arithmetic, one scratch array); returns ``x``."""
    tmp = np.empty_like(x)
    with np.errstate(over="ignore"):
        x += GOLDEN
        for shift, mult in _ROUNDS:
            np.right_shift(x, np.uint64(shift), out=tmp)
            x ^= tmp
            x *= mult
        np.right_shift(x, np.uint64(31), out=tmp)
        x ^= tmp
    return x
