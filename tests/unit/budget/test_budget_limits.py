"""What a run is held to when its budget says less than the truth.

Unit: ``--memory-budget-mb`` above the memory cgroup's limit is the cgroup's limit (the
rule of a local job's shared budget), said in one warning naming both; a refusal's advice
names what to raise (the option, or the cgroup's limit); "N plans read ahead" names the
number the run uses.

Integration (tiny data in-process, a machine and a cgroup made small by monkeypatching):
with no budget, a run larger than the machine's memory is refused by `plan` and `train`
in the same one line before the run folder is made; the defaults of a run with no budget
are sized to the machine's memory; the warning and the refusal of an option above the
cgroup's limit are the same in `plan` and `train`; the exact "1 plan read ahead" text;
and a real `plan` of 26 billion rows refused in about a second, without allocating.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from bagpipe.budget.estimate import MIB
from bagpipe.budget.sizing import Budget, BudgetError, Sizes, Wanted, fit
from bagpipe.config.modes import mode_spec


def limits(monkeypatch, cgroup_mib: int | None, machine_mib: int | None = None) -> None:
    """This process in a cgroup of ``cgroup_mib`` (None: none) on a machine of ``machine_mib``."""
    import bagpipe.budget.cgroup as cgroup
    import bagpipe.budget.sizing as sizing

    limit = (None, "no memory cgroup") if cgroup_mib is None else (cgroup_mib * MIB, "cgroup v1 /x")
    monkeypatch.setattr(sizing, "own_limit", lambda: limit)
    monkeypatch.setattr(cgroup, "own_limit", lambda: limit)
    if machine_mib is not None:
        monkeypatch.setattr(cgroup, "machine_memory", lambda: (machine_mib * MIB, "test"))


def refusal(out: str) -> str:
    """The one line of `plan`'s "does not fit: X" or `train`'s "bagpipe train: error: X": X."""
    lines = [line for line in out.splitlines() if line.startswith(("does not fit: ", "bagpipe train: error: "))]
    assert len(lines) == 1, out
    return lines[0].removeprefix("does not fit: ").removeprefix("bagpipe train: error: ")


# --------------------------------------------------------------------------- unit


@pytest.mark.unit
def test_memory_budget_mb_above_the_cgroups_limit_is_the_cgroups_limit_said_once(monkeypatch):
    from bagpipe.budget.job import shared_budget

    limits(monkeypatch, 215)
    b = Budget.of(300)
    assert b.bytes == 215 * MIB and b.enforced and b.source == "the memory cgroup's limit (cgroup v1 /x)"
    assert b.note == (
        "--memory-budget-mb 300 is more than the memory cgroup's limit, 215 MiB (cgroup v1 /x): "
        "the run is sized to the cgroup's limit"
    )
    assert b == shared_budget(300) == Budget.of(None)  # one rule for one process and a local job
    assert b.more(400) == "raise the memory cgroup's limit to at least 400 MiB"
    small = Budget.of(200)  # below the limit: M, no warning
    assert (
        small.bytes == 200 * MIB
        and small.note is None
        and small.more(400) == "raise --memory-budget-mb to at least 400"
    )


@pytest.mark.unit
def test_plans_read_ahead_names_the_number_used():
    from bagpipe.budget.estimate import RunShape
    from bagpipe.store.diskio import DiskIO

    shape = RunShape(
        spec=mode_spec("lookahead"), store="memory", num_rows=26_363, dim=8, state_dim=1, batch_size=128,
        num_features=8, lookups=1024, unique=511, batch_bytes=6_000, dense_params=10_000, dense_states=1,
        saved_bytes=MIB, sample_bytes=68, eval_batch=128, fetch_rows=511, evict_rows=511,
    )  # fmt: skip
    w = Wanted(Sizes(1319, 0, 8, 9, DiskIO()), cache_fixed=False, hot_fixed=False, minimum_cache=511)
    for mib in range(100, 2000):  # the smallest budget that fits: down to one plan read ahead
        try:
            f = fit(Budget(mib * MIB, "test"), shape, w)
            break
        except BudgetError:
            continue
    assert f.sizes.staged == 1 and f.changes[0] == "1 plan read ahead instead of 9"


# --------------------------------------------------------------------------- integration


@pytest.mark.integration
def test_no_budget_and_a_run_larger_than_the_machine_is_one_line_in_plan_and_train(
    run_cli, tiny_data, tmp_path, monkeypatch
):
    limits(monkeypatch, None, machine_mib=150)  # the tiny run needs ~230 MiB
    for mode in (("--mode", "full"), ("--mode", "lookahead"), ("--mode", "lookahead", "--store", "disk")):
        args = ("--data", tiny_data, *mode, "--steps", "2", "--no-progress")
        rc, out, _ = run_cli("plan", *args)
        assert rc == 2
        said = refusal(out)
        assert said.startswith(
            "no memory budget (no memory cgroup), and this run does not fit this machine's memory, 150 MiB (test): "
        )
        assert re.search(r"needs [\d,]+ MiB \(.*\); use .*a machine with at least [\d,]+ MiB$", said), said
        assert ("--mode lookahead --store disk" in said) == ("disk" not in mode)
        run = tmp_path / f"run-{'-'.join(mode)}"
        rc, out, err = run_cli("train", *args, "--out", run)
        assert rc == 2 and "Traceback" not in out + err
        assert refusal(err) == said  # the same words, before the run folder is made
        assert not run.exists()
    # budgets off: nothing sized, still one line rather than the allocator's traceback
    rc, out, _ = run_cli("plan", "--data", tiny_data, "--memory-budget-mb", "0", "--no-progress")
    assert rc == 2 and "leave out --memory-budget-mb 0" not in refusal(out)  # --mode full: nothing a budget sizes
    rc, out, _ = run_cli("plan", "--data", tiny_data, "--mode", "lookahead", "--memory-budget-mb", "0")
    assert rc == 2 and refusal(out).startswith("no memory budget (--memory-budget-mb 0), and this run does not fit")
    assert "a memory budget so that the defaults are sized (leave out --memory-budget-mb 0)" in refusal(out)


@pytest.mark.integration
def test_no_budget_sizes_the_defaults_to_the_machine_and_leaves_a_run_that_fits_alone(run_cli, tiny_data, monkeypatch):
    args = ("--data", tiny_data, "--mode", "lookahead", "--store", "disk", "--batch-size", "128", "--no-progress")
    limits(monkeypatch, None, machine_mib=100_000)
    rc, out, _ = run_cli("plan", *args)
    assert rc == 0 and "(no budget:" not in out and "fits: yes" not in out  # as before: nothing sized
    limits(monkeypatch, None, machine_mib=280)  # usable 238 MiB: the defaults give way
    rc, out, _ = run_cli("plan", *args)
    assert rc == 0, out
    assert "  (no budget: the defaults were sized to the machine's memory, test, 280 MiB)" in out
    assert re.search(r"fits: yes \([\d,]+ of 238 MiB\)", out), out


@pytest.mark.integration
def test_memory_budget_mb_above_the_cgroup_is_said_and_refused_alike(run_cli, tiny_data, tmp_path, monkeypatch):
    warning = (
        "--memory-budget-mb 5000 is more than the memory cgroup's limit, 263 MiB (cgroup v1 /x): "
        "the run is sized to the cgroup's limit"
    )
    args = ("--data", tiny_data, "--mode", "lookahead", "--batch-size", "128", "--memory-budget-mb", "5000")
    limits(monkeypatch, 263)
    rc, out, _ = run_cli("plan", *args, "--steps", "2")
    assert rc == 0 and out.count(warning) == 1, out
    assert "memory budget: 263 MiB from the memory cgroup's limit (cgroup v1 /x); 224 MiB to plan for" in out
    assert re.search(r"fits: yes \([\d,]+ of 224 MiB\)", out), out
    rc, out, _ = run_cli("train", *args, "--steps", "2", "--no-progress", "--out", tmp_path / "r")
    assert rc == 0 and out.count(warning) == 1
    limits(monkeypatch, 240)  # too small: the advice names what to raise, the cgroup's limit
    rc, out, _ = run_cli("plan", *args)
    said = refusal(out)
    assert rc == 2 and said.startswith("memory budget 240 MiB (the memory cgroup's limit (cgroup v1 /x)) is too small")
    assert said.endswith("; raise the memory cgroup's limit") and "--memory-budget-mb" not in said
    rc, out, err = run_cli("train", *args, "--no-progress", "--out", tmp_path / "r2")
    assert rc == 2 and refusal(err) == said and not (tmp_path / "r2").exists()


@pytest.mark.integration
def test_plan_says_the_plans_read_ahead_the_run_uses(run_cli, tmp_path):
    rc, _, _ = run_cli("synth", "--profile", "tiny", "--samples", "20000", "--out", tmp_path / "d1", "--no-progress")
    assert rc == 0
    rc, out, _ = run_cli(
        "plan", "--data", tmp_path / "d1", "--mode", "lookahead", "--batch-size", "128", "--memory-budget-mb", "263"
    )
    assert rc == 0, out
    assert "  (the budget chose 1 plan read ahead instead of 9)" in out
    assert "; lookahead L = 8, 1 plan read ahead\n" in out and "plans read ahead" not in out


@pytest.mark.integration
def test_plan_of_26_billion_rows_is_refused_without_allocating(tmp_path):
    from bagpipe.budget.cgroup import machine_memory

    total, _ = machine_memory()
    if total is None or total > 800 * 2**30:
        pytest.skip("this machine holds the 26-billion-row tables' estimate (~915 GiB) or does not say its memory")
    huge = tmp_path / "huge"
    cli = [sys.executable, "-m", "bagpipe"]
    made = subprocess.run([*cli, "synth", "--profile", "tiny", "--scale", "1e6", "--samples", "100", "--out", huge,
                           "--no-progress"], capture_output=True, text=True)  # fmt: skip
    assert made.returncode == 0 and "26,363,000,000 rows" in made.stdout, made.stderr
    # each plan through a fresh wrapper that reports its one child's peak (RUSAGE_CHILDREN of
    # this process would include every child the test session ever waited for)
    peak = (
        "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(r.returncode)"
    )
    peaks = []
    for mode in ((), ("--mode", "lookahead")):
        t = time.monotonic()
        r = subprocess.run([sys.executable, "-c", peak, *map(str, cli), "plan", "--data", str(huge), "--batch-size",
                            "16", *mode], capture_output=True, text=True)  # fmt: skip
        took = time.monotonic() - t
        peaks.append(int(r.stderr.strip().splitlines()[-1]) * 1024)
        r = subprocess.CompletedProcess(r.args, r.returncode, r.stdout, "\n".join(r.stderr.splitlines()[:-1]))
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        said = refusal(r.stdout)
        assert "and this run does not fit this machine's memory" in said and "--mode lookahead --store disk" in said
        assert took < 30, took  # ~1.5 s; was 48 s building a planner of 1.3 billion slots for --mode lookahead
    # the children's peak: the interpreter and torch, not the tables (~915 GiB) nor a planner (~45 GiB)
    assert max(peaks) < 2 * 2**30, peaks
