"""The trainer's slot cache and the pipeline that fills and drains it."""

from bagpipe.cache.pipeline import PlanExecutor
from bagpipe.cache.slots import SlotCache

__all__ = ["PlanExecutor", "SlotCache"]
