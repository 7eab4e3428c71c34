"""The steps of a gpu-check: each one child process, started by the runner and stopped at
its limit (:data:`bagpipe.gpucheck.sizes.Size.limits_s`).

* ``tests``: ``pytest -v -m gpu`` (the ``gpu``-marked tests), twice: every test but the
  long matrix (:attr:`~bagpipe.gpucheck.sizes.Size.tests_last`), then the matrix; the
  runner reads each test's outcome from the output, so a step stopped at its limit still
  reports those it reached -- every test but some of the matrix's;
* ``exactness``, ``bench``, ``beyond``, ``data-parallel``: ``python -m
  bagpipe.gpucheck.work STEP``, which writes its ``result.json`` (:mod:`bagpipe.gpucheck.work`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from bagpipe.gpucheck.sizes import Size


@dataclass(frozen=True)
class Step:
    """One step: its name, a title for the report, and the argv of its child process."""

    name: str
    title: str
    argv: tuple[str, ...]
    result_file: Path | None = None
    """Where the child writes its result (None: the runner reads the step's output)."""


#: name -> the title of its section in results.md and docs/gpu.md, in the order they run.
TITLES = {
    "tests": "The gpu-marked tests",
    "exactness": "Exactness on the device",
    "bench": "bench modes on the device",
    "beyond": "Tables larger than the device budget",
    "data-parallel": "Two data-parallel trainers on one device",
}


def plan_steps(size: Size, device: str, out: Path, only: tuple[str, ...] = ()) -> list[Step]:
    """The steps of a check of ``device`` at ``size`` writing under ``out`` (``only``: these names)."""
    py = sys.executable
    steps = []
    for name, title in TITLES.items():
        if only and name not in only:
            continue
        where = out / "steps" / name
        argv = (py, "-m", "bagpipe.gpucheck.work", name, "--device", device, "--size", size.name, "--dir", str(where))
        steps.append(Step(name, title, argv, None if name == "tests" else where / "result.json"))
    return steps
