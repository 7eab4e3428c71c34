"""How large a run's cache is and how far its oracle looks ahead.

One function for every topology: :func:`bagpipe.cache.setup.set_up_cache`, which the
one-process trainer and the distributed oracle role both call, sizes the cache here, so
a run sizes its cache the same way wherever the planner runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bagpipe.config.modes import ModeSpec
from bagpipe.config.sections import CacheConfig
from bagpipe.data.schema import DatasetMeta
from bagpipe.data.stream import BatchStream
from bagpipe.errors import ConfigError
from bagpipe.oracle.autotune import AutotuneChoice, choose


def lookups_per_batch(meta: DatasetMeta, stream: BatchStream, steps: int) -> int:
    """An upper bound of one batch's lookups that holds for every epoch: B*F for one-hot
    data; for multi-hot data the lookups of the B samples that have the most (blocks are
    reshuffled each epoch, so any B samples may meet in a batch). ``steps`` is unused
    but kept so callers state the run they size for."""
    B = stream.batch_size
    if not meta.multihot_features:
        return B * meta.num_features
    one_hot = meta.num_features - len(meta.multihot_features)
    top = np.zeros(0, dtype=np.int64)  # the B largest per-sample counts seen so far
    for i in range(len(meta.split("train").shard_sizes)):
        sh = stream.dataset.shard("train", i)
        counts = np.full(len(sh.labels), one_hot, dtype=np.int64)
        for _, offsets in sh.multihot.values():
            counts += np.diff(np.asarray(offsets))
        top = np.concatenate([top, counts])
        if len(top) > B:
            top = np.partition(top, len(top) - B)[len(top) - B :]
    return int(top.sum())


def default_cache_rows(total_rows: int, lookups: int) -> int:
    """5% of all rows, but never less than what one batch can touch (nor more than all)."""
    return int(min(total_rows, max(math.ceil(0.05 * total_rows), lookups)))


@dataclass(frozen=True)
class CacheSize:
    """C and L of a run, and the auto-tuner's choice when it made them."""

    rows: int
    lookahead: int
    tuned: AutotuneChoice | None = None


def size_cache(
    spec: ModeSpec,
    cache: CacheConfig,
    *,
    total_rows: int,
    dim: int,
    state_dim: int,
    stream: BatchStream,
    steps: int,
    lookups: int,
    retain: bool = False,
) -> CacheSize:
    """The cache of a mode with a store (``spec.planner`` is set), from its ``cache`` settings.

    A mode without a sized cache (``nocache``, ``fae``, ``hotline``) stages one batch;
    otherwise ``cache_rows`` if given, the auto-tuner's choice for ``cache_budget_mb`` if
    > 0 (L tuned too when the planner looks ahead), else :func:`default_cache_rows`.
    """
    if not spec.sized_cache:
        return CacheSize(lookups, cache.lookahead)
    if cache.cache_rows > total_rows:
        # slots beyond every row are never used, yet each is allocated with its optimizer
        # state (--cache-rows 100000000 on a small data set took 6 GiB and 1.5 s a step)
        raise ConfigError(
            f"--cache-rows {cache.cache_rows:,} is more than the {total_rows:,} rows of all tables: "
            f"give at most {total_rows:,} (every row cached), or leave it out for the default"
        )
    if cache.cache_budget_mb > 0:
        tuned = choose(
            cache.cache_budget_mb,
            total_rows,
            dim,
            state_dim,
            stream.batch,
            steps,
            tune_lookahead=spec.looks_ahead,
            retain=retain,
        )
        return CacheSize(tuned.cache_rows, tuned.lookahead or cache.lookahead, tuned)
    return CacheSize(cache.cache_rows or default_cache_rows(total_rows, lookups), cache.lookahead)
