"""Where the seconds of a recovery go, between a role's death and the next trained step.

Every role of a job the local launcher started marks the end of its start-up phases
(wall-clock ``time.time()``) in ``RUN/.phases/phases-RANK.json`` (the launcher names the
folder in ``BAGPIPE_PHASES``; elsewhere :func:`mark` does nothing):

==============  ================================================================
``started``     the interpreter runs bagpipe's ``worker`` command (a pre-started
                spare: when it is handed its rank)
``imported``    the role's modules (torch, the training loop) are imported
``joined``      the rendezvous and the process group are done
``ready``       its data and state are set up (the oracle's cache set-up and first
                message, a trainer's model and backend, a server's store)
``restored``    a server's rows, trainer 0's dense state, from the checkpoint
``first_step``  trainer 0: the first step after the restart is trained
==============  ================================================================

After that first step trainer 0 of a restarted job (:func:`report`) turns the marks of
every role, and the launcher's times (``died``: the failed role was reaped; ``noticed``:
the launcher acts on it; ``stopped``: the other roles are gone), into the
consecutive phases of the restart's event in ``RUN/recovery.json``: each phase ends when
the last role ends it, and they add up to the time from the death to training again.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bagpipe.files import atomic_write_text
from bagpipe.jsonout import json_text

ENV = "BAGPIPE_PHASES"
#: Set by the local launcher in the roles it restarts after a failure: the restart's number.
RESTART_ENV = "BAGPIPE_RESTART"
MARKS = ("started", "imported", "joined", "ready", "restored", "first_step")
#: The phases of a recovery, in order: (name, the mark or launcher time that ends it).
PHASES = (
    ("detection", "noticed"),
    ("stop", "stopped"),
    ("process_start", "started"),
    ("imports", "imported"),
    ("rendezvous", "joined"),
    ("data", "ready"),
    ("restore", "restored"),
    ("pipeline_refill", "first_step"),
)


def mark(name: str, rank: int | None = None, fresh: bool = False) -> None:
    """Record that this role ended phase ``name`` now (``fresh``: forget earlier marks)."""
    folder = os.environ.get(ENV)
    if not folder:
        return
    if rank is None:
        text = os.environ.get("RANK", "-1")
        rank = int(text) if text.strip().lstrip("-").isdigit() else -1  # a bad RANK is the role's to refuse
    path = Path(folder) / f"phases-{rank}.json"
    try:
        marks = {} if fresh or not path.exists() else json.loads(path.read_text())
        marks[name] = time.time()
        atomic_write_text(path, json_text(marks))
    except (OSError, ValueError):
        pass  # a measurement; never a reason to fail a role


def phases(event: dict, marks: list[dict]) -> dict[str, float]:
    """Seconds per phase of one restart: ``event`` the launcher's record, ``marks`` every role's."""
    ends = {"noticed": event.get("noticed"), "stopped": event.get("stopped")}
    for name in MARKS:
        have = [m[name] for m in marks if name in m]
        ends[name] = max(have) if have else None
    out: dict[str, float] = {}
    t = event.get("died")
    if t is None:
        return out
    start = t
    for phase, end in PHASES:
        e = ends.get(end)
        if e is None:
            continue
        out[phase] = max(0.0, e - t)
        t = max(t, e)
    out["total"] = t - start
    return out


def report(run_dir: Path) -> dict | None:
    """Trainer 0, after the first step of a restarted job: write its phases into the last
    event of RUN/recovery.json (returns them; None when there is nothing to report)."""
    folder = os.environ.get(ENV)
    record = Path(run_dir) / "recovery.json"
    if not folder or not os.environ.get(RESTART_ENV) or not record.exists():
        return None
    mark("first_step")
    try:
        events = json.loads(record.read_text())
        marks = [json.loads(p.read_text()) for p in Path(folder).glob("phases-*.json")]
    except (OSError, ValueError):
        return None
    if not events or "phases" in events[-1]:
        return None
    events[-1]["phases"] = phases(events[-1], marks)
    atomic_write_text(record, json_text(events, indent=2))
    return events[-1]["phases"]
