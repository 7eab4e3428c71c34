"""What the oracle role reports at the end of a run (sent to every trainer with its last message).

A module of its own so that the wire format (:mod:`bagpipe.distributed.wire`) can
declare it as one of the records a message may carry without importing the oracle role.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OracleReport:
    """Counters of the whole run, sent to every trainer with the last message."""

    plan: dict = field(default_factory=dict)
    cache_rows: int = 0
    lookahead: int = 0
    cache_sync: str = "partitioned"
    plans_in_flight: int = 0
    sync_rows: int = 0  # synchronised rows (owner: row transfers between trainers), summed over steps
    sync_urgent_rows: int = 0  # of which the next step needed (the rest overlapped its compute)
    replicated_sync_rows: int = 0  # the same had every planned row been synchronised
    partitioned_sync_rows: int = 0  # what the partitioned cache would all-reduce (--cache-sync owner's plans)
    fetched_rows: list = field(default_factory=list)  # per trainer
    seconds_planning: float = 0.0
    seconds_waiting_for_credit: float = 0.0
    max_in_flight: int = 0
