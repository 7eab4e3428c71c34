"""A fault-injection seam for the recovery tests: a pause at a named point.

``BAGPIPE_TEST_PAUSE=POINT:STEP:FLAGFILE`` makes the first process that reaches
``POINT`` at ``STEP`` create FLAGFILE (holding its pid) and wait, so that a test can
SIGKILL it at exactly that moment, or change the world (fill the disk) and let it go on
by creating ``FLAGFILE.go``; once FLAGFILE exists the pause is spent (a restarted job
passes). The points: ``cut`` (the training thread, before a checkpoint's cut),
``checkpoint`` (a checkpoint's rows are being written, in the background: training goes
on), ``commit`` (every part is written, nothing committed). Unset, as in every real
run, it costs one dictionary lookup.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

ENV = "BAGPIPE_TEST_PAUSE"


def pause_at(point: str, step: int) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    try:
        want, at_text, flag = spec.split(":", 2)
        at = int(at_text)
    except ValueError:
        from bagpipe.errors import ConfigError

        raise ConfigError(
            f"environment variable {ENV} must be POINT:STEP:FLAGFILE (a test's fault injection), got {spec!r}; unset it"
        ) from None
    if want == point and at == int(step) and not Path(flag).exists():
        Path(flag).write_text(str(os.getpid()))
        go = Path(flag + ".go")
        deadline = time.monotonic() + 600  # the test kills us, or lets us go on
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
