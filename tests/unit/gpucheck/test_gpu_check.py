"""``make gpu-check`` (``bagpipe/gpucheck``) on a CPU: its logic, not GPU figures.

* **no GPU** (unit): ``make gpu-check`` prints one line, exits 0 and writes nothing;
* **the time budget** (unit): a step past its limit is stopped (its process group
  ended) and the next step still runs; a step's result is read whether it passed or not;
* **per-test outcomes** (unit): the ``tests`` step reads each test's outcome from
  ``pytest -v`` (two runs: the long matrix last), and counts the tests a stopped run did
  not reach;
* **the device memory budget** (integration): ``--mode full`` whose tables exceed
  ``--device-memory-budget-mb`` is refused in one line before training, naming the fix;
  the option is refused on ``--device cpu``;
* **the dry run** (integration): ``--device cpu-async --size tiny`` runs every step and
  writes results.json, results.md and gpu-check.log with every section filled; its
  results are refused by the docs writer (not GPU figures), which fills the markers of
  docs/gpu.md from a GPU run's results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from repo import ROOT

from bagpipe.device.cuda import cuda_unavailable_reason
from bagpipe.gpucheck.docs import fill
from bagpipe.gpucheck.report import BEGIN, END
from bagpipe.gpucheck.runner import TERM_GRACE_S, describe_tree, pytest_outcomes, run_step
from bagpipe.gpucheck.sizes import SIZES
from bagpipe.gpucheck.steps import TITLES, Step


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), e.get("PYTHONPATH", "")) if p)
    return e


@pytest.mark.unit
@pytest.mark.skipif(cuda_unavailable_reason() is None, reason="a GPU is here: make gpu-check would run the check")
def test_without_a_gpu_make_gpu_check_prints_one_line_and_runs_nothing(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(["make", "-s", "gpu-check", f"GPU_PY={sys.executable}", f"OUT={out}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\n") == 1 and r.stdout.startswith("gpu-check: no CUDA GPU here (") and not r.stderr
    assert "nothing run" in r.stdout and not out.exists()


@pytest.mark.unit
def test_a_step_past_its_limit_is_stopped_and_the_next_step_runs(tmp_path):
    slow = Step("bench", "slow", (sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"),
                tmp_path / "never.json")  # fmt: skip
    done = tmp_path / "done.json"
    code = f"import json; json.dump({{'passed': True, 'figures': {{'x': 1}}}}, open({str(done)!r}, 'w'))"
    quick = Step("beyond", "quick", (sys.executable, "-c", code), done)
    t0 = time.perf_counter()
    a = run_step(slow, 1.0, tmp_path / "slow.log", env())
    assert a.status == "stopped at its limit" and a.returncode is None and a.result is None
    assert time.perf_counter() - t0 < 15 and "started" in (tmp_path / "slow.log").read_text()
    b = run_step(quick, 30.0, tmp_path / "quick.log", env())
    assert b.status == "passed" and b.result == {"passed": True, "figures": {"x": 1}}
    failing = Step("beyond", "fails", (sys.executable, "-c", "raise SystemExit(3)"), tmp_path / "none.json")
    c = run_step(failing, 30.0, tmp_path / "fail.log", env())
    assert c.status == "failed" and c.returncode == 3


@pytest.mark.unit
def test_the_gpu_size_fits_eight_minutes_and_every_step_has_a_limit():
    gpu = SIZES["gpu"]
    assert set(gpu.limits_s) == set(TITLES) == set(SIZES["tiny"].limits_s)
    assert gpu.total_s + len(TITLES) * TERM_GRACE_S + 20 <= 8 * 60  # 20 s: the runner's own start


@pytest.mark.unit
@pytest.mark.parametrize(
    "args,says",
    [
        (["--limit", "bench=0"], "--limit 'bench=0': give STEP=SECONDS"),
        (["--limit", "nope=3"], "--limit 'nope=3': give STEP=SECONDS"),
        (["--only", "tests,nope"], "--only tests,nope: unknown step 'nope'"),
    ],
)
def test_bad_limits_and_steps_are_one_line_before_anything_runs(tmp_path, capsys, args, says):
    from bagpipe.gpucheck.runner import main

    assert main(["--device", "cpu-async", "--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and not (tmp_path / "out").exists()


PYTEST_V = """\
collected 83 items / 76 deselected / 7 selected

tests/gpu/test_gpu.py::test_two_trainers_with_a_gpu_each_use_nccl SKIPPED (needs two CUDA GPUs) [ 14%]
$ python -m pytest -v -m gpu -k test_every_cached_mode_on_cuda_equals_full_on_cuda tests/gpu/test_gpu.py
collected 83 items / 19 deselected / 64 selected

tests/gpu/test_gpu.py::test_every_cached_mode_on_cuda_equals_full_on_cuda[dlrm-sgd-lookahead] PASSED [  1%]
tests/gpu/test_gpu.py::test_every_cached_mode_on_cuda_equals_full_on_cuda[dlrm-sgd-lru] FAILED [  2%]
"""


@pytest.mark.unit
def test_the_commit_names_tracked_files_that_differ_from_it(tmp_path):
    """A GPU machine received a working tree newer than its copy of the history: the
    results said the old commit alone (2026-11-27)."""
    assert describe_tree(tmp_path) is None  # not a repository
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py", "b.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    (tmp_path / "new.py").write_text("")  # untracked: not the tree's code
    assert describe_tree(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert describe_tree(tmp_path) == f"{head} + 1 changed file"
    (tmp_path / "b.py").unlink()
    assert describe_tree(tmp_path) == f"{head} + 2 changed files"


@pytest.mark.unit
def test_each_tests_outcome_is_read_and_the_unreached_are_counted():
    r = pytest_outcomes(PYTEST_V)
    assert r["selected"] == 71 and r["not_reached"] == 68
    assert r["counts"] == {"passed": 1, "failed": 1, "skipped": 1}
    assert r["tests"][0] == {"test": "tests/gpu/test_gpu.py::test_two_trainers_with_a_gpu_each_use_nccl",
                             "outcome": "skipped", "reason": "needs two CUDA GPUs"}  # fmt: skip


@pytest.mark.integration
def test_a_full_run_larger_than_the_device_budget_is_refused_in_one_line(tiny_data, tmp_path, run_cli):
    args = ("train", "--data", tiny_data, "--steps", 2, "--batch-size", 64, "--mode", "full", "--no-progress")
    rc, _, err = run_cli(*args, "--out", tmp_path / "a", "--device", "cpu-async", "--device-memory-budget-mb", 0.5)
    assert rc == 2 and err.count("\n") == 1, err
    assert "--device-memory-budget-mb 0.5 is too small" in err and "tables" in err and "--mode lookahead" in err
    assert not (tmp_path / "a").exists()
    rc, _, err = run_cli(*args, "--out", tmp_path / "b", "--device-memory-budget-mb", 5)
    assert rc == 2 and "applies to --device cuda or cpu-async" in err


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check") / "out"
    r = subprocess.run([sys.executable, "-m", "bagpipe.gpucheck", "--device", "cpu-async", "--out", str(out)],
                       cwd=ROOT, env=env(), capture_output=True, text=True, timeout=280)  # fmt: skip
    return r, out


@pytest.mark.integration
def test_the_dry_run_writes_every_file_with_every_section_filled(dry_run):
    r, out = dry_run
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert res["size"] == "tiny" and res["environment"]["device"] == "cpu-async"
    steps = {s["name"]: s for s in res["steps"]}
    assert list(steps) == list(TITLES) and all(s["status"] == "passed" for s in steps.values())
    assert all(s["seconds"] <= s["limit_s"] for s in steps.values())
    tests = steps["tests"]["result"]
    assert tests["selected"] == len(tests["tests"]) > 0 and tests["counts"] == {"skipped": tests["selected"]}
    ex = steps["exactness"]["result"]["figures"]
    assert set(ex["runs"]) >= {"full", "lookahead/memory", "lookahead/disk", "lru/memory", "nocache/memory"}
    assert all(run["equal_to_full"] for run in ex["runs"].values())
    assert all(a["params_equal"] for a in ex["against_cpu"].values())  # the twin computes with the CPU's kernels
    bench = steps["bench"]["result"]["figures"]["runs"]
    assert [b["config"]["batch_size"] for b in bench] == list(SIZES["tiny"].bench_batches)
    for b in bench:
        assert (
            set(b["results"]) == {"full/memory", "lookahead/memory"}
            and b["results"]["full/memory"]["ratio_to_full"] == 1.0
        )
    beyond = steps["beyond"]["result"]["figures"]
    assert beyond["tables_mb"] > beyond["budget_mb"] and "is too small" in beyond["full_refused"]
    assert beyond["lookahead"]["samples_per_s"] > 0
    dp = steps["data-parallel"]["result"]["figures"]
    assert dp["worst_relative_diff"] <= dp["tolerance"] and dp["trainers"] == 2
    md = (out / "results.md").read_text()
    for title in TITLES.values():
        section = md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
        assert section.count("|") > 10, (title, section)  # a table, not a line saying the step wrote nothing
    log = (out / "gpu-check.log").read_text()
    assert all(f"--- {name}: passed" in log for name in TITLES)


@pytest.mark.integration
def test_the_docs_writer_refuses_a_dry_run_and_fills_the_markers(dry_run, tmp_path):
    _, out = dry_run
    doc = tmp_path / "gpu.md"
    doc.write_text(f"# GPU\n\nbefore\n{BEGIN}\nnot measured yet\n{END}\nafter\n")
    r = subprocess.run([sys.executable, "-m", "bagpipe.gpucheck.docs", str(out), "--doc", str(doc)], cwd=ROOT,
                       env=env(), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a GPU run" in r.stderr
    assert "not measured yet" in doc.read_text()
    res = json.loads((out / "results.json").read_text())
    filled = fill(doc.read_text(), res)
    assert filled.startswith("# GPU\n\nbefore\n") and filled.endswith(f"{END}\nafter\n")
    assert "not measured yet" not in filled and all(f"#### {t}" in filled for t in TITLES.values())
    assert BEGIN in (ROOT / "docs" / "gpu.md").read_text()  # docs/gpu.md has the markers the writer fills


@pytest.mark.unit
def test_training_and_the_launcher_run_without_psutil():
    """A bare GPU machine may lack psutil (a dependency make setup installs): the resident
    memory reading, the launcher's network interface and the benchmarks' machine line
    fall back to Linux's own figures."""
    code = (
        "import sys; sys.modules['psutil'] = None\n"
        "import bagpipe.train.loop\n"
        "from bagpipe.distributed.launch import interface_of\n"
        "from bagpipe.train.metrics import current_rss_mb\n"
        "from bagpipe.bench.harness.report import machine\n"
        "print(interface_of('127.0.0.1'), current_rss_mb() > 10, machine()['ram_gib'] > 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["lo", "True", "True"]
