"""The hot tier, FAE and Hotline against the reference trainer.

* **Exact with a hot tier.** ``lookahead``, ``lru`` and ``nocache`` with hot rows
  (profiled at start-up) end with the same params_sha256 as ``--mode full``, on the
  memory and the disk store, for every model and both optimizers; so does ``--mode fae``
  (default schedule), with a partial hot set and with FAE's default budget (every row
  hot: the cold planner sees empty batches); a lookahead run with a hot tier resumed from
  a checkpoint ends bitwise equal too (the checkpoint holds the hot rows).
* **Hotline** computes the mini-batch's maths in two micro-batches: within 1e-6 (relative
  to each tensor's scale) of ``full`` with SGD; with Adagrad within 1e-6 after one step
  and 1e-5 after the run (Adagrad divides by the root of the accumulated squared gradient,
  so last-bit differences of ~0 gradients grow, as in tests/distributed/test_jobs.py). The
  summary reports its micro-batch sizes.
* **FAE's split schedule** trains all-hot batches apart (an approximation: it runs, its
  all-hot batches are counted, its parameters differ from the exact run's).
* **summary.json**: the hot tier's figures agree with a recount over the batches.
* **Command line**: ``bagpipe profile --out`` writes a file that ``bagpipe train --hot-rows``
  uses (exact); a hot tier with ``--mode full`` or a bad file is a one-line error (exit 2).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from runs import last_checkpoint, trained

from bagpipe.accel.profile import profile
from bagpipe.config.train import TrainConfig, only_applicable
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.train.loop import train

pytestmark = pytest.mark.integration

STEPS = 60
BATCH = 64
HOT_MB = 600 * 36 / 2**20  # 600 of the tiny data's 26,363 rows (D = 8 + 1 Adagrad state float): ~75% of lookups


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    yield


def cfg(data: str, out, **kw) -> TrainConfig:
    base = dict(
        data=data,
        out=str(out),
        steps=STEPS,
        batch_size=BATCH,
        lr=0.05,
        seed=5,
        progress=False,
        eval_samples=512,
        hot_sample_rate=1.0,
    )
    return TrainConfig.of(**only_applicable(base | kw))  # shared settings, each mode reads its own


@pytest.fixture(scope="module")
def reference(tiny_data, tmp_path_factory):
    @functools.cache
    def run(model: str, optimizer: str, steps: int = STEPS) -> dict:
        out = tmp_path_factory.mktemp(f"full-{model}-{optimizer}-{steps}")
        return trained(cfg(tiny_data, out, model=model, optimizer=optimizer, mode="full", steps=steps)) | {"out": out}

    return run


MATRIX = [
    # model, optimizer, mode, store
    ("dlrm", "adagrad", "lookahead", "memory"),
    ("deepfm", "sgd", "lookahead", "disk"),
    ("dcn", "adagrad", "lru", "disk"),
    ("wide_deep", "sgd", "nocache", "memory"),
    ("dlrm", "adagrad", "fae", "disk"),
    ("dcn", "sgd", "fae", "memory"),
    ("wide_deep", "adagrad", "lookahead", "memory"),
    ("deepfm", "adagrad", "nocache", "disk"),
    ("dlrm", "sgd", "lru", "memory"),
]


@pytest.mark.parametrize("model,optimizer,mode,store", MATRIX)
def test_hot_tier_matches_reference(tiny_data, reference, tmp_path, model, optimizer, mode, store):
    ref = reference(model, optimizer)
    # a cache of 200 rows and L = 16: batches have up to ~130 cold rows, so the oracle must force rows out
    got = trained(
        cfg(
            tiny_data,
            tmp_path / "run",
            model=model,
            optimizer=optimizer,
            mode=mode,
            store=store,
            hot_budget_mb=HOT_MB,
            cache_rows=200,
            lookahead=16,
        )
    )
    assert got["params_sha256"] == ref["params_sha256"]
    c, hot = got["cache"], got["cache"]["hot"]
    assert hot["rows"] == int(HOT_MB * 2**20) // (4 * (8 + (optimizer == "adagrad")))  # D = 8, S = 1 or 0
    assert 0.5 < hot["lookup_share"] < 1 and hot["lookups"] == STEPS * BATCH * 8
    assert c["hits"] + c["misses"] == c["unique_rows"] == hot["unique_rows"] - hot["hot_unique_rows"]
    if mode == "lookahead":
        assert c["forced_evictions"] + c["retained_evictions"] > 0
        assert c["rows_written_back"] <= c["rows_fetched"] == c["store"]["rows_written"] - hot["rows"]


def test_fae_with_every_row_hot_is_exact(tiny_data, reference, tmp_path):
    got = trained(cfg(tiny_data, tmp_path / "run", mode="fae"))  # FAE's 256 MiB: every row the profile saw
    assert got["params_sha256"] == reference("dlrm", "adagrad")["params_sha256"]
    assert got["cache"]["hot"]["profile"]["budget_mb"] == 256.0
    assert got["cache"]["hot"]["lookup_share"] == 1.0 and got["cache"]["rows_fetched"] == 0


def test_resumed_run_with_a_hot_tier_matches_reference(tiny_data, reference, tmp_path):
    run = tmp_path / "run"
    settings = dict(mode="lookahead", hot_budget_mb=HOT_MB, cache_rows=1500, lookahead=4)
    train(cfg(tiny_data, run, steps=STEPS // 2, checkpoint_every=STEPS // 4, **settings))
    resumed = trained(cfg(tiny_data, run, resume=True, **settings))
    assert resumed["steps_this_run"] == STEPS // 2
    assert resumed["params_sha256"] == reference("dlrm", "adagrad")["params_sha256"]


def params(run) -> dict[str, np.ndarray]:
    ck = last_checkpoint(run)
    out = {f"dense/{k}": v.numpy() for k, v in ck.dense["model"].items()}
    w, s = ck.reader().arrays()
    return out | {"emb/weights": w, "emb/state": s}


def max_rel_diff(a: dict, b: dict) -> float:
    """max over tensors of max |a - b| / max |b| (scale-relative, see tests/distributed/test_jobs.py)."""
    return max(
        float(np.abs(a[k].astype(np.float64) - b[k]).max()) / max(float(np.abs(b[k]).max()), 1e-12)
        for k in b
        if b[k].size
    )


@pytest.mark.parametrize("optimizer,steps,rel", [("sgd", STEPS, 1e-6), ("adagrad", 1, 1e-6), ("adagrad", STEPS, 1e-5)])
def test_hotline_matches_reference_within_rounding(tiny_data, reference, tmp_path, optimizer, steps, rel):
    ref = reference("dlrm", optimizer, steps)
    got = trained(
        cfg(tiny_data, tmp_path / "run", mode="hotline", optimizer=optimizer, steps=steps, hot_budget_mb=4 * HOT_MB)
    )
    assert max_rel_diff(params(tmp_path / "run"), params(ref["out"])) <= rel
    assert got["params_sha256"] != ref["params_sha256"] or steps == 1  # summation order differs
    micro = got["cache"]["hot"]["popular_inputs_per_step"]  # the popular micro-batch; the rest is the other
    assert 0 < micro["min"] <= micro["mean"] <= micro["max"] < BATCH
    assert got["cache"]["hot"]["input_share"] == pytest.approx(micro["mean"] / BATCH)


def test_fae_split_schedule_trains_hot_batches_apart(tiny_data, reference, tmp_path):
    got = trained(cfg(tiny_data, tmp_path / "run", mode="fae", fae_schedule="split", hot_budget_mb=4 * HOT_MB))
    hot = got["cache"]["hot"]
    assert hot["schedule"] == "split" and hot["all_hot_batches"] > 0
    assert got["params_sha256"] != reference("dlrm", "adagrad")["params_sha256"]
    assert 0.5 < got["eval_auc"] < 1


def test_summary_hot_figures_match_a_recount(tiny_data, tmp_path):
    got = trained(cfg(tiny_data, tmp_path / "run", mode="nocache", hot_budget_mb=HOT_MB))
    hot = got["cache"]["hot"]
    ds = Dataset(tiny_data)
    stream = BatchStream(ds, "train", BATCH, seed=5)
    rows = profile(ds, HOT_MB, dim=8, state_dim=1, sample_rate=1.0, seed=5)  # what the run profiled
    batches = [stream.batch(k).rows.numpy() for k in range(STEPS)]
    assert hot["hot_lookups"] == sum(int(rows.contains(b).sum()) for b in batches)
    uniq = [np.unique(b) for b in batches]
    assert hot["hot_unique_rows"] == sum(int(rows.contains(u).sum()) for u in uniq)
    assert hot["unique_rows"] == sum(len(u) for u in uniq)
    assert got["cache"]["rows_fetched"] == hot["unique_rows"] - hot["hot_unique_rows"]  # cold rows, once a step
    assert hot["mib"] == pytest.approx(600 * 36 / 2**20) and hot["profile"]["coverage_sample"] == "in-sample"


def test_profile_command_file_drives_a_run(tiny_data, reference, run_cli, tmp_path):
    hot_file = tmp_path / "hot.npz"
    rc, out, err = run_cli(
        "profile",
        "--data",
        tiny_data,
        "--hot-budget-mb",
        HOT_MB,
        "--sample-rate",
        "1",
        "--embedding-dim",
        8,
        "--out",
        hot_file,
        "--no-progress",
    )
    assert rc == 0, err
    assert "all" in out and "hot rows: 600" in out
    got = trained(cfg(tiny_data, tmp_path / "run", mode="lookahead", hot_rows=str(hot_file), cache_rows=1500))
    assert got["params_sha256"] == reference("dlrm", "adagrad")["params_sha256"]
    assert got["cache"]["hot"]["rows"] == 600 and got["cache"]["hot"]["profile"]["source"] == str(hot_file)
    common = ["train", "--data", tiny_data, "--steps", 2, "--batch-size", BATCH, "--no-progress"]
    rc, _, err = run_cli(*common, "--out", tmp_path / "a", "--hot-budget-mb", 1)
    assert rc == 2 and "--mode full holds every row already" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run_cli(*common, "--out", tmp_path / "b", "--mode", "fae", "--hot-rows", tmp_path / "nope.npz")
    assert rc == 2 and "no such hot-row file" in err
