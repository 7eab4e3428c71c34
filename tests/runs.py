"""Helpers of the tests that train: what a one-process run returns and leaves, typed as
the test knows it (``train`` returns None only on a data-parallel trainer that does not
report; ``latest`` None only where a run has no checkpoint yet); and the processes of a
job started by hand, stopped whatever the test's outcome; a command's one-line refusal."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bagpipe.checkpoint import Checkpoint
    from bagpipe.config.train import TrainConfig


def trained(cfg: TrainConfig) -> dict:
    """``train(cfg)`` in this process: the run's summary (one process always reports)."""
    from bagpipe.train.loop import train

    summary = train(cfg)
    assert summary is not None, "a one-process run returns its summary"
    return summary


def last_checkpoint(run_dir: str | os.PathLike) -> Checkpoint:
    """The newest complete checkpoint of the run in ``run_dir``, which the test knows it has."""
    from bagpipe.checkpoint import latest

    ck = latest(run_dir)
    assert ck is not None, f"{run_dir}: no complete checkpoint"
    return ck


@contextmanager
def stopped_at_end() -> Iterator[list[subprocess.Popen]]:
    """A list for the processes a block starts: whatever happens in the block, every one
    still running at its end is killed and reaped."""
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def outputs(procs: list[subprocess.Popen], within: float, since: float, floor: float = 1.0) -> list[tuple[str, str]]:
    """Every process's (stdout, stderr), all due ``within`` seconds after ``since``
    (``time.monotonic()``), each given at least ``floor`` seconds."""
    return [p.communicate(timeout=max(floor, within - (time.monotonic() - since))) for p in procs]


def one_line(rc: int, err: str, prog: str = "train") -> str:
    """The message of a refusal: exit 2, one line on stderr, no traceback; without the
    ``bagpipe PROG: error:`` prefix."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0].removeprefix(f"bagpipe {prog}: error: ")
