"""Where a run's CPU goes, thread by thread: the CPU each thread used and the time it waited for a core.

The kernel keeps, for every thread of the process, its CPU time split into user and system
(``/proc/self/task/TID/stat``, in clock ticks) and, with ``schedstat``, its time on a CPU and
its time *runnable but waiting for a core* (nanoseconds). :class:`ThreadClock` reads both for
every thread at two moments (the end of the warm-up and the last step), names each thread
(the trainer's own, the Python threads by their names, a thread pool's workers as one
group, every other native thread -- torch's intra-op workers, mostly -- as ``native``)
and reports milliseconds per measured step.

How to read the figures of a pipeline thread (``bagpipe-fetch``, ``bagpipe-writeback``,
``bagpipe-planner``, ``bagpipe-plans``, ``diskstore-*``) beside its ``busy`` seconds (its own
wall clock around its work, :class:`bagpipe.cache.executor.PipelineTimes`):

* ``cpu`` close to ``busy``: the thread computes (NumPy, system calls: ``system``);
* ``busy`` well above ``cpu + runq``: it waited for I/O or for the interpreter lock;
* a large ``runq``: it was ready but both cores were taken (the trainer's and torch's
  threads): it competes with the step for the cores.

Where ``/proc`` is missing (not Linux) every figure is empty.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_POOL_SUFFIX = re.compile(r"_\d+$")  # ThreadPoolExecutor's workers: PREFIX_0, PREFIX_1...
#: Threads of the embedding pipeline (their CPU is the pipeline's cost), by name prefix;
#: ``bagpipe-plans`` is a distributed trainer's receiver of the oracle role's plans.
PIPELINE_THREADS = (
    "bagpipe-planner",
    "bagpipe-plans",
    "bagpipe-fetch",
    "bagpipe-writeback",
    "bagpipe-read",
    "diskstore-",
)
#: The step's compute: the trainer's thread and torch's intra-op workers.
COMPUTE_THREADS = ("trainer", "native")


@dataclass
class ThreadTime:
    """One thread (or group of threads) per measured step, in milliseconds."""

    cpu: float = 0.0
    """On a CPU (user + system)."""
    system: float = 0.0
    """Of ``cpu``, in the kernel (system calls, page faults); clock-tick resolution."""
    runq: float = 0.0
    """Runnable but waiting for a core (the machine's other threads held them)."""
    threads: int = 0
    """Threads in the group."""


@dataclass
class _Sample:
    cpu_ns: int
    runq_ns: int
    sys_ticks: int


def _read_task(tid: int) -> _Sample | None:
    base = f"/proc/self/task/{tid}"
    try:
        with open(f"{base}/schedstat") as f:
            on_cpu, runq, _ = f.read().split()
        with open(f"{base}/stat") as f:
            stat = f.read()
    except (OSError, ValueError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3
    return _Sample(int(on_cpu), int(runq), int(fields[12]))  # stime: field 15


def _tasks() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return []


class ThreadClock:
    """Per-thread CPU of this process between :meth:`start` and :meth:`stop`.

    Args:
        trainer: the native id of the thread that runs the steps (default: the caller's).
    """

    def __init__(self, trainer: int | None = None):
        self.trainer = threading.get_native_id() if trainer is None else trainer
        self._start: dict[int, _Sample] = {}
        self._end: dict[int, _Sample] = {}
        self._names: dict[int, str] = {}

    def _snapshot(self) -> dict[int, _Sample]:
        for t in threading.enumerate():  # names of the Python threads alive now
            if t.native_id is not None:
                self._names[t.native_id] = _POOL_SUFFIX.sub("", t.name)
        out = {}
        for tid in _tasks():
            s = _read_task(tid)
            if s is not None:
                out[tid] = s
        return out

    def start(self) -> None:
        """The measured steps begin (again)."""
        self._start = self._snapshot()
        self._end = {}

    def stop(self) -> None:
        """The measured steps ended."""
        self._end = self._snapshot()

    def _name(self, tid: int) -> str:
        if tid == self.trainer:
            return "trainer"
        return self._names.get(tid, "native")

    def per_step(self, steps: int) -> dict[str, ThreadTime]:
        """Milliseconds per step of each thread group over ``steps`` measured steps (a thread
        started after :meth:`start` counts from its start; one gone before :meth:`stop` is lost)."""
        end = self._end or self._snapshot()
        per = max(steps, 1)
        out: dict[str, ThreadTime] = {}
        for tid, e in end.items():
            s = self._start.get(tid, _Sample(0, 0, 0))
            t = out.setdefault(self._name(tid), ThreadTime())
            t.cpu += (e.cpu_ns - s.cpu_ns) / 1e6 / per
            t.runq += (e.runq_ns - s.runq_ns) / 1e6 / per
            t.system += (e.sys_ticks - s.sys_ticks) * 1000 / _TICK / per
            t.threads += 1
        return dict(sorted(out.items(), key=lambda kv: -kv[1].cpu))


def group_cpu(threads: dict, prefixes: tuple[str, ...]) -> float:
    """Summed ``cpu`` (ms per step) of the groups whose name starts with one of ``prefixes``
    (``threads``: a summary's ``threads_per_step_ms``, as dataclasses or as dicts)."""
    total = 0.0
    for name, t in threads.items():
        if name.startswith(prefixes):
            total += t["cpu"] if isinstance(t, dict) else t.cpu
    return total


def pipeline_share(threads: dict) -> float | None:
    """The embedding pipeline's CPU as a share of the step's compute CPU (trainer + intra-op),
    or None without figures."""
    compute = group_cpu(threads, COMPUTE_THREADS)
    return group_cpu(threads, PIPELINE_THREADS) / compute if compute > 0 else None
