"""Datasets: the binary shard format, batch type, deterministic batch streams and
synthetic data. (Raw-log preprocessing is :mod:`bagpipe.preprocess`.)

Names are imported lazily so that commands that never touch torch (``bagpipe
preprocess``, which writes shards through :mod:`bagpipe.data.shards`) do not pay its
~3 s import.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Batch": "bagpipe.data.batch",
    "BatchStream": "bagpipe.data.stream",
    "Dataset": "bagpipe.data.shards",
    "DatasetMeta": "bagpipe.data.schema",
    "FeatureSpec": "bagpipe.data.schema",
    "ShardWriter": "bagpipe.data.shards",
    "SplitMeta": "bagpipe.data.schema",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bagpipe.data' has no attribute {name!r}")
