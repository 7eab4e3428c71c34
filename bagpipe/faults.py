"""A fault-injection seam for the recovery tests: a pause at a named point.

``BAGPIPE_TEST_PAUSE=POINT:STEP:FLAGFILE`` makes the first process that reaches
``POINT`` (``checkpoint``: a checkpoint's rows are being written; ``commit``: every
part is written, nothing committed) at ``STEP`` create FLAGFILE (holding its pid) and
sleep, so that a test can SIGKILL it at exactly that moment; once FLAGFILE exists the
pause is spent (a restarted job passes). Unset, as in every real run, it costs one
dictionary lookup.
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
        time.sleep(600)  # the test kills us here
