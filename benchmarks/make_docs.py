"""Write docs/benchmarks.md from the benchmark scenarios.

Runs ``bagpipe bench SCENARIO --out OUT/SCENARIO`` for each scenario (or, with
``--from DIR``, reads the results an earlier run left in DIR/SCENARIO/results.json),
then writes docs/benchmarks.md: the machine (cores, RAM, CPU, torch), the date, the
exact commands, each scenario's Markdown table and its PNG (copied into docs/img/).

    python benchmarks/make_docs.py                       # full size (tens of minutes)
    python benchmarks/make_docs.py --from bench-out      # only rewrite the page
    python benchmarks/make_docs.py --quick --out /tmp/bq --docs /tmp/bq/benchmarks.md --img /tmp/bq/img

Quick-size numbers are not representative; the page says so in bold when they are used.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SCENARIOS = ("modes", "oracle", "sweep", "convergence", "distributed", "accel")

ABOUT = {
    "modes": "Every mode (full, nocache, lru, lookahead) trained side by side on generated Criteo-Kaggle-shaped "
    "data, memory and disk stores; throughput, time per step by phase, peak memory, cache hit rate. "
    "On one H200 (`--device cuda`, one repetition): lookahead 1.22-1.23x full, see [gpu.md](gpu.md#measured).",
    "oracle": "The lookahead oracle's planning throughput alone (one thread), by batch size and lookahead L: the "
    "map-based read beside the reference read (one sort of every lookup), interleaved, with a check that "
    "both give the same plans; the load average before and after.",
    "sweep": "The lookahead mode (memory store) over cache size x lookahead L: throughput, hit rate, forced "
    "evictions; and the `--cache-budget-mb` auto-tuner compared with the best measured point.",
    "convergence": "Eval AUC and log loss per step of `full` and `lookahead` on generated data and on the real "
    "Criteo Kaggle sample: the curves and the final params_sha256 must be identical.",
    "distributed": "One trainer with its rows on two embedding-server processes (and the oracle in its own) against "
    "the in-process store: the cost of disaggregation on one machine; and two data-parallel trainers "
    "with the partitioned cache against a fully replicated one: bytes all-reduced per iteration. "
    "Every role shares the same 2 cores, so these are overheads, not scaling (docs/distributed.md).",
    "peers": "bagpipe beside TorchRec's DLRM on the same data, model, batch and optimizer.",
    "accel": "BagPipe (lookahead, with and without a hot tier), FAE and Hotline against nocache and lru under one "
    "trainer memory budget (hot tier + cache), disk store: throughput, peak memory, hit rates, the share "
    "of lookups served hot, planner time per step, AUC and log loss (docs/accel.md).",
}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def options_for(scen: str, extra: list[str]) -> list[str]:
    """The options of ``extra`` (each with the values that follow it) that scenario ``scen``
    has: ``bagpipe bench`` refuses an option of other scenarios."""
    sys.path.insert(0, str(ROOT))
    from bagpipe.bench.registry import SCENARIOS

    mine = SCENARIOS[scen].config.option_strings() if scen in SCENARIOS else {}
    out, keep = [], True
    for arg in extra:
        if arg.startswith("--"):
            keep = arg.split("=", 1)[0] in mine
        if keep:
            out.append(arg)
    return out


def run_scenarios(scenarios: list[str], out: Path, quick: bool, extra: list[str]) -> dict:
    """Run each scenario in its own process; returns {scenario: {command, seconds, returncode}}."""
    out.mkdir(parents=True, exist_ok=True)
    log = {}
    for scen in scenarios:
        opts = (["--quick"] if quick else []) + options_for(scen, extra)
        args = ["bench", scen, "--out", str(out / scen)] + opts
        shown = " ".join(["bagpipe", "bench", scen, "--out", _show(out / scen)] + opts)
        print(f"$ {shown}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "bagpipe", *args], cwd=ROOT)
        log[scen] = {"command": shown, "seconds": round(time.perf_counter() - t0, 1), "returncode": proc.returncode}
        if proc.returncode not in (0, 1):  # 1: convergence found a difference; still documented
            raise SystemExit(f"bagpipe bench {scen} failed with exit code {proc.returncode}")
    (out / "commands.json").write_text(json.dumps(log, indent=2))
    return log


def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(path, start).replace(os.sep, "/")


def _show(path: Path) -> str:
    """A path as the page shows it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return _rel(path, ROOT) if path.is_relative_to(ROOT) else str(path)


def write_page(src: Path, scenarios: list[str], docs: Path, img: Path, commands: dict) -> list[str]:
    """Write the page from src/SCENARIO/results.json; returns the scenarios found."""
    found = {}
    for scen in scenarios:
        f = src / scen / "results.json"
        if f.exists():
            found[scen] = json.loads(f.read_text())
        else:
            print(f"no results for {scen} in {src / scen}; left out", file=sys.stderr)
    if not found:
        raise SystemExit(f"no results.json under {src} for {', '.join(scenarios)}")
    img.mkdir(parents=True, exist_ok=True)
    docs.parent.mkdir(parents=True, exist_ok=True)
    first = next(iter(found.values()))["machine"]
    quick = any("--quick" in c.get("command", "") for c in commands.values())
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `benchmarks/make_docs.py` on {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} "
        f"from the results in `{_show(src)}`. Every scenario runs its "
        "compared configurations in one invocation, each training run in its own process, interleaved over "
        "repetitions, with warm-up steps left out of the throughput; medians of the repetitions are shown with "
        "their spread ((max - min) / median).",
        "",
    ]
    if quick:
        lines += ["**These are quick-size (`--quick`) results: smoke-test numbers, not representative.**", ""]
    lines += [
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        f"| CPU | {cpu_model()} |",
        f"| cores | {first.get('cores')} |",
        f"| RAM | {first.get('ram_gib')} GiB |",
        f"| torch | {first.get('torch')} |",
        f"| Python | {first.get('python')} |",
        f"| date of the runs | {', '.join(sorted({p['machine'].get('date', '?') for p in found.values()}))} |",
        "",
        "## Commands",
        "",
        "```bash",
    ]
    for scen in found:
        c = commands.get(scen)
        cmd = c["command"] if c else f"bagpipe bench {scen} --out {_show(src / scen)}   # options not recorded"
        took = f"   # took {c['seconds'] / 60:.1f} min" if c and "seconds" in c else ""
        lines.append(cmd + took)
    lines += [
        f"python benchmarks/make_docs.py --from {_show(src)}   # writes this page",
        "```",
        "",
        f"(`python benchmarks/make_docs.py --out {_show(src)}` runs all of the above and writes the page.)",
        "",
    ]
    for scen, payload in found.items():
        lines += [f"## {scen}", "", ABOUT.get(scen, ""), ""]
        cfg = payload.get("config", {})
        if cfg:
            shown = ", ".join(
                f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
                for k, v in cfg.items()
                if k != "out" and not isinstance(v, dict)
            )
            lines += [f"<details><summary>settings</summary>\n\n{shown}\n\n</details>", ""]
        lines += [payload["table"], ""]
        for png in sorted((src / scen).glob("*.png")):
            name = png.name if png.stem.startswith(scen) else f"{scen}-{png.name}"
            shutil.copyfile(png, img / name)
            lines += [f"![{scen}]({_rel(img / name, docs.parent)})", ""]
    docs.write_text("\n".join(lines))
    print(f"wrote {docs} and {len(list(img.glob('*.png')))} PNG(s) in {img}")
    return list(found)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="src", help="read existing results from DIR/SCENARIO/ instead of running")
    ap.add_argument("--out", default="bench-out", help="where the scenarios write their results (default bench-out)")
    ap.add_argument("--quick", action="store_true", help="run the scenarios at --quick size (to check this script)")
    ap.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS), help="comma-separated scenarios")
    ap.add_argument("--docs", default=str(ROOT / "docs" / "benchmarks.md"), help="the page to write")
    ap.add_argument("--img", default=str(ROOT / "docs" / "img"), help="folder the PNGs are copied into")
    ap.add_argument("extra", nargs="*", help="options passed on to every bagpipe bench run that has them (after --)")
    a = ap.parse_args(argv)
    scenarios = [s for s in a.scenarios.split(",") if s]
    if a.src:
        src = Path(a.src).resolve()
        cf = src / "commands.json"
        commands = json.loads(cf.read_text()) if cf.exists() else {}
    else:
        src = Path(a.out).resolve()
        commands = run_scenarios(scenarios, src, a.quick, a.extra)
    write_page(src, scenarios, Path(a.docs).resolve(), Path(a.img).resolve(), commands)
    return 0


if __name__ == "__main__":
    sys.exit(main())
