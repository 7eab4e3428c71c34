"""Every cached mode computes exactly what the reference trainer computes.

The design's first invariant: on one process, ``--mode lookahead``, ``lru`` and
``nocache`` end with the same params_sha256 (a digest of every dense parameter, every
embedding row and its optimizer state) as ``--mode full``. The matrix covers every
model, SGD and Adagrad, the memory and disk stores, and L in {1, 2, 8, 64}; plus a
cache so small that the oracle must force rows out early (asserted), a cache exactly
as large as the largest batch's unique rows, and checkpoint/resume in lookahead mode.

Row-wise Adam (S = 2D) and partial row-wise Adam (S = D + 1) run every cached mode on
both stores, with the MLPerf warm-up + polynomial-decay schedule, a separate embedding
rate and weight decay (shorter runs, one model each); a lookahead run resumed from a
checkpoint taken mid-warm-up ends with the uninterrupted run's digest, and the
reference's logged rates equal the schedule's closed form.

Each run's summary also tells the trainer's waits for a plan apart from its waits for
rows (``cache.pipeline_s``): within the total wait, and every step after the first for
the synchronous modes, whose planning runs in the trainer's thread.

Every cached run here computes on the asynchronous CPU twin (``--device cpu-async``,
:mod:`bagpipe.device.twin`): its rows travel between store and cache through staged
copies that run late and out of order on a worker thread, ordered only by the events
the CUDA path uses, so these digests also prove that path waits where it must
(``tests/integration/test_device_runs.py`` shows a dropped wait changing the digest). The
references run ``--mode full`` on the plain CPU.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
from runs import trained

from bagpipe.config.train import TrainConfig, only_applicable
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.data.synthetic import SynthConfig, generate

# tiny models: one torch thread is faster, above all on a busy machine (tests/README.md)
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

STEPS = 200
BATCH = 64


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("exact") / "tiny"
    generate(SynthConfig(profile="tiny", samples=16000, seed=3), str(out), progress=False)
    return str(out)


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    @functools.cache
    def run(model: str, optimizer: str) -> dict:
        out = tmp_path_factory.mktemp(f"full-{model}-{optimizer}")
        extra = ADAM_SETTINGS if optimizer in ADAM_MODELS else {}
        summary = trained(cfg(data, str(out), model=model, optimizer=optimizer, mode="full", **extra))
        return summary | {"out": out}

    return run


def cfg(data: str, out: str, **kw) -> TrainConfig:
    base = dict(data=data, out=out, steps=STEPS, batch_size=BATCH, lr=0.05, seed=7, progress=False, eval_samples=512)
    base["device"] = (
        "cpu" if kw.get("mode", "full") == "full" else "cpu-async"
    )  # cached runs: the copies through the twin
    base.update(kw)
    return TrainConfig.of(**only_applicable(base))  # the matrix gives every mode the cache settings


MATRIX = [
    # model, optimizer, mode, store (disk-LAYOUT: --store-layout LAYOUT; disk: the default, auto), lookahead
    ("dlrm", "adagrad", "lookahead", "memory", 1),
    ("dlrm", "sgd", "lookahead", "disk-frequency", 8),
    ("deepfm", "adagrad", "lookahead", "disk-identity", 2),
    ("wide_deep", "sgd", "lookahead", "memory", 64),
    ("dcn", "adagrad", "lookahead", "memory", 8),
    ("dcn", "adagrad", "lru", "disk-frequency", 8),
    ("wide_deep", "sgd", "lru", "memory", 8),
    ("deepfm", "adagrad", "nocache", "memory", 8),
    ("dlrm", "sgd", "nocache", "disk", 8),
]


@pytest.mark.parametrize("model,optimizer,mode,store,L", MATRIX)
def test_mode_matches_reference(data, reference, tmp_path, model, optimizer, mode, store, L):
    ref = reference(model, optimizer)
    store, _, layout = store.partition("-")
    got = trained(
        cfg(
            data,
            str(tmp_path / "run"),
            model=model,
            optimizer=optimizer,
            mode=mode,
            store=store,
            lookahead=L,
            cache_rows=2000,
            **({"store_layout": layout} if layout else {}),
        )
    )
    assert got["params_sha256"] == ref["params_sha256"]
    if store == "disk":  # the row layout changes where rows lie in the file, never what is read
        s = got["cache"]["store"]
        want = layout or "frequency"  # auto: 200 steps of 64 samples are 0.89 of the split's epoch
        assert s["layout"] == want and (s["packed_rows"] > 0) == (want == "frequency")
        assert s["layout_choice"] == f"--store-layout {layout}" if layout else "auto" in s["layout_choice"]
    assert got["eval_auc"] == ref["eval_auc"]
    c = got["cache"]
    assert c["hits"] + c["misses"] == c["unique_rows"]
    assert c["rows_fetched"] == c["misses"]
    if mode == "nocache":
        assert c["hits"] == 0 and c["rows_written_back"] == c["rows_fetched"]
    # the trainer's waits for a plan, apart from its waits for rows (summary.json's cache.pipeline_s)
    waits = c["pipeline_s"]
    assert 0 <= waits["wait_plan"] <= waits["wait_embeddings"] and waits["first_plan_wait"] >= 0
    if mode != "lookahead":  # planned in the trainer's thread: every step waited for its plan
        assert waits["plan_waits"] == STEPS - 1 and waits["first_plan_wait"] > 0
    if mode == "lookahead":
        assert c["hits"] > 0
        # every fetched row reached the store by the end, once: written back when its slot was
        # needed, or (retained past its window) by the end's flush of the cached rows
        assert c["rows_written_back"] <= c["rows_fetched"] == c["store"]["rows_written"]


# The Adam family: every cached mode on both stores, one model per optimizer, shorter
# runs; the schedule, a separate embedding rate and weight decay ride along.
ADAM_MODELS = {"adam": "dlrm", "partial_rowwise_adam": "deepfm"}
ADAM_SETTINGS = dict(
    steps=40,
    lr=0.01,
    embedding_lr=0.02,
    weight_decay=1e-3,
    lr_schedule="warmup-poly",
    lr_warmup_steps=10,
    lr_decay_start=20,
    lr_decay_steps=15,
)
ADAM_MATRIX = [
    (opt, mode, store)
    for opt in ADAM_MODELS
    for mode in ("lookahead", "lru", "nocache")
    for store in ("memory", "disk")
]


@pytest.mark.parametrize("optimizer,mode,store", ADAM_MATRIX)
def test_adam_family_matches_reference(data, reference, tmp_path, optimizer, mode, store):
    model = ADAM_MODELS[optimizer]
    ref = reference(model, optimizer)
    got = trained(
        cfg(
            data,
            str(tmp_path / "run"),
            model=model,
            optimizer=optimizer,
            mode=mode,
            store=store,
            lookahead=4,
            cache_rows=1500,
            **ADAM_SETTINGS,
        )
    )
    assert got["params_sha256"] == ref["params_sha256"]
    assert got["cache"]["rows_fetched"] > 0 and (mode != "lookahead" or got["cache"]["hits"] > 0)


def test_resume_mid_warmup_matches_uninterrupted(data, reference, tmp_path):
    ref = reference("dlrm", "adam")
    run = str(tmp_path / "run")
    settings = dict(mode="lookahead", lookahead=4, cache_rows=1500, optimizer="adam") | ADAM_SETTINGS
    half = trained(cfg(data, run, **(settings | {"steps": 6})))  # the warm-up lasts 10 steps
    assert half["steps"] == 6
    resumed = trained(cfg(data, run, resume=True, **settings))
    assert resumed["steps_this_run"] == 34
    assert resumed["params_sha256"] == ref["params_sha256"]


def test_logged_rates_follow_the_closed_form(reference):
    """warmup-poly with W = 10, S = 20, N = 15, p = 2: the record at step k holds the rates of step t = k."""
    out = reference("dlrm", "adam")["out"]
    records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    rates = {r["step"]: (r["lr"], r["embedding_lr"]) for r in records if "lr" in r}

    def closed_form(base: float, t: int) -> float:
        if t <= 10:
            return base * t / 10
        if t < 20:
            return base
        return base * (max(0, 15 - (t - 20)) / 15) ** 2

    assert sorted(rates) == [1, 10, 20, 30, 40]
    for t, (lr, emb) in rates.items():
        assert lr == pytest.approx(closed_form(0.01, t), rel=1e-12, abs=0)
        assert emb == pytest.approx(closed_form(0.02, t), rel=1e-12, abs=0)
    assert rates[40] == (0.0, 0.0) and rates[30][0] == pytest.approx(0.01 / 9)


def max_unique_rows(data: str) -> int:
    stream = BatchStream(Dataset(data), "train", BATCH, seed=7)
    return max(len(np.unique(b.rows.numpy())) for b in stream.batches(0, STEPS))


def test_tiny_cache_forces_early_evictions_and_stays_exact(data, reference, tmp_path):
    ref = reference("dlrm", "adagrad")
    C = max_unique_rows(data) + 8
    got = trained(cfg(data, str(tmp_path / "run"), mode="lookahead", lookahead=8, cache_rows=C))
    assert got["cache"]["forced_evictions"] > 0
    assert got["cache"]["max_occupied"] <= C
    assert got["params_sha256"] == ref["params_sha256"]


def test_cache_of_exactly_one_batch(data, reference, tmp_path):
    ref = reference("deepfm", "adagrad")
    C = max_unique_rows(data)
    got = trained(cfg(data, str(tmp_path / "run"), model="deepfm", mode="lookahead", lookahead=2, cache_rows=C))
    assert got["cache"]["forced_evictions"] > 0
    assert got["params_sha256"] == ref["params_sha256"]


@pytest.mark.parametrize("store", ["memory", "disk-frequency"])
def test_lookahead_resume_matches_uninterrupted(data, reference, tmp_path, store):
    ref = reference("dlrm", "adagrad")
    run = str(tmp_path / "run")
    store, _, layout = store.partition("-")
    kw = dict(mode="lookahead", lookahead=8, cache_rows=1500, store=store) | (
        {"store_layout": layout, "store_dir": str(tmp_path / "rows")} if layout else {}
    )
    half = trained(cfg(data, run, steps=STEPS // 2, checkpoint_every=STEPS // 4, **kw))
    assert half["steps"] == STEPS // 2
    resumed = trained(cfg(data, run, resume=True, **kw))  # a --store-dir's store reopened with its own layout
    assert resumed["steps"] == STEPS and resumed["steps_this_run"] == STEPS // 2
    assert resumed["params_sha256"] == ref["params_sha256"]
    if layout:
        assert resumed["cache"]["store"]["layout"] == "frequency"
