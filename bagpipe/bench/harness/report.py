"""Tables, JSON and plots for benchmark results.

Every scenario's results.json starts with :func:`header` (scenario, config, machine);
the medians and spreads of repeated runs, ratios to a reference configuration, the
Markdown table, results.json / results.md and the PNG boilerplate are here once.
"""

from __future__ import annotations

import platform
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bagpipe.jsonout import json_text
from bagpipe.train.plot import pyplot, save_png  # noqa: F401 - the scenarios import them from here

#: Phases of a training step, as ``time_per_step_ms`` in a run's summary names them.
STEP_PARTS = ("wait_embeddings", "forward", "backward", "optimizer", "writeback")


def machine() -> dict:
    import os

    import torch

    return {
        "cores": os.cpu_count(),
        "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def header(b) -> dict:
    """The first keys of every results.json: the scenario, its settings, the machine."""
    return {"scenario": b.name, "config": asdict(b), "machine": machine()}


def median_spread(values: Sequence[float | None]) -> tuple[float, float]:
    """Median and (max - min) / median of repetitions; a figure a run's summary holds as
    null (not measured, or non-finite: :mod:`bagpipe.jsonout`) counts as NaN. One
    repetition has no spread: NaN (null in results.json, n/a in a table: :func:`percent`)."""
    figures = [float("nan") if v is None else v for v in values]
    if not figures:
        return float("nan"), float("nan")
    med = statistics.median(figures)
    if len(figures) < 2:
        return med, float("nan")
    return med, (max(figures) - min(figures)) / med if med else float("nan")


def median(runs: list[dict], key: str) -> float:
    """Median of ``run[key]`` over repeated runs (nan without runs)."""
    return median_spread([r[key] for r in runs])[0]


def throughput(runs: list[dict]) -> tuple[float, float]:
    """Median samples/s of repeated runs and its spread."""
    return median_spread([r["samples_per_s"] for r in runs])


def pipeline_cpu(run: dict) -> float:
    """The embedding pipeline's threads' CPU, ms per step, of one run's summary
    (:mod:`bagpipe.train.threadcpu`; 0 for a run without the figures)."""
    from bagpipe.train.threadcpu import PIPELINE_THREADS, group_cpu

    return group_cpu(run.get("threads_per_step_ms") or {}, PIPELINE_THREADS)


def forward_backward(run: dict) -> float:
    """ms per step of one run's forward and backward passes (the trainer's thread)."""
    t = run["time_per_step_ms"]
    return t["forward"] + t["backward"]


def outside_compute(run: dict) -> float:
    """ms per step the trainer's thread spent on embeddings outside forward, backward and
    the optimizer (waiting for rows, installing them, handing rows over for write-back)."""
    t = run["time_per_step_ms"]
    return t["wait_embeddings"] + t["writeback"] + t.get("sync_wait", 0.0)


def step_times(runs: list[dict]) -> dict[str, float]:
    """Median milliseconds per step of each phase (``time_per_step_ms``) over repeated runs."""
    return {k: median_spread([r["time_per_step_ms"][k] for r in runs])[0] for k in runs[0]["time_per_step_ms"]}


def fixed(v, digits: int = 4) -> str:
    """``v`` with ``digits`` decimals, or "n/a" for a figure a summary holds as null (an
    eval split of one class has no AUC) or NaN."""
    if v is None or v != v:
        return "n/a"
    return f"{v:.{digits}f}"


def times(v) -> str:
    """``v`` (a ratio) as ``1.23x``, or "n/a" where there is none (NaN, None, infinite: a
    ratio to a configuration that did not run)."""
    if v is None or v != v or v in (float("inf"), float("-inf")):
        return "n/a"
    return f"{v:.2f}x"


def percent(v) -> str:
    """``v`` (a spread, a share) as a whole percentage, or "n/a" where there is none: one
    repetition's spread, a figure results.json holds as null, NaN."""
    if v is None or v != v:
        return "n/a"
    return f"{v:.0%}"


def markdown_table(headers: list[str], rows: list[list]) -> str:
    def fmt(v):
        if v is None:  # a figure a run's summary holds as null
            return "n/a"
        if isinstance(v, float):
            if v != v:
                return "n/a"
            return f"{v:,.3g}" if abs(v) < 10 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def write_results(out: Path, name: str, payload: dict, table: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json_text(payload, indent=2))
    (out / "results.md").write_text(f"# bagpipe bench {name}\n\n{table}\n")


def stacked_step_times(ax, labels: list[str], breakdowns: list[dict], skip_empty: bool = False) -> np.ndarray:
    """Bars of the milliseconds per step, one segment per phase; returns the bar tops.
    ``skip_empty`` leaves out phases no configuration spends time in."""
    bottom = np.zeros(len(labels))
    for part in STEP_PARTS:
        vals = np.array([b.get(part, 0.0) for b in breakdowns])
        if skip_empty and not vals.any():
            continue
        ax.bar(labels, vals, bottom=bottom, label=part)
        bottom += vals
    ax.set_ylabel("ms per step (trainer thread)")
    return bottom
