"""``--emulate-compute`` in a real 2-trainer job (1 embedding server, the oracle, gloo on
loopback): forward and backward are a delay, the dense all-reduce still carries every
dense gradient at its real size through DDP (counted by the step's comm hook) in the
``--ddp-bucket-mb`` buckets the cost model of ``bench cluster`` counts, the row
sync its rows, the summary says the run did not train, and every process stops."""

from __future__ import annotations

import json

import pytest
from test_jobs import JOB_TIMEOUT, assert_all_stopped, bagpipe

from bagpipe.bench.scenarios.cluster.cost_model import ddp_buckets
from bagpipe.data.schema import DatasetMeta
from bagpipe.models import build_model
from bagpipe.models.config import recipe

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

STEPS, BATCH, DELAY_MS = 8, 256, 40
BUCKET_MB = 0.002  # the debug recipe's dense gradients in several buckets


def test_two_trainers_all_reduce_real_sizes_and_do_not_claim_training(tiny_data, tmp_path):
    out = tmp_path / "job"
    r = bagpipe(
        "train", "--data", tiny_data, "--out", out, "--mode", "lookahead", "--trainers", 2, "--servers", 1,
        "--steps", STEPS, "--batch-size", BATCH, "--cache-rows", 1500, "--lookahead", 4, "--threads", 1,
        "--no-progress", "--no-digest", "--eval-samples", 256, "--emulate-compute", f"{DELAY_MS}ms",
        "--ddp-bucket-mb", BUCKET_MB, timeout=JOB_TIMEOUT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["exact"] is False and s["params_sha256"] is None
    ap = s["approximation"]
    assert ap["names"] == [f"emulate-compute {DELAY_MS}ms (did not train)"]
    em = ap["emulated_compute"]
    assert em["trained"] is False and em["steps"] == STEPS
    assert em["delay_ms_per_step"] == pytest.approx(DELAY_MS)
    # DDP all-reduced every dense gradient, at its real size, every step
    meta = DatasetMeta.load(tiny_data)
    model = build_model(recipe("dlrm", "debug"), meta.num_dense, meta.num_features)
    dense = sum(p.numel() for p in model.parameters())
    assert em["dense_allreduce_bytes_per_step"] == dense * 4
    # in --ddp-bucket-mb buckets, as many as the cost model of bench cluster counts, each
    # all-reduced while the emulated backward still ran: the wait after it is a fraction of it
    buckets = ddp_buckets(model, BUCKET_MB)
    assert len(buckets) > 2
    # (DDP's first step all-reduces one bucket of everything, then it rebuilds its buckets)
    assert em["dense_allreduce_buckets_per_step"] * STEPS == 1 + (STEPS - 1) * len(buckets)
    assert 0 <= em["dense_wait_ms_per_step"] < DELAY_MS
    # the row sync got the step's rows (U x D floats), and some were synchronised between the trainers
    assert em["row_grad_bytes_per_step"] > 0
    assert s["distributed"]["trainers"] == 2 and s["distributed"]["sync_bytes_per_step"] > 0
    t = s["time_per_step_ms"]
    assert t["forward"] + t["backward"] >= DELAY_MS * 0.95
    assert_all_stopped(out)
