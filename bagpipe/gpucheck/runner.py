"""``python -m bagpipe.gpucheck`` (``make gpu-check``): run the steps, each stopped at its
limit, and write the results folder.

The folder (``--out``): ``results.json`` (everything), ``results.md`` (the tables,
:mod:`bagpipe.gpucheck.report`), ``gpu-check.log`` (every step's output, in order),
``steps/`` (each step's own files). A step past its limit is stopped -- its process
group gets SIGTERM, then SIGKILL -- and the next one starts, so one slow step never costs
the rest; the ``tests`` step still reports every test it reached.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bagpipe.gpucheck.sizes import SIZES, Size
from bagpipe.gpucheck.steps import TITLES, Step, plan_steps
from bagpipe.jsonout import json_text

ROOT = Path(__file__).resolve().parents[2]  # the working tree the package runs from
TERM_GRACE_S = 5.0  # the gpu size's limits (435 s) plus five graces stay under 8 minutes
OUTCOME = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b(.*)$")
SELECTED = re.compile(r"collected (\d+) items?(?: / (\d+) deselected)?(?: / (\d+) selected)?")


def no_gpu_reason() -> str | None:
    """Why this Python cannot run ``--device cuda`` (None: it can)."""
    if importlib.util.find_spec("torch") is None:
        return f"torch is not installed in {sys.executable}"
    from bagpipe.device.cuda import cuda_unavailable_reason

    return cuda_unavailable_reason()


def environment(device: str) -> dict:
    """What the results were measured on."""
    import torch

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "device": device,
        "gpu": None,
        "gpu_memory_mb": None,
    }
    if device == "cuda":  # asked of a child: this process keeps no CUDA context through the steps
        code = (
            "import json, torch; p = torch.cuda.get_device_properties(0); print(json.dumps([p.name, p.total_memory]))"
        )
        probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        if probe.returncode == 0:
            name, total = json.loads(probe.stdout.strip().splitlines()[-1])
            env |= {"gpu": name, "gpu_memory_mb": total / (1 << 20)}
    env["commit"] = describe_tree(ROOT)
    return env


def describe_tree(root: Path) -> str | None:
    """The commit of the working tree at ``root``, with the count of tracked files that
    differ from it (``4635644 + 3 changed files``): a GPU machine may receive a working
    tree newer than its copy of the repository's history. None: no git or no repository."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        changed = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except OSError:  # no git on the machine
        return None
    commit = head.stdout.strip()
    if head.returncode != 0 or not commit:
        return None
    n = len(changed.stdout.splitlines()) if changed.returncode == 0 else 0
    return commit if n == 0 else f"{commit} + {n} changed file{'s' if n > 1 else ''}"


@dataclass
class StepRun:
    """How one step ran."""

    name: str
    title: str
    status: str  # passed | failed | stopped at its limit
    seconds: float
    limit_s: float
    returncode: int | None
    result: dict | None


def stop(proc: subprocess.Popen) -> None:
    """End the step's process group: SIGTERM, then SIGKILL after the grace period."""
    for sig, wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def pytest_outcomes(output: str) -> dict:
    """Every test's outcome from the output of one or more ``pytest -v`` runs, and how
    many they selected in all."""
    tests: list[dict] = []
    selected = None
    for line in output.splitlines():
        m = OUTCOME.match(line.strip())
        if m:
            reason = m.group(3).strip()
            reason = re.sub(r"\s*\[\s*\d+%\]$", "", reason).strip(" ()")
            tests.append({"test": m.group(1), "outcome": str(m.group(2)).lower(), "reason": reason or None})
        s = SELECTED.search(line)
        if s:
            total, deselected, chosen = (int(g) if g else None for g in s.groups())
            run = chosen if chosen is not None else (total or 0) - (deselected or 0)
            selected = run + (selected or 0)
    counts: dict[str, int] = {}
    for t in tests:
        outcome: str = t["outcome"]
        counts[outcome] = counts.get(outcome, 0) + 1
    reached = len(tests)
    return {
        "selected": selected,
        "counts": counts,
        "not_reached": max(0, (selected or reached) - reached),
        "tests": tests,
    }


def run_step(step: Step, limit_s: float, log: Path, env: dict) -> StepRun:
    """Run ``step`` with its output in ``log``; stop it at ``limit_s``."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        f.write("$ " + " ".join(step.argv) + "\n")
        f.flush()
        proc = subprocess.Popen(
            step.argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc: int | None = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            stop(proc)
            rc = None
    seconds = time.perf_counter() - t0
    result: dict | None = None
    if step.result_file is None:
        result = pytest_outcomes(log.read_text(errors="replace"))
        result["passed"] = rc == 0 and "failed" not in result["counts"] and "error" not in result["counts"]
    elif step.result_file.exists():
        result = json.loads(step.result_file.read_text())
    if rc is None:
        status = "stopped at its limit"
    elif rc == 0 and result is not None and result.get("passed"):
        status = "passed"
    else:
        status = "failed"
    return StepRun(step.name, step.title, status, seconds, limit_s, rc, result)


def parse_limits(values: list[str], size: Size) -> dict[str, float]:
    limits = dict(size.limits_s)
    for v in values:
        name, _, secs = v.partition("=")
        if name not in TITLES or not re.fullmatch(r"\d+(\.\d+)?", secs) or float(secs) <= 0:
            raise ValueError(f"--limit {v!r}: give STEP=SECONDS with STEP one of {', '.join(TITLES)} and SECONDS > 0")
        limits[name] = float(secs)
    return limits


DESCRIPTION = """\
Prove the GPU path in one command (docs/gpu.md, "The gpu-check"): the gpu-marked tests,
exactness on the device against full and against the CPU, bench modes on the device,
a run whose tables are larger than its device memory budget, and 2 data-parallel
trainers against one process, each step stopped at its time limit. Installs nothing:
run it from the working tree with the Python that has a CUDA build of torch.

Without a GPU it prints one line and exits 0. --device cpu-async --size tiny is the dry
run on a CPU that the test suite runs (no figure of it is a GPU figure).

Writes OUT/results.json, OUT/results.md, OUT/gpu-check.log and OUT/steps/ (exit code 0
when every step passed, else 1); `python -m bagpipe.gpucheck.docs OUT` then fills the
GPU section of docs/gpu.md. The gpu size's limits add up to under 8 minutes on one
H100; a --limit raised past them may not.

Examples:
  make gpu-check OUT=gpu-results
  PYTHONPATH=. python -m bagpipe.gpucheck --out gpu-results --limit tests=200
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bagpipe.gpucheck", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", choices=("cuda", "cpu-async"), default="cuda", help="where to check (default: cuda)")
    p.add_argument("--size", choices=sorted(SIZES), help="gpu (default on cuda) or tiny (default on cpu-async)")
    p.add_argument(
        "--out", type=Path, default=Path("gpu-check-out"), help="the results folder (default: gpu-check-out)"
    )
    p.add_argument("--limit", action="append", default=[], metavar="STEP=SECONDS", help="another limit for a step")
    p.add_argument("--only", default="", metavar="A,B", help=f"run only these steps of {','.join(TITLES)}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.device == "cuda":
        reason = no_gpu_reason()
        if reason is not None:
            print(f"gpu-check: no CUDA GPU here ({reason}); nothing run")
            return 0
    size = SIZES[args.size or ("gpu" if args.device == "cuda" else "tiny")]
    only = tuple(s for s in args.only.split(",") if s)
    try:
        limits = parse_limits(args.limit, size)
        bad = [s for s in only if s not in TITLES]
        if bad:
            raise ValueError(f"--only {args.only}: unknown step {bad[0]!r}; the steps are {', '.join(TITLES)}")
    except ValueError as e:
        print(f"gpu-check: {e}", file=sys.stderr)
        return 2
    from bagpipe.gpucheck.report import markdown

    out: Path = args.out.resolve()
    shutil.rmtree(out / "steps", ignore_errors=True)  # a previous check's runs: train refuses a used run folder
    (out / "steps").mkdir(parents=True, exist_ok=True)
    # a stopped step's log holds everything it printed; pytest -v shows whole skip reasons
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="1000")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results: dict = {"tool": "bagpipe gpu-check", "started": started, "size": size.name,
                     "environment": environment(args.device), "steps": []}  # fmt: skip
    t0 = time.perf_counter()
    with open(out / "gpu-check.log", "w") as log:
        for step in plan_steps(size, args.device, out, only):
            limit = limits[step.name]
            print(f"gpu-check: {step.name} (limit {limit:.0f} s) ...", flush=True)
            r = run_step(step, limit, out / "steps" / f"{step.name}.log", env)
            log.write((out / "steps" / f"{step.name}.log").read_text(errors="replace"))
            log.write(f"--- {step.name}: {r.status} in {r.seconds:.1f} s (limit {limit:.0f} s)\n")
            log.flush()
            print(f"gpu-check: {step.name}: {r.status} in {r.seconds:.1f} s", flush=True)
            results["steps"].append(r.__dict__)
    results["total_s"] = time.perf_counter() - t0
    (out / "results.json").write_text(json_text(results, indent=1, default=str))
    (out / "results.md").write_text(markdown(results))
    failed = [s["name"] for s in results["steps"] if s["status"] != "passed"]
    print(f"gpu-check: {len(results['steps']) - len(failed)}/{len(results['steps'])} steps passed in "
          f"{results['total_s']:.0f} s; results in {out}")  # fmt: skip
    return 1 if failed else 0
