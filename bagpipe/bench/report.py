"""Tables, JSON and plots for benchmark results."""

from __future__ import annotations

import json
import platform
import statistics
from datetime import datetime, timezone
from pathlib import Path

import torch


def machine() -> dict:
    import os

    import psutil

    return {
        "cores": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def median_spread(values: list[float]) -> tuple[float, float]:
    """Median and (max - min) / median of repetitions."""
    if not values:
        return float("nan"), float("nan")
    med = statistics.median(values)
    return med, (max(values) - min(values)) / med if med else float("nan")


def markdown_table(headers: list[str], rows: list[list]) -> str:
    def fmt(v):
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
    (out / "results.json").write_text(json.dumps(payload, indent=2))
    (out / "results.md").write_text(f"# bagpipe bench {name}\n\n{table}\n")
