"""The planner seam: what every planner provides, and the registry that builds one by name.

A *planner* turns the batch stream into :class:`~bagpipe.oracle.plan.Plan` objects --
which slot each of a batch's unique rows occupies, which rows to fetch before the step
and which to write back before or after it, and ``fetch_after``, the label of the last
write-back a plan's fetch must wait for. Three exist: the lookahead oracle (the product)
and the backward-looking ``lru`` / ``nocache`` baselines; a hot tier
(:class:`bagpipe.accel.hot.HotSplit`) sits in front of any of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from bagpipe.config.modes import PlannerName
from bagpipe.data.batch import Batch
from bagpipe.oracle.lookahead import LookaheadOracle
from bagpipe.oracle.plan import Plan, PlanStats
from bagpipe.oracle.policies import LRUPlanner, NoCachePlanner


class Planner(Protocol):
    """Plans the batches it is given, in step order, for a cache of C slots.

    Invariants every planner keeps (``tests/unit/oracle/test_planners.py`` checks them):
      * the plan of step x lists the batch's unique rows ascending, with their slots and
        the inverse map of every lookup;
      * a slot is refilled only after the row in it was written back or dropped;
      * ``fetch_after``: a plan's fetch issued once every write-back labelled
        ``<= fetch_after`` is in the store never reads a stale row.
    """

    stats: PlanStats
    """Counters over every plan made so far (hits, misses, rows fetched and written back...)."""

    def plans(self, batches: Iterable[tuple[int, Batch]]) -> Iterator[Plan]:
        """The plans of ``(step, batch)`` pairs given in step order (lazily: a planner that
        looks L batches ahead consumes L batches before it yields the first plan)."""
        ...


PlannerFactory = Callable[[int, int, int, "int | None", bool], Planner]
"""(num_rows R, cache_rows C, lookahead L, enough, retain) -> a new planner. ``enough``: a
cache size that holds every batch of the run, the hint of a too-small cache's error;
``retain``: the lookahead oracle keeps rows past their window until their slots are needed
(:class:`~bagpipe.oracle.lookahead.LookaheadOracle`; the other planners keep every row until
then anyway)."""

PLANNERS: dict[PlannerName, PlannerFactory] = {
    "nocache": lambda R, C, L, enough, retain: NoCachePlanner(C),
    "lru": lambda R, C, L, enough, retain: LRUPlanner(R, C, enough),
    "lookahead": lambda R, C, L, enough, retain: LookaheadOracle(R, C, L, enough, retain=retain),
}


def build_planner(
    name: PlannerName, num_rows: int, cache_rows: int, lookahead: int, enough: int | None, *, retain: bool = False
) -> Planner:
    """A new planner ``name`` (a row of :data:`PLANNERS`) for a cache of ``cache_rows`` slots."""
    return PLANNERS[name](num_rows, cache_rows, lookahead, enough, retain)
