"""JSON that every other tool can read: a non-finite number is written as ``null``.

Python's :mod:`json` writes a NaN or an infinity as the bare words ``NaN`` / ``Infinity``,
which are not JSON (``jq``, JavaScript's ``JSON.parse``, Go, Rust's serde refuse the
file). Every JSON file and line bagpipe writes -- summary.json, metrics.jsonl,
config.json, a benchmark's results.json, ``--json`` output -- goes through :func:`json_text`:
a non-finite float (an undefined metric, such as the AUC of an eval split with one
class) becomes ``null``, and ``allow_nan=False`` makes any that slipped past
:func:`finite` an error rather than an invalid file. docs/runs.md says what a
non-finite metric looks like; the readers in bagpipe take ``null`` where a number was
(``tests/unit/test_json_output.py`` checks that every ``json.dump(s)`` in the package
passes ``allow_nan=False``).
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float (numpy's float64 too) replaced by None,
    inside dicts, lists and tuples (a tuple becomes a list, as JSON writes it)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def json_text(obj: Any, **kwargs: Any) -> str:
    """:func:`json.dumps` of ``obj`` with its non-finite floats as ``null`` (:func:`finite`);
    any other non-finite value it meets (a type :func:`finite` does not walk) is a ValueError."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)
