"""Choose the cache size and lookahead from a memory budget (``bagpipe train --cache-budget-mb``).

The cache size follows from the budget alone: a cached row costs its weights and
optimizer state, ``4 * (D + S)`` bytes, plus the oracle's bookkeeping of its slot (one
int64, 8 bytes), so ``cache_rows = budget // (4 * (D + S) + 8)`` (at most every row).

The lookahead L is then chosen by planning: the :class:`LookaheadOracle` runs over the
run's first batches with that many slots for each candidate L = 1, 2, 4, ..., 256, and
the largest L whose plans need no forced evictions — or fewer than ``tolerance`` (1%) of
the misses — wins: the working set of its window fits the cache. A larger window keeps
more rows between their uses (a higher hit rate) but needs more slots; once the window
no longer fits, rows are forced out and fetched again. Each candidate is planned over
``max(min_batches, 2L + 1)`` batches (capped by the run's length), so every candidate
sees at least L steps with a full window. Candidates are tried in increasing order and
the search stops at the first that does not fit (the working set only grows with L).
Candidates longer than the run are clipped to its length (a longer window plans the
run the same way, but would prefetch further ahead).

Everything here is planning only (no rows move), deterministic, and reads the same
batches the run will train on; the choice never changes what is computed, only how fast.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from bagpipe.data.batch import Batch
from bagpipe.errors import CapacityError, ConfigError
from bagpipe.oracle.lookahead import LookaheadOracle

#: Lookahead values tried, in order.
DEFAULT_CANDIDATES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: Bytes of the oracle's per-slot bookkeeping (``slot_seq``: one int64 per slot).
SLOT_BOOKKEEPING_BYTES = 8
#: Batches planned per candidate at least (the issue's K = min(steps, 200)).
MIN_BATCHES = 200
#: Forced evictions tolerated, as a fraction of the misses.
TOLERANCE = 0.01

_MIB = 1 << 20


def bytes_per_cached_row(dim: int, state_dim: int) -> int:
    """Memory one cache slot costs: float32 weights and optimizer state plus the slot's bookkeeping."""
    return 4 * (dim + state_dim) + SLOT_BOOKKEEPING_BYTES


def rows_for_budget(budget_mb: float, dim: int, state_dim: int, num_rows: int) -> int:
    """Cache rows a budget of ``budget_mb`` MiB holds (at most ``num_rows``)."""
    return int(min(num_rows, (budget_mb * _MIB) // bytes_per_cached_row(dim, state_dim)))


def budget_mb_for_rows(rows: int, dim: int, state_dim: int) -> float:
    """The budget (MiB) that buys exactly ``rows`` cache rows."""
    return rows * bytes_per_cached_row(dim, state_dim) / _MIB


@dataclass
class Trial:
    """One candidate L planned over ``batches`` batches."""

    lookahead: int
    batches: int
    hit_rate: float
    misses: int
    forced_evictions: int
    max_occupied: int
    fits: bool


@dataclass
class AutotuneChoice:
    """What the tuner chose and why."""

    budget_mb: float
    bytes_per_row: int
    num_rows: int
    cache_rows: int
    lookahead: int | None
    """None when the mode does not look ahead (lru)."""
    reason: str
    trials: list[Trial] = field(default_factory=list)

    @property
    def fraction_of_rows(self) -> float:
        return self.cache_rows / self.num_rows if self.num_rows else 0.0

    def line(self) -> str:
        """``cache budget M MiB -> C rows (x% of rows), lookahead L: why``."""
        la = "not used (lru)" if self.lookahead is None else str(self.lookahead)
        return (
            f"cache budget {self.budget_mb:g} MiB -> {self.cache_rows:,} rows ({self.fraction_of_rows:.2%} of rows, "
            f"{self.bytes_per_row} bytes each), lookahead {la}: {self.reason}"
        )

    def as_dict(self) -> dict:
        d = asdict(self)
        d["fraction_of_rows"] = self.fraction_of_rows
        return d


def _unique_only(batch: Batch) -> Batch:
    """The batch reduced to its sorted unique rows: all the oracle's plan counts depend on."""
    rows = np.unique(batch.rows.numpy())
    empty = torch.zeros(0)
    return Batch(labels=empty, dense=empty, rows=torch.from_numpy(rows), offsets=empty, num_features=batch.num_features)


def choose(
    budget_mb: float,
    num_rows: int,
    dim: int,
    state_dim: int,
    batch_at: Callable[[int], Batch],
    num_batches: int,
    *,
    tune_lookahead: bool = True,
    candidates: tuple[int, ...] = DEFAULT_CANDIDATES,
    min_batches: int = MIN_BATCHES,
    tolerance: float = TOLERANCE,
    retain: bool = False,
) -> AutotuneChoice:
    """Pick the cache rows and lookahead for a memory budget.

    Args:
        budget_mb: MiB the trainer's cache may use (> 0).
        num_rows: rows of all tables.
        dim, state_dim: D and the optimizer's per-row state S.
        batch_at: ``batch_at(k)`` is the run's batch k (a pure function of k).
        num_batches: batches the run will train on (the tuner reads at most
            ``max(min_batches, 2 * max(candidates) + 1)`` of them).
        retain: trial the oracle the run will plan with (one trainer's retains rows past
            their window, :class:`~bagpipe.oracle.lookahead.LookaheadOracle`).
        tune_lookahead: False (lru) sizes the cache only.

    Raises:
        CapacityError: the budget does not hold one batch's unique rows.
    """
    if not (budget_mb > 0 and math.isfinite(budget_mb)):
        raise ConfigError(f"cache budget must be a finite number of MiB > 0, got {budget_mb!r}")
    if num_batches < 1:
        raise ConfigError("the tuner needs at least one batch")
    if not candidates or min(candidates) < 1:
        raise ConfigError(f"lookahead candidates must be >= 1, got {candidates}")
    # a window longer than the run plans it like one as long as the run
    cands = sorted({min(int(c), num_batches) for c in candidates})
    bpr = bytes_per_cached_row(dim, state_dim)
    cache_rows = rows_for_budget(budget_mb, dim, state_dim, num_rows)
    choice = AutotuneChoice(
        budget_mb=float(budget_mb),
        bytes_per_row=bpr,
        num_rows=int(num_rows),
        cache_rows=cache_rows,
        lookahead=None,
        reason="",
    )

    batches: list[tuple[int, Batch]] = []

    def first(n: int) -> list[tuple[int, Batch]]:
        while len(batches) < n:
            k = len(batches)
            batches.append((k, _unique_only(batch_at(k))))
        return batches[:n]

    # the cache must hold the largest batch's unique rows (checked over the batches the
    # search reads; more than the cache can hold is a CapacityError at run time anyway)
    widest = max(len(b.rows) for _, b in first(min(num_batches, min_batches)))
    if cache_rows < widest:
        need = budget_mb_for_rows(widest, dim, state_dim)
        raise CapacityError(
            f"a cache budget of {budget_mb:g} MiB buys {cache_rows:,} rows ({bpr} bytes each), which cannot hold "
            f"a batch's up to {widest:,} unique rows; give at least {math.ceil(need * 100) / 100:g} MiB"
        )
    whole = "the whole table fits; " if cache_rows == num_rows else ""
    if not tune_lookahead:
        choice.reason = f"{whole}the cache size follows from the budget alone"
        return choice

    best: Trial | None = None
    stop: Trial | None = None
    for L in cands:
        n = min(num_batches, max(min_batches, 2 * L + 1))
        oracle = LookaheadOracle(num_rows, cache_rows, L, retain=retain)  # as the run will plan
        for _ in oracle.plans(first(n)):
            pass
        st = oracle.stats
        forced = int(st.forced_evictions)
        fits = forced == 0 or forced < tolerance * st.misses
        trial = Trial(L, n, float(st.as_dict()["hit_rate"]), int(st.misses), forced, int(st.max_occupied), fits)
        choice.trials.append(trial)
        del oracle
        if not fits:
            stop = trial
            break
        best = trial

    if best is None:
        # even L=1 forces rows out: the cache barely holds a batch; L=1 keeps the fewest rows
        t = choice.trials[0]
        choice.lookahead = cands[0]
        choice.reason = (
            f"{whole}even L={cands[0]} forces {t.forced_evictions:,} rows out over {t.batches} batches "
            f"({t.forced_evictions / max(t.misses, 1):.1%} of misses): the cache is barely larger than a batch"
        )
        return choice
    choice.lookahead = best.lookahead
    why = (
        f"the largest L whose window fits: {best.batches} planned batches need "
        f"{best.max_occupied:,} slots, {best.forced_evictions:,} forced evictions, hit rate {best.hit_rate:.1%}"
    )
    if stop is not None:
        why += (
            f"; L={stop.lookahead} would force {stop.forced_evictions:,} rows out "
            f"({stop.forced_evictions / max(stop.misses, 1):.1%} of misses)"
        )
    elif best.lookahead >= num_batches:
        why += f"; the window spans all {num_batches} batches of the run"
    elif best.lookahead == cands[-1]:
        why += " (the largest candidate)"
    choice.reason = whole + why
    return choice
