"""The opt-in approximations as whole runs, and the combinations they refuse.

* **Off is exact.** Without ``--skip-stale`` (every approximation off) ``lookahead`` with
  a hot tier ends with ``--mode full``'s params_sha256, the summary says ``"exact": true``
  and metrics.jsonl carries no approximation tag.
* **Slipstream** (``--skip-stale``) on ``full`` and on ``lookahead`` with the same hot
  rows skips the same inputs and ends with the same params_sha256 (the skip is decided
  from the rows' values, which agree bitwise, and the cache's plans are not changed);
  that digest differs from the exact run's; the summary says ``"exact": false``, names
  the approximation, T, the share skipped per epoch, and every metrics.jsonl record
  says ``"exact": false``.
* **Refusals.** Every unsupported combination of ``--skip-stale`` and of
  ``--cache-sync periodic:K`` is one line on stderr with exit code 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from runs import trained

from bagpipe.config.train import TrainConfig, only_applicable

pytestmark = pytest.mark.integration

STEPS = 60
BATCH = 64
HOT_MB = 600 * 36 / 2**20  # 600 rows of D = 8 + 1 Adagrad state float


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


def run(data: str, out: Path, **kw) -> dict:
    base = dict(
        data=data,
        out=str(out),
        steps=STEPS,
        batch_size=BATCH,
        seed=5,
        progress=False,
        eval_samples=512,
        hot_sample_rate=1.0,
        final_checkpoint=False,
    )
    return trained(TrainConfig.of(**only_applicable(base | kw)))  # shared settings, each mode reads its own


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def full(tiny_data, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("full")
    return run(tiny_data, out, mode="full") | {"out": out}


def test_off_is_exact(tiny_data, tmp_path, full):
    s = run(tiny_data, tmp_path / "la", mode="lookahead", cache_rows=2000, lookahead=4, hot_budget_mb=HOT_MB)
    assert s["params_sha256"] == full["params_sha256"]
    assert s["exact"] is True and s["approximation"] is None and full["exact"] is True
    assert not any("exact" in r for r in records(tmp_path / "la"))


def test_skip_stale_full_equals_lookahead(tiny_data, tmp_path, full):
    kw = dict(skip_stale=True, hot_budget_mb=HOT_MB, stale_target=0.3, eval_every=30)
    a = run(tiny_data, tmp_path / "full", mode="full", **kw)
    b = run(tiny_data, tmp_path / "la", mode="lookahead", cache_rows=2000, lookahead=4, **kw)
    assert a["params_sha256"] == b["params_sha256"] != full["params_sha256"]
    for s in (a, b):
        assert s["exact"] is False and s["approximation"]["names"] == ["skip-stale"]
    sa, sb = a["approximation"]["skip_stale"], b["approximation"]["skip_stale"]
    assert sa["threshold"] == sb["threshold"] and sa["threshold"] > 0
    assert sa["skipped_inputs"] == sb["skipped_inputs"] > 0
    assert sa["per_epoch"] == sb["per_epoch"] and sa["per_epoch"][0]["inputs"] == STEPS * BATCH
    assert sa["decided_at_step"] == 6  # ceil(0.015 * 337 batches per epoch) steps after step 0
    recs = records(tmp_path / "full")
    assert recs and all(r["exact"] is False and r["approximation"] == ["skip-stale"] for r in recs)


BASE = ["--steps", "5", "--batch-size", "64", "--no-progress"]
REFUSED = {
    "distributed": (
        ["--skip-stale", "--mode", "lookahead", "--trainers", "2", "--servers", "1", "--hot-budget-mb", "0.1"],
        "--skip-stale runs on one process",
    ),
    "mode": (["--skip-stale", "--mode", "lru"], "--skip-stale works with --mode full or lookahead, got --mode lru"),
    "no-hot-tier": (
        ["--skip-stale", "--mode", "lookahead"],
        "--skip-stale with --mode lookahead watches the hot tier's rows",
    ),
    "resume": (["--skip-stale", "--resume"], "--skip-stale runs cannot be resumed"),
    "option-without": (["--stale-target", "0.2"], "--stale-target applies to --skip-stale, which is off"),
    "target": (["--skip-stale", "--stale-target", "1.5"], "stale target must be in (0, 1), got 1.5"),
    "periodic-one-trainer": (
        ["--mode", "lookahead", "--servers", "1", "--cache-sync", "periodic:4"],
        "--cache-sync periodic:4 averages the copies of several trainers: it needs --trainers N >= 2",
    ),
    "periodic-syntax": (
        ["--mode", "lookahead", "--trainers", "2", "--servers", "1", "--cache-sync", "periodic:0"],
        "--cache-sync must be partitioned, owner, replicated or periodic:K with K >= 1 steps, got 'periodic:0'",
    ),
    "owner-hot-tier": (
        ["--mode", "lookahead", "--trainers", "2", "--servers", "1", "--cache-sync", "owner", "--hot-budget-mb", "0.1"],
        "--cache-sync owner does not plan a hot tier's rows yet",
    ),
    "owner-too-many": (
        ["--mode", "lookahead", "--trainers", "128", "--servers", "1", "--cache-sync", "owner", "--batch-size", "128"],
        "--cache-sync owner supports up to 64 trainers (a row's users are a 64-bit mask), got --trainers 128",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_with_one_line(run_cli, tiny_data, tmp_path, case):
    args, message = REFUSED[case]
    rc, out, err = run_cli("train", "--data", tiny_data, "--out", tmp_path / "r", *BASE, *args)
    assert rc == 2, (out, err)
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r").exists()
