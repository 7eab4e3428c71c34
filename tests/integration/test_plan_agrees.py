"""`bagpipe plan` and `bagpipe train` agree on what does not fit (issue 32, item 2).

* every memory refusal `train` makes before it trains, `plan` with the same options makes
  too, exit status 2 and the same words (one code path: bagpipe.train.preflight.memory_checks);
* a local job's roles are held together against the one memory cgroup they share;
* the smallest budget a refusal names is one a run in a fresh cgroup of that size completes;
* a role the kernel's OOM killer ends is named by the launcher, with the limit.

Each case also asserts that nothing of the user's changed: no run folder, the data set as it was.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BASE = ("--steps", "5", "--no-progress")


def files_of(root: str | Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: its size and modification time."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(Path(root).rglob("*")) if p.is_file()}


def refusal(err: str, command: str) -> str:
    """The one line after ``bagpipe COMMAND: error: ``."""
    lines = [line for line in err.splitlines() if line.startswith(f"bagpipe {command}: error: ")]
    assert len(lines) == 1, err
    return lines[0].split(": error: ", 1)[1]


def memory_group(limit_mb: int, name: str = "bagpipe-plan-test"):
    from bagpipe.testbed.memlimit import MemoryGroup, find_memory_controller

    controller, why = find_memory_controller()
    if controller is None:
        pytest.skip(f"no memory cgroup can be made here: {why}")
    return MemoryGroup(controller, limit_mb << 20, name)


def bagpipe_in(group, *args, script: str | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """``bagpipe ARGS`` as a process of its own inside ``group`` (``script``: Python run before it)."""
    code = (script or "") + "\nimport sys\nfrom bagpipe.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        preexec_fn=group.enter,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: Every refusal `train` makes at start-up over its memory: (name, options, words it says).
REFUSALS = [
    ("budget too small", ("--mode", "lookahead", "--store", "disk", "--memory-budget-mb", "100"),
     "is too small for this run: even its smallest configuration needs"),
    ("full tables over the budget", ("--mode", "full", "--memory-budget-mb", "100"),
     "is too small for --mode full: its tables alone take"),
    ("cache below a batch's unique rows", ("--mode", "lookahead", "--cache-rows", "100"),
     "a cache of 100 rows cannot hold step 1's"),
    ("lru cache below a batch's unique rows", ("--mode", "lru", "--store", "disk", "--cache-rows", "100"),
     "a cache of 100 rows cannot hold step"),
    ("cache budget below a batch", ("--mode", "lookahead", "--cache-budget-mb", "0.001"), "0.001"),
    ("server budget too small",
     ("--mode", "lookahead", "--trainers", "1", "--servers", "1", "--server-memory-budget-mb", "100"),
     "embedding server: memory budget 100 MiB (--server-memory-budget-mb 100) is too small"),
    ("trainers' budget too small in a job",
     ("--mode", "lookahead", "--trainers", "2", "--servers", "1", "--memory-budget-mb", "100"),
     "is too small for this run"),
]  # fmt: skip


@pytest.mark.integration
@pytest.mark.parametrize("options,words", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_plan_refuses_what_train_refuses_in_its_words(tiny_data, tmp_path, run_cli, options, words):
    data_before = files_of(tiny_data)
    out = tmp_path / "run"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, *BASE, *options)
    assert rc == 2, err
    said = refusal(err, "train")
    assert words in said, said
    assert not out.exists()  # nothing of the run was made
    rc, stdout, err = run_cli("plan", "--data", tiny_data, *BASE, *options)
    assert rc == 2, stdout + err
    assert f"does not fit: {said}" in stdout or refusal(err, "plan") == said, stdout + err
    assert files_of(tiny_data) == data_before and list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_a_local_jobs_roles_share_one_cgroup(tiny_data, tmp_path):
    # alone each role fits 600 MiB; together (launcher, trainer, server, oracle) they do not
    data_before = files_of(tiny_data)
    out = tmp_path / "run"
    job = ("--data", tiny_data, *BASE, "--mode", "lookahead", "--store", "disk", "--trainers", "1", "--servers", "1")
    with memory_group(600) as group:
        plan = bagpipe_in(group, "plan", *job)
        train = bagpipe_in(group, "train", *job, "--out", out)
    assert plan.returncode == 2 and train.returncode == 2, (plan.stdout, train.stderr)
    said = refusal(train.stderr, "train")
    assert f"does not fit: {said}" in plan.stdout, plan.stdout
    assert re.search(
        r"memory budget 600 MiB \(the memory cgroup's limit .*\) is shared by every role of this local job and does "
        r"not hold them: launcher \d+ \+ the trainer \d+ \+ the embedding server \d+ \+ the oracle \d+ = [\d,]+ MiB, "
        r"so the smallest budget that works is [\d,]+ MiB",
        said,
    ), said
    assert "[launcher]" not in train.stdout + train.stderr  # refused before any role started
    assert not out.exists() and files_of(tiny_data) == data_before
    # the budget named holds the job, each role sized to it (it named one refused in turn: round 21)
    named = re.search(r"the smallest budget that works is ([\d,]+) MiB", said)
    assert named is not None
    need = int(named.group(1).replace(",", ""))
    with memory_group(need) as group:
        at = bagpipe_in(group, "plan", *job)
    with memory_group(need - 1) as group:
        below = bagpipe_in(group, "plan", *job)
    assert at.returncode == 0 and "fits: yes" in at.stdout, at.stdout + at.stderr
    assert below.returncode == 2, below.stdout


@pytest.mark.integration
@pytest.mark.parametrize("mode", [("--mode", "full"), ("--mode", "lookahead", "--store", "disk")], ids=["full", "la"])
def test_the_smallest_budget_named_is_one_a_run_completes_in(tiny_data, tmp_path, run_cli, mode):
    rc, stdout, _ = run_cli("plan", "--data", tiny_data, *mode, "--steps", "40", "--memory-budget-mb", "50")
    assert rc == 2, stdout
    named = re.search(r"the smallest budget that works is ([\d,]+) MiB", stdout)
    assert named is not None, stdout
    need = int(named.group(1).replace(",", ""))
    out = tmp_path / "run"
    # a fresh cgroup of exactly that size and no --memory-budget-mb: the cgroup's limit is the budget
    with memory_group(need) as group:
        run = bagpipe_in(group, "train", "--data", tiny_data, *mode, "--steps", "40", "--no-progress", "--out", out)
        report = group.report()
    assert run.returncode == 0 and report["oom_kills"] == 0, (need, report, run.stderr[-2000:])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["memory"]["budget_mb"] == need and summary["steps"] == 40


@pytest.mark.integration
def test_the_launcher_names_a_role_the_oom_killer_ended(tiny_data, tmp_path):
    # the job's check is switched off (as if the estimate were wrong): the roles' torch imports
    # overflow 420 MiB and the kernel kills one of them (they are its first choice)
    out = tmp_path / "run"
    off = "import bagpipe.budget.job as j\nj.check_job = lambda *a, **k: None"
    with memory_group(420) as group:
        run = bagpipe_in(group, "train", "--data", tiny_data, *BASE, "--mode", "lookahead", "--trainers", "1",
                         "--servers", "1", "--out", out, "--no-spares", script=off)  # fmt: skip
        ooms = group.oom_kills()
    assert run.returncode == 2 and ooms >= 1, run.stderr[-3000:]
    said = refusal(run.stderr, "train")
    assert re.search(
        r"^(trainer 0|server 0|oracle) \(rank \d\) failed: killed by the kernel's OOM killer at [\d,]+ MiB "
        r"\(limit 420 MiB\): every role of this job shares the launcher's memory cgroup .*`bagpipe plan`",
        said,
    ), said


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["train", "eval", "plan"])
def test_a_limit_too_small_to_import_torch_is_one_line_not_a_silent_kill(tiny_data, tmp_path, command):
    """At 120 MiB the kernel ended `train` during torch's import (exit -9, no word); now the
    command line refuses before the import, naming the limit and what starting needs."""
    out = tmp_path / "run"
    args = {
        "train": ["--data", tiny_data, "--out", out, "--steps", 5, "--no-progress"],
        "eval": ["--run", out, "--data", tiny_data],
        "plan": ["--data", tiny_data],
    }[command]
    with memory_group(120, "bagpipe-start-test") as group:
        r = bagpipe_in(group, command, *args)
        assert group.oom_kills() == 0
    assert r.returncode == 2, (r.returncode, r.stderr)
    line = refusal(r.stderr, command)
    assert line.startswith("this process's memory limit is 120 MiB") and f"starting `bagpipe {command}`" in line, line
    assert "needs about 160 MiB" in line and not out.exists()


@pytest.mark.integration
@pytest.mark.parametrize("damage", ["another-dim", "another-seed", "short-rows"])
def test_plan_refuses_a_store_to_start_from_that_train_refuses(tiny_data, tmp_path, run_cli, damage):
    """A --store-dir store of other rows (another D, another seed) or a rows.f32 of another
    size: plan said the run would start from it; train refused it on opening."""
    store = tmp_path / "st"
    made = ("--mode", "lookahead", "--store", "disk", "--store-dir", store, "--embedding-dim", "8")
    rc, _, err = run_cli("train", "--data", tiny_data, *BASE, *made, "--out", tmp_path / "a")
    assert rc == 0, err
    asked = ["--mode", "lookahead", "--store", "disk", "--store-dir", store, "--init-from-store"]
    asked += {"another-dim": ["--embedding-dim", "16"], "another-seed": ["--embedding-dim", "8", "--seed", "9"]}.get(
        damage, ["--embedding-dim", "8"]
    )
    if damage == "short-rows":
        with open(store / "rows.f32", "r+b") as f:
            f.truncate(f.seek(0, 2) - 4)
    before = {k: v for k, v in files_of(store).items() if not k.endswith(".lock")}  # (its opener's pid)
    rc, _, err = run_cli("train", "--data", tiny_data, *BASE, *asked, "--out", tmp_path / "b")
    assert rc == 2, err
    said = refusal(err, "train")
    want = {"another-dim": "dim=8 (asked for 16)", "another-seed": "seed=", "short-rows": "DiskStore file is"}[damage]
    assert want in said, said
    rc, stdout, err = run_cli("plan", "--data", tiny_data, *BASE, *asked, "--out", tmp_path / "c")
    assert rc == 2 and refusal(err, "plan") == said, stdout + err
    assert {k: v for k, v in files_of(store).items() if not k.endswith(".lock")} == before
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
