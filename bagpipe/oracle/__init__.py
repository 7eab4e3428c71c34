"""Planners: turn the batch stream into Plans (slot ids, fetches, write-backs).

``lookahead`` is the product (BagPipe's oracle cacher); ``lru`` and ``nocache`` are
the backward-looking baselines expressed as plans, so one executor runs them all.
"""

from bagpipe.oracle.lookahead import LookaheadOracle
from bagpipe.oracle.plan import Plan, PlanStats
from bagpipe.oracle.policies import LRUPlanner, NoCachePlanner

__all__ = ["LRUPlanner", "LookaheadOracle", "NoCachePlanner", "Plan", "PlanStats"]
