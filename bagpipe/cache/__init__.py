"""The trainer's slot cache, the executors that fill and drain it, and its set-up.

* :mod:`bagpipe.cache.slots` -- :class:`SlotCache`, C slots of D weights + S state values.
* :mod:`bagpipe.cache.executor` -- :class:`PlanExecutor`, the synchronous executor (the
  reference), and :class:`DeferredReadExecutor` (Hotline's).
* :mod:`bagpipe.cache.pipelined` -- :class:`PipelinedExecutor`, which extends it with
  planner, fetch and write-back threads (the lookahead mode).
* :mod:`bagpipe.cache.setup` -- :func:`set_up_cache`: a run's cache size, hot tier and plans,
  for one process and for the oracle role alike.
* :mod:`bagpipe.cache.allreduce`, :mod:`bagpipe.cache.periodic` -- the data-parallel row strategies.
"""

from __future__ import annotations

from bagpipe.cache.executor import DeferredReadExecutor, PlanExecutor
from bagpipe.cache.pipelined import PipelinedExecutor
from bagpipe.cache.slots import SlotCache
from bagpipe.config.modes import ExecutorName

#: executor name (a mode's ``ModeSpec.executor``) -> its class.
EXECUTORS: dict[ExecutorName, type[PlanExecutor]] = {
    "sync": PlanExecutor,
    "deferred": DeferredReadExecutor,
    "pipelined": PipelinedExecutor,
}

__all__ = ["EXECUTORS", "DeferredReadExecutor", "PipelinedExecutor", "PlanExecutor", "SlotCache"]
