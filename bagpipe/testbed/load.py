"""A busy machine on demand: CPU-bound processes that compete with the measured runs.

``bagpipe bench modes --background-load N`` (and ``bench scale``) start N processes that
spin on the CPU (a Python loop, no memory, no I/O) before the first measured run and stop
them after the last, so "robust to a busy machine" is measured instead of assumed. Each
process is its own session and asks the kernel to be killed when the benchmark process
dies (``PR_SET_PDEATHSIG``), so even a ``kill -9`` of the benchmark leaves none behind.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import subprocess
import sys
import time

_PR_SET_PDEATHSIG = 1
#: The competing process: spin until killed (or until its parent is gone, as a last resort).
_SPIN = "import os\nppid = os.getppid()\nwhile os.getppid() == ppid:\n    for _ in range(100000): pass\n"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    try:
        ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class BackgroundLoad:
    """``processes`` CPU-bound processes while the ``with`` block runs (0: none).

    ``pids`` lists them while they run; :meth:`stop` (the block's end) kills and reaps them.
    """

    def __init__(self, processes: int):
        if processes < 0:
            raise ValueError(f"background load must be >= 0 processes, got {processes}")
        self.processes = processes
        self._procs: list[subprocess.Popen] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.poll() is None]

    def start(self) -> BackgroundLoad:
        for _ in range(self.processes):
            self._procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _SPIN],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            )
        if self._procs:
            time.sleep(0.2)  # running before the first measured run starts
        return self

    def stop(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        for p in self._procs:
            p.wait(timeout=10)
        self._procs.clear()

    def __enter__(self) -> BackgroundLoad:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
