"""The end of a run stays within its memory budget (issue 32, "A long run's end is outside
its budget"; docs/beyond-memory.md#the-end-of-a-run).

* A ``lookahead`` run on the disk store inside a real 512 MiB memory cgroup, its table
  file 2.4x the limit (Criteo-Kaggle at 5% cardinality, 1.69M rows, D = 64 with Adam's
  2D state values: 768 B a row, 1.21 GiB), 40 steps of batch 512 over flat (Zipf 0.5)
  ids and no checkpoint before the final one, so that the final checkpoint's cut holds
  every row written since initialisation (117K rows, 87 MiB; copied, and copied again in
  the part's layout, as the cut did before, it does not fit what the budget leaves and the
  run was OOM-killed at its end). It now completes: exit 0, its summary, a final
  checkpoint of step 40 whose rows equal those of an unlimited ``--mode full`` run's
  final checkpoint, and the same params digest. Skipped, with the reason, where no memory
  cgroup can be made. 13-25 s on 2 busy cores.
* ``--mode full`` under a budget its tables do not fit (criteo-1tb's 204M rows at D = 128:
  100 GB) is refused in one line, the line ``bagpipe plan`` gives, before any table is
  allocated (the process's address space is limited to 16 GiB: an allocation of the
  tables would be a traceback).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import numpy as np
import pytest

LIMIT_MB = 512
STEPS = 40
#: The run in the cgroup (and, with --mode full, the unlimited reference).
ARGS = ["--batch-size", "512", "--steps", str(STEPS), "--embedding-dim", "64", "--optimizer", "adam",
        "--eval-samples", "512", "--threads", "2", "--no-progress"]  # fmt: skip


def _bagpipe(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bagpipe", *args], capture_output=True, text=True, **kw)


def _stored(run_dir):
    """(ids, values) of the rows the run's latest checkpoint holds, and its step."""
    from bagpipe.checkpoint import latest

    ck = latest(run_dir)
    assert ck is not None, f"{run_dir}: no checkpoint"
    chunks = list(ck.reader().stored())
    ids = np.concatenate([c[0] for c in chunks])
    values = np.concatenate([np.concatenate([c[1], c[2]], axis=1) for c in chunks])
    return ck.step, ids, values


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_long_runs_end_streams_within_a_memory_cgroup(tmp_path):
    from bagpipe.budget.sizing import MARGIN
    from bagpipe.data.synthetic import SynthConfig, generate
    from bagpipe.testbed.memlimit import MemoryGroup, find_memory_controller

    controller, why = find_memory_controller()
    if controller is None:
        pytest.skip(why)
    data = tmp_path / "data"
    samples = int(512 * (STEPS + 2) / 0.9) + 1
    generate(
        SynthConfig(profile="criteo-kaggle", samples=samples, scale=0.05, zipf_exponent=0.5, seed=1),
        data,
        progress=False,
    )
    full = _bagpipe(["train", "--data", str(data), "--out", str(tmp_path / "full"), "--mode", "full", *ARGS])
    assert full.returncode == 0, full.stderr[-2000:]
    with MemoryGroup(controller, LIMIT_MB << 20, "bagpipe-end") as group:
        run = _bagpipe(
            [
                "train",
                "--data",
                str(data),
                "--out",
                str(tmp_path / "la"),
                "--mode",
                "lookahead",
                "--store",
                "disk",
                *ARGS,
            ],
            preexec_fn=group.enter,
        )
        report = group.report()
    assert run.returncode == 0, (report, run.stderr[-2000:])
    assert report["oom_kills"] == 0 and report["peak_mb"] <= LIMIT_MB
    s = json.loads((tmp_path / "la" / "summary.json").read_text())
    ref = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert s["params_sha256"] == ref["params_sha256"]
    assert s["memory"]["budget_mb"] == LIMIT_MB  # the cgroup's limit is the budget
    (only,) = s["checkpoints"]["history"]  # no intermediate checkpoint: the final one holds every written row
    assert only["step"] == STEPS and only["kind"] == "full" and only["failed"] is None
    # the cut as it was (a copy of every row, copied again in the part's layout) does not
    # fit what the budget leaves it: the run was OOM-killed here before
    m = s["memory"]
    row_bytes = 4 * (64 + 2 * 64)
    usable = LIMIT_MB * (1 - MARGIN)
    left = usable - m["estimate_mb"] + m["estimate_parts_mb"]["checkpoint cut"]
    assert 2 * only["rows"] * (row_bytes + 8) / 2**20 > left, (only["rows"], left)
    assert m["peak_anon_mb"] <= usable  # the whole run, its end included
    step, ids, values = _stored(tmp_path / "la")
    ref_step, ref_ids, ref_values = _stored(tmp_path / "full")
    assert step == ref_step == STEPS and len(ids) == only["rows"]
    assert np.array_equal(ids, ref_ids) and np.array_equal(values, ref_values)


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_full_mode_over_its_budget_is_refused_in_plans_line_before_its_tables(tmp_path):
    from bagpipe.data.synthetic import SynthConfig, generate

    data = tmp_path / "d"
    generate(SynthConfig(profile="criteo-1tb", samples=600, scale=1.0, seed=3), data, progress=False)
    common = ["--data", str(data), "--model", "dcn", "--recipe", "dcn-mlperf", "--mode", "full"]
    common += ["--memory-budget-mb", "512", "--batch-size", "64"]
    train = _bagpipe(["train", *common, "--out", str(tmp_path / "r"), "--steps", "2"], preexec_fn=_limit_address_space)
    plan = _bagpipe(["plan", *common], preexec_fn=_limit_address_space)
    lines = [line for line in train.stderr.splitlines() if line.strip()]
    assert train.returncode != 0 and len(lines) == 1, train.stderr[-2000:]
    assert "Traceback" not in train.stderr
    why = lines[0].removeprefix("bagpipe train: error: ")
    assert why.startswith("memory budget 512 MiB (--memory-budget-mb 512) is too small for --mode full")
    assert why in plan.stdout + plan.stderr
    assert not (tmp_path / "r" / "store").exists()
