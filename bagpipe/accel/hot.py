"""The hot tier: the most accessed rows stay in the trainer for the whole run.

In a click log about 1% of the rows take about 90% of the lookups. FAE and Hotline keep
those rows in fast memory; here they form a *hot tier* in front of the unchanged
planners (``lookahead``, ``lru``, ``nocache``):

* :class:`~bagpipe.accel.profile.HotSet`: H global rows (ascending), chosen by the
  profiler or read from its file.
* **Where they live.** The trainer's cache tensor has C + H slots: the planner's C slots
  for cold rows, then slot C + i for hot row i, filled from the store when training
  starts (:class:`bagpipe.train.backends.CachedBackend`) and written back by the
  backend's flush and finish like every cached row -- at checkpoints, before an
  evaluation and at the end -- so checkpoints, ``params_sha256`` and export cover them.
* **What the planner sees.** :class:`HotSplit` wraps a planner: every batch's unique rows
  are split into hot and cold, the planner receives only the cold ones (as a batch whose
  lookups are those rows; it reads nothing else of a batch) and so plans, fetches and
  writes back only those; each of its plans is then turned back into the step's plan over
  *all* the batch's unique rows in ascending row order, the hot ones at slots C + i
  (:class:`HotPlan`). The step gathers the same values in the same order as ``--mode
  full``: the result is bitwise equal.
* **Data-parallel trainers.** The oracle role splits and merges, so trainers receive
  ordinary plans; every trainer holds the hot rows. A hot row never expires, so the
  partitioned cache synchronises it (its gradient averaged over the trainers) like any
  row that stays cached. Its ``next_use`` is the next step when the next batch uses it
  (the oracle has read that batch already), so its synchronisation is urgent exactly
  when the partitioned cache needs it to be, and overlaps the next step otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch

from bagpipe.accel.profile import HotSet, profile
from bagpipe.accel.schedule import FaeSchedule
from bagpipe.config.modes import ModeSpec
from bagpipe.config.sections import HotConfig
from bagpipe.data.batch import Batch
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.oracle.plan import Plan
from bagpipe.oracle.unique import unique_inverse

log = logging.getLogger(__name__)
_NO_BOOL = np.zeros(0, dtype=bool)


@dataclass
class HotPlan(Plan):
    """A step's plan over all its unique rows, when a hot tier serves some of them.

    Extra attributes:
        hot: (U,) bool, which of ``rows`` are hot (their slots are C + i).
        popular: (B,) bool, the inputs whose lookups are all hot (Hotline's popular micro-batch).

    ``next_use`` (lookahead plans) of a hot row is ``step + 1`` if the next batch uses it,
    else -1 (a hot row is never planned, so no later use is known).
    """

    hot: np.ndarray = field(default_factory=lambda: _NO_BOOL)
    popular: np.ndarray = field(default_factory=lambda: _NO_BOOL)


@dataclass
class _ColdLookups:
    """A batch as the planner behind a hot tier sees it: ``rows`` (Uc,) are the batch's
    unique cold rows, ascending (all a planner reads of a batch); the rest is for the merge."""

    rows: torch.Tensor
    batch: Batch
    uniq: np.ndarray  # (U,) every unique row of the batch, ascending
    inverse: np.ndarray  # (N,) index into uniq of every lookup
    hot: np.ndarray  # (U,) bool
    hot_pos: np.ndarray  # (U_hot,) index in the hot set of each hot one


@dataclass
class HotStats:
    """What the hot tier served, over every step planned."""

    steps: int = 0
    lookups: int = 0
    hot_lookups: int = 0
    unique_rows: int = 0
    hot_unique_rows: int = 0
    inputs: int = 0
    popular_inputs: int = 0
    popular_min: int | None = None
    popular_max: int = 0
    all_hot_batches: int = 0
    seconds: float = 0.0  # splitting batches and merging plans (the planner's thread)

    def add(self, plan: HotPlan, lookup_hot: np.ndarray) -> None:
        """Count ``plan``; ``lookup_hot`` (N,) whether each of its lookups is hot."""
        n_pop = int(plan.popular.sum())
        self.steps += 1
        self.lookups += len(plan.inverse)
        self.hot_lookups += int(lookup_hot.sum())
        self.unique_rows += len(plan.rows)
        self.hot_unique_rows += int(plan.hot.sum())
        self.inputs += len(plan.popular)
        self.popular_inputs += n_pop
        self.popular_min = n_pop if self.popular_min is None else min(self.popular_min, n_pop)
        self.popular_max = max(self.popular_max, n_pop)
        self.all_hot_batches += int(n_pop == len(plan.popular))

    def as_dict(self) -> dict:
        steps = max(self.steps, 1)
        return {
            "lookups": self.lookups,
            "hot_lookups": self.hot_lookups,
            "lookup_share": self.hot_lookups / max(self.lookups, 1),
            "unique_rows": self.unique_rows,
            "hot_unique_rows": self.hot_unique_rows,
            "unique_share": self.hot_unique_rows / max(self.unique_rows, 1),
            "input_share": self.popular_inputs / max(self.inputs, 1),
            "all_hot_batches": self.all_hot_batches,
            # Hotline's micro-batch sizes: the popular one, per step (the rest is the other one)
            "popular_inputs_per_step": {
                "mean": self.popular_inputs / steps,
                "min": self.popular_min or 0,
                "max": self.popular_max,
            },
            "split_ms_per_step": 1000 * self.seconds / steps,
        }


def popular_inputs(batch: Batch, lookup_hot: np.ndarray) -> np.ndarray:
    """(B,) bool: the inputs of ``batch`` whose lookups are all hot, given (N,) ``lookup_hot``."""
    B, F = batch.batch_size, batch.num_features
    offsets = batch.offsets.numpy()
    if len(lookup_hot) == F * B and np.array_equal(offsets, np.arange(F * B + 1)):  # one id per bag: a (F, B) grid
        return np.asarray(lookup_hot.reshape(F, B).all(axis=0))
    bag = np.repeat(np.arange(F * B, dtype=np.int64), np.diff(offsets))
    return np.bincount(bag[~lookup_hot] % B, minlength=B) == 0


class HotSplit:
    """A planner's view of the batches with the hot rows taken out, and its plans with them
    put back (see the module docstring).

    Args:
        hot: the hot rows.
        cache_rows: C, the planner's slots (hot row i sits in slot C + i).
        schedule: ``keep`` the data order, or ``split`` into all-hot and other batches (FAE).
    """

    def __init__(self, hot: HotSet, cache_rows: int, schedule: str = "keep"):
        self.hot, self.C, self.schedule = hot, int(cache_rows), schedule
        self.stats = HotStats()
        self._hot_pos: dict[int, np.ndarray] = {}  # step -> its hot rows' indices, split and not yet merged
        self._mark = np.zeros(len(hot), dtype=bool)  # scratch: the hot rows a later batch uses

    def plans(self, planner, stream: BatchStream, start: int, stop: int) -> Iterator[HotPlan]:
        """The plans of steps [start, stop): ``planner`` (anything with ``plans(batches)``) plans the cold rows."""
        source = FaeSchedule(stream, self.hot) if self.schedule == "split" else stream
        return self.wrap(planner, source.numbered(start, stop))

    def wrap(self, planner, batches: Iterable[tuple[int, Batch]]) -> Iterator[HotPlan]:
        """The plans of ``(step, batch)`` pairs (in step order), ``planner`` planning the cold rows."""
        # the planner's own way to find a batch's unique rows when it has one (the lookahead
        # oracle's uses its row map as scratch space): the same result as unique_inverse
        return self._merge(planner.plans(self._split(batches, getattr(planner, "unique_inverse", unique_inverse))))

    def _next_use(self, step: int, pos: np.ndarray) -> np.ndarray:
        """``next_use`` of the hot rows ``pos`` (indices in the hot set) of ``step``: step + 1
        where the next batch uses them, else -1; step + 1 for all when that batch has not been
        split yet (a planner that does not read ahead)."""
        later = self._hot_pos.get(step + 1)
        if later is None:
            return np.full(len(pos), step + 1, dtype=np.int64)
        self._mark[later] = True
        used = self._mark[pos]
        self._mark[later] = False
        return np.where(used, step + 1, -1)

    def report(self) -> dict:
        """What the hot tier served so far, and the schedule (the summary's ``cache.hot``)."""
        return self.stats.as_dict() | {"schedule": self.schedule}

    def _split(
        self,
        batches: Iterable[tuple[int, Batch]],
        unique: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] = unique_inverse,
    ) -> Iterator[tuple[int, _ColdLookups]]:
        for step, batch in batches:
            t0 = time.perf_counter()
            uniq, inverse = unique(batch.rows.numpy())
            hot = self.hot.contains(uniq)
            part = _ColdLookups(torch.from_numpy(uniq[~hot]), batch, uniq, inverse, hot, self.hot.position(uniq[hot]))
            self._hot_pos[step] = part.hot_pos
            self.stats.seconds += time.perf_counter() - t0
            yield step, part

    def _merge(self, plans: Iterable[Plan]) -> Iterator[HotPlan]:
        for plan in plans:
            t0 = time.perf_counter()
            part = cast(_ColdLookups, plan.batch)  # what _split handed the planner as the batch
            hot, cold = part.hot, ~part.hot
            slots = np.empty(len(part.uniq), dtype=np.int64)
            slots[cold] = plan.slots  # plan.rows == part.uniq[cold]: the same ascending order
            slots[hot] = self.C + part.hot_pos
            del self._hot_pos[plan.step]
            next_use = plan.next_use
            if len(next_use):
                next_use = np.empty(len(part.uniq), dtype=np.int64)
                next_use[cold] = plan.next_use
                next_use[hot] = self._next_use(plan.step, part.hot_pos)
            fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(Plan)}
            fields.update(batch=part.batch, rows=part.uniq, slots=slots, inverse=part.inverse, next_use=next_use)
            lookup_hot = hot[part.inverse]
            merged = HotPlan(**fields, hot=hot, popular=popular_inputs(part.batch, lookup_hot))
            self.stats.add(merged, lookup_hot)
            self.stats.seconds += time.perf_counter() - t0
            yield merged


def hot_set_for(hot: HotConfig, spec: ModeSpec, dataset: Dataset, dim: int, state_dim: int, seed: int) -> HotSet | None:
    """The run's hot rows: read from ``--hot-rows``, profiled for ``--hot-budget-mb`` (the
    mode's own budget -- FAE's 256 MiB for fae and hotline -- when neither is given), or
    None without a hot tier. Says which (one line on the ``bagpipe`` logger)."""
    if hot.hot_rows:
        rows = HotSet.load(hot.hot_rows, dataset.meta.table_sizes)
        rows.report["source"] = str(hot.hot_rows)
        sized = (rows.report.get("dim"), rows.report.get("state_dim"))
        if sized[0] is not None and sized != (dim, state_dim):
            log.warning(
                f"--hot-rows {hot.hot_rows}: sized for D={sized[0]} + {sized[1]} optimizer values a row, this "
                f"run has D={dim} + {state_dim}: its {len(rows):,} rows take {rows.mib(dim, state_dim):,.2f} MiB, not "
                f"the {rows.report.get('budget_mb', 0):g} MiB it was chosen for; profile again with "
                f"`bagpipe profile --embedding-dim {dim}` and this run's --optimizer"
            )
    else:
        budget = hot.hot_budget_mb or spec.hot_budget_mb
        if budget <= 0:
            return None
        rows = profile(dataset, budget, dim=dim, state_dim=state_dim, sample_rate=hot.hot_sample_rate, seed=seed)
        rows.report["source"] = "profiled at start-up"
    log.info(rows.line(dim, state_dim))
    return rows


def hot_section(hot: HotSet, dim: int, state_dim: int, split: dict) -> dict:
    """The summary's ``cache.hot``: the resident rows, what they served (``split``: the
    :class:`HotStats` of the run's :class:`HotSplit`) and the profile that chose them."""
    report = {k: v for k, v in hot.report.items() if k != "table_sizes"}
    return {"rows": len(hot), "mib": hot.mib(dim, state_dim), **split, "profile": report}
