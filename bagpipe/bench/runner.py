"""Shared plumbing of the benchmark scenarios: training runs as separate processes.

Every measured configuration is one ``python -m bagpipe train ...`` process (so peak
memory, thread pools and page cache state are per run) whose ``--summary-json`` is read
back. :func:`ensure_synth` makes (or reuses) the generated dataset a scenario runs on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


class TrainFailed(RuntimeError):
    """A ``bagpipe train`` process exited non-zero; ``stderr`` holds its error output."""

    def __init__(self, label: str, returncode: int, stderr: str):
        self.label = label
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"{label} failed:\n{stderr[-3000:]}")

    @property
    def capacity_error(self) -> bool:
        """The cache could not hold one batch's unique rows (bagpipe.errors.CapacityError)."""
        return "cannot hold" in self.stderr


def train_command(args: list[str]) -> list[str]:
    """The argv of ``bagpipe train ARGS`` run with this interpreter."""
    return [sys.executable, "-m", "bagpipe", "train", *[str(a) for a in args]]


def run_train(args: list[str], summary: Path, label: str, timeout: float | None = None) -> dict:
    """Run ``bagpipe train ARGS --summary-json SUMMARY`` in its own process.

    Returns the summary with ``wall_s`` (the process's wall time, start-up included)
    added; raises :class:`TrainFailed` if the process fails.
    """
    cmd = train_command(args) + ["--summary-json", str(summary)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise TrainFailed(label, -1, f"timed out after {timeout:.0f} s\n{err}") from None
    if proc.returncode != 0:
        raise TrainFailed(label, proc.returncode, proc.stderr)
    s = json.loads(Path(summary).read_text())
    s["wall_s"] = time.perf_counter() - t0
    return s


def ensure_synth(data: Path, profile: str, samples: int, scale: float, seed: int, progress: bool = True) -> None:
    """Generate ``profile`` data into ``data`` unless a dataset of that size and scale is there."""
    from bagpipe.data.synthetic import SynthConfig, generate

    meta_file = Path(data) / "meta.json"
    if meta_file.exists():
        src = json.loads(meta_file.read_text()).get("source", {})
        same = (src.get("samples"), src.get("scale"), src.get("profile", profile), src.get("seed", seed)) == (samples, scale, profile, seed)
        if same:
            return
    generate(SynthConfig(profile=profile, samples=samples, scale=scale, seed=seed), str(data), overwrite=True, progress=progress)
