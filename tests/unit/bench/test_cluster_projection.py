"""``bench cluster``'s cost model with a known compute (``--dilation``) and its projection
past this machine (``--project``): the step's terms against hand-computed cases, the
projection's arithmetic, and trainer 0's bytes split by what they are."""

from __future__ import annotations

import pytest

from bagpipe.bench.scenarios.cluster.cost_model import (
    PARTS,
    Direction,
    Link,
    PlanTraffic,
    predict_emulated_ms,
    predict_step_ms,
)
from bagpipe.bench.scenarios.cluster.projection import paper_rates, projection_row, speedups
from bagpipe.bench.scenarios.cluster.settings import ClusterBench
from bagpipe.errors import ConfigError

pytestmark = pytest.mark.unit


def _link(up: float, down: float) -> Link:
    """A link of ``up`` / ``down`` bytes a step and no frames (so its wire bytes are exactly these)."""
    return Link(Direction(payload=up), Direction(payload=down))


def _traffic(server_up: float = 16_000) -> PlanTraffic:
    parts = {
        "embedding": _link(2_000, 8_000),
        "dense": _link(5_000, 5_000),
        "sync_urgent": _link(3_000, 3_000),
        "sync_deferred": _link(4_000, 4_000),
    }
    links = {
        "trainer 0": _link(14_000, 20_000),
        "trainer 1": _link(14_000, 20_000),
        "server 0": _link(server_up, 4_000),
        "oracle": _link(1_000, 0),
    }
    return PlanTraffic(links, {}, rows_fetched=10.0, rows_written=5.0, plan_bytes=100.0, parts=parts)


RATES = {"trainer 0": (1e6, 1e6), "trainer 1": (1e6, 1e6), "server 0": (2e6, 2e6), "oracle": (2e6, 2e6)}


def test_pipelined_step_is_compute_then_the_all_reduces():
    # max(compute 12, deferred 4) + dense 5 + urgent 3 = 20 ms; trainer 0's link carries
    # 20,000 B down at 1 MB/s = 20 ms too, the server 8 ms, the oracle 0.5 ms
    p = predict_emulated_ms(_traffic(), RATES, compute_ms=12.0, pipelined=True)
    assert p["step_ms"] == pytest.approx(20.0)
    assert (p["dense_ms"], p["sync_urgent_ms"], p["sync_deferred_ms"]) == pytest.approx((5.0, 3.0, 4.0))
    assert (p["trainer_link_ms"], p["server_link_ms"], p["oracle_link_ms"]) == pytest.approx((20.0, 8.0, 0.5))
    assert p["embedding_ms"] == 0.0 and p["bottleneck"] == "compute"


def test_synchronous_step_waits_for_its_rows_in_turn():
    # rows: 2,000 B up + 8,000 B down at 1 MB/s, in turn = 10 ms (> the server's 8 ms);
    # max(10 + 12, 4) + 5 + 3 = 30 ms, a third of it on embedding access
    p = predict_emulated_ms(_traffic(), RATES, compute_ms=12.0, pipelined=False)
    assert p["embedding_ms"] == pytest.approx(10.0)
    assert p["step_ms"] == pytest.approx(30.0)
    assert p["embedding_share"] == pytest.approx(1 / 3)
    assert p["bottleneck"] == "compute"


def test_a_saturated_server_link_bounds_both():
    # 400,000 B a step out of the server at 2 MB/s: 200 ms, above lookahead's chain
    t = _traffic(server_up=400_000)
    p = predict_emulated_ms(t, RATES, compute_ms=12.0, pipelined=True)
    assert p["step_ms"] == pytest.approx(200.0)
    assert p["bottleneck"] == "server link"
    # the synchronous baseline waits for the server's link, what it receives (4,000 B: 2 ms)
    # and then what it sends (200 ms), then computes: 202 + 12 + 5 + 3
    p = predict_emulated_ms(t, RATES, compute_ms=12.0, pipelined=False)
    assert p["embedding_ms"] == pytest.approx(202.0)
    assert p["server_link_ms"] == pytest.approx(202.0)
    assert p["step_ms"] == pytest.approx(222.0)
    assert p["bottleneck"] == "embedding access"


def test_a_synchronous_servers_write_backs_come_before_its_replies():
    # 100,000 B each way at 2 MB/s: 50 ms when both directions run at once (lookahead's
    # write-backs and prefetches of different steps), 100 ms in turn (a synchronous mode's
    # reads are held until every trainer's write-back is in)
    t = _traffic()
    t.links["server 0"] = _link(100_000, 100_000)
    pipelined = predict_emulated_ms(t, RATES, compute_ms=12.0, pipelined=True)
    synchronous = predict_emulated_ms(t, RATES, compute_ms=12.0, pipelined=False)
    assert pipelined["server_link_ms"] == pytest.approx(50.0)
    assert synchronous["server_link_ms"] == pytest.approx(100.0)
    assert synchronous["embedding_ms"] == pytest.approx(100.0)  # above trainer 0's own 10 ms of rows
    assert synchronous["step_ms"] == pytest.approx(100.0 + 12.0 + 5.0 + 3.0)
    assert synchronous["embedding_share"] == pytest.approx(100.0 / 120.0)
    # trainers' links are never taken in turn: a collective sends and receives at once
    assert synchronous["trainer_link_ms"] == pytest.approx(20.0)


def test_measured_compute_synchronous_step_waits_for_the_server_in_turn():
    # the model of an undilated run (its compute measured): trainer 0's 34,000 B in turn at
    # 1 MB/s = 34 ms; the server's 100,000 B each way at 2 MB/s, in turn, 100 ms
    t = _traffic()
    t.links["server 0"] = _link(100_000, 100_000)
    p = predict_step_ms(t, RATES, compute_ms=12.0, pipelined=False)
    assert p["step_ms"] == pytest.approx(12.0 + 100.0)
    assert p["slowest_link_ms"] == pytest.approx(100.0)
    # a light server: trainer 0's own transfers bind, 12 + 34
    assert predict_step_ms(_traffic(), RATES, compute_ms=12.0, pipelined=False)["step_ms"] == pytest.approx(46.0)
    # pipelined: the server's directions at once (50 ms) against the compute
    assert predict_step_ms(t, RATES, compute_ms=12.0, pipelined=True)["step_ms"] == pytest.approx(50.0)


def test_a_long_deferred_sync_is_waited_for():
    # deferred 40,000 B at 1 MB/s = 40 ms > compute 12: max(12, 40) + 5 + 3 = 48
    t = _traffic()
    t.parts["sync_deferred"] = _link(40_000, 40_000)
    t.links["trainer 0"] = _link(52_000, 56_000)
    p = predict_emulated_ms(t, RATES, compute_ms=12.0, pipelined=True)
    assert p["step_ms"] == pytest.approx(56.0)  # the trainer's link (56,000 B down) binds
    assert p["bottleneck"] == "trainer link"


def test_projection_row_and_speedups_by_hand():
    # efficiency 0.0008: a trainer's 10 Gbit/s becomes 1 MB/s, the 25 Gbit/s 2.5 MB/s
    t = _traffic()
    rates = paper_rates(t, 0.0008)
    assert rates["trainer 0"] == pytest.approx((1e6, 1e6)) and rates["server 0"] == pytest.approx((2.5e6, 2.5e6))
    la = projection_row(4, 1, "lookahead-L20", t, batch=2048, compute_ms=12.0, efficiency=0.0008)
    no = projection_row(4, 1, "nocache", t, batch=2048, compute_ms=12.0, efficiency=0.0008)
    # lookahead: 20 ms (as above: the server's 16,000 B at 2.5 MB/s is 6.4 ms)
    assert la["model"]["step_ms"] == pytest.approx(20.0)
    assert la["samples_per_s"] == pytest.approx(4 * 2048 / 0.020)
    assert la["per_trainer"] == pytest.approx(2048 / 0.020)
    assert la["share_of_ideal"] == pytest.approx(12.0 / 20.0)
    # nocache: embedding max(10, 6.4) = 10 -> 30 ms
    assert no["model"]["step_ms"] == pytest.approx(30.0)
    rows = [la, no]
    speedups(rows)
    assert la["speedup_over_nocache"] == pytest.approx(1.5)
    assert no["speedup_over_nocache"] == pytest.approx(1.0)
    assert la["speedup_over_lru"] is None


def test_speedups_compare_points_of_the_same_compute():
    # one traffic projected at two compute times (--project-step-ms): each mode is compared
    # with nocache at its own compute, and a shorter compute puts more of nocache's step on
    # embedding access (its wait for rows, 10 ms, does not shrink with the compute)
    t = _traffic()
    rows = [
        projection_row(4, 1, key, t, batch=2048, compute_ms=ms, efficiency=0.0008)
        for ms in (12.0, 2.0)
        for key in ("lookahead-L20", "nocache")
    ]
    speedups(rows)
    la12, no12, la2, no2 = rows
    assert (la12["compute_ms"], la2["compute_ms"]) == (12.0, 2.0)
    assert la12["speedup_over_nocache"] == pytest.approx(30.0 / 20.0)
    # compute 2: lookahead max(2, 4) + 5 + 3 = 12 ms, its link's 20 ms binds; nocache 10 + 2 + 5 + 3 = 20
    assert la2["model"]["step_ms"] == pytest.approx(20.0) and no2["model"]["step_ms"] == pytest.approx(20.0)
    assert la2["speedup_over_nocache"] == pytest.approx(1.0)
    assert no2["model"]["embedding_share"] == pytest.approx(10.0 / 20.0)
    assert no12["model"]["embedding_share"] == pytest.approx(10.0 / 30.0)


def test_the_table_has_a_row_per_compute_with_its_share_on_embedding_access():
    from bagpipe.bench.scenarios.cluster.projection import projection_table

    t = _traffic()
    rows = [projection_row(4, 1, "nocache", t, batch=2048, compute_ms=ms, efficiency=0.0008) for ms in (12.0, 2.0)]
    speedups(rows)
    table = projection_table(
        {"projection": rows, "compute_ms": [12.0, 2.0], "efficiency": 0.0008, "cache_rows": {4: 10}, "total_rows": 100}
    )
    assert "compute 12 / 2 ms a step" in table
    body = [line for line in table.splitlines() if line.startswith("| 4 |")]
    assert [line.split(" | ")[2] for line in body] == ["12", "2"]
    assert "| 33% |" in body[0] and "| 50% |" in body[1]  # 10 ms of rows in a 30 and a 20 ms step


def test_the_projected_step_times():
    assert ClusterBench(out="unused", project=(8,)).projected_step_ms() == (13.0,)
    assert ClusterBench(out="unused", project=(8,), gpu_step_ms=4.0).projected_step_ms() == (4.0,)
    assert ClusterBench(out="unused", project=(8,), project_step_ms=(2.0, 13.0)).projected_step_ms() == (2.0, 13.0)


def test_trainer_0s_parts_sum_to_its_link(tmp_path):
    from bagpipe.bench.harness.runner import ensure_synth
    from bagpipe.bench.scenarios.cluster.cost_model import traffic_for
    from bagpipe.bench.scenarios.cluster.settings import job_config
    from bagpipe.data.schema import DatasetMeta

    b = ClusterBench(out=str(tmp_path), profile="tiny", scale=1.0, batch_size=64, steps=6, warmup=2, recipe="debug")
    data = tmp_path / "data"
    ensure_synth(data, "tiny", 1000, 1.0, seed=1, progress=False)
    meta = DatasetMeta.load(data)
    for mode, L in (("nocache", 1), ("lookahead", 4)):
        cfg = job_config(b.with_servers(2), data, tmp_path / "run", 2, mode, L, cache_rows=2000)
        t = traffic_for(cfg, meta, b.warmup)
        assert set(t.parts) == set(PARTS)
        whole = t.links["trainer 0"]
        for d in ("up", "down"):
            assert sum(getattr(p, d).payload for p in t.parts.values()) == pytest.approx(getattr(whole, d).payload)
            assert sum(getattr(p, d).segments for p in t.parts.values()) == pytest.approx(getattr(whole, d).segments)
        assert t.parts["dense"].up.payload > 0 and t.parts["embedding"].down.payload > 0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(project=(0,)), "--project must be numbers of trainers"),
        (dict(project=(8,), project_servers=(0,)), "--project-servers must be numbers of servers"),
        (dict(project=(8,), project_efficiency=1.5), "--project-efficiency must be in"),
        (dict(project=(8,), project_step_ms=(2.0, 0.0)), "--project-step-ms must be step times in ms, each > 0"),
        (dict(project=(8,), project_step_ms=(float("nan"),)), "project_step_ms must be a finite number, got nan"),
        (dict(project_step_ms=(2.0,)), "--project-step-ms applies to --project"),
        (
            dict(project=(8,), project_step_ms=(2.0,), gpu_step_ms=4.0),
            "--gpu-step-ms is replaced by --project-step-ms: give one of the two",
        ),
    ],
)
def test_projection_refusals(settings, message):
    with pytest.raises(ConfigError, match=message):
        ClusterBench(out="unused", **settings)


def test_the_owner_exchange_bytes_are_its_plans_counts():
    """--cache-sync owner: trainer 0's messages are its plan's all-to-all counts (gradients D
    floats a row, rows D + S), the deferred half's rows counted as waited for."""
    import numpy as np

    from bagpipe.bench.scenarios.cluster.cost_model import exchange_messages
    from bagpipe.distributed.partition import TrainerPlan

    N, D, S = 3, 4, 1
    p = TrainerPlan(
        step=0,
        batch=None,  # type: ignore[arg-type]
        rows=np.zeros(0, np.int64),
        slots=np.zeros(0, np.int64),
        inverse=np.zeros(0, np.int64),
        num_trainers=N,
        red_send_counts=np.array([0, 2, 0, 0, 0, 5]),  # urgent: 2 gradients to trainer 1; deferred: 5 to trainer 2
        red_recv_counts=np.array([0, 0, 3, 0, 0, 0]),
        dlv_send_counts=np.array([0, 0, 0, 0, 1, 0]),  # deferred: 1 row to trainer 1
        dlv_recv_counts=np.array([0, 4, 0, 0, 0, 0]),
    )
    got: dict[str, list] = {}
    for part, (sent, received) in exchange_messages(p, D, S):
        got.setdefault(part, [[], []])
        got[part][0] += sent
        got[part][1] += received
    assert got["sync_urgent"] == [[2 * D * 4, 1 * (D + S) * 4], [3 * D * 4, 4 * (D + S) * 4]]
    assert got["sync_deferred"] == [[5 * D * 4], []]


def test_dense_buckets_ready_during_the_backward_hide_all_but_the_last():
    # compute 12 ms: forward 4, backward 4 -> 12; dense 5 ms in two buckets of 4 and 1 ms,
    # ready at a quarter and at the end of the backward; no deferred sync
    t = _traffic()
    t.parts["sync_deferred"] = _link(0, 0)
    t.dense_buckets = [(0.25, 0.8), (1.0, 0.2)]
    p = predict_emulated_ms(t, RATES, compute_ms=12.0, pipelined=True)
    # bucket 1: ready at 4 + 2 = 6, done at 10; bucket 2: ready at 12, done at 13; + urgent 3
    assert p["dense_exposed_ms"] == pytest.approx(1.0)
    assert p["step_ms"] == pytest.approx(20.0)  # the trainer's link (20,000 B down at 1 MB/s) still binds
    t.links["trainer 0"] = _link(1_000, 1_000)
    t.links["trainer 1"] = _link(1_000, 1_000)
    assert predict_emulated_ms(t, RATES, compute_ms=12.0, pipelined=True)["step_ms"] == pytest.approx(16.0)
    # a first bucket that takes longer than the backward left holds the last one back
    t.dense_buckets = [(0.25, 0.8), (0.5, 0.2)]
    t.parts["dense"] = _link(20_000, 20_000)  # 20 ms: 16 + 4
    p = predict_emulated_ms(t, RATES, compute_ms=12.0, pipelined=True)
    assert p["dense_exposed_ms"] == pytest.approx(6 + 16 + 4 - 12)
    assert p["step_ms"] == pytest.approx(26.0 + 3.0)


def test_ddp_buckets_follow_the_reverse_parameter_order_and_the_caps():
    import torch

    from bagpipe.bench.scenarios.cluster.cost_model import ddp_buckets

    # parameters of 1 MiB, 0.5 MiB and 0.25 MiB (float32), registered in that order
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(n)) for n in (262_144, 131_072, 65_536)])
    total = 262_144 + 131_072 + 65_536
    # DDP's default: the first bucket closes at 1 MiB (all three), none left
    assert ddp_buckets(model, 0) == [(1.0, total)]
    # 0.25 MiB buckets: one per parameter, the smallest (registered last) first
    assert ddp_buckets(model, 0.25) == [
        (65_536 / total, 65_536),
        ((65_536 + 131_072) / total, 131_072),
        (1.0, 262_144),
    ]
    # 0.5 MiB: the two smaller ones share a bucket
    assert ddp_buckets(model, 0.5) == [((65_536 + 131_072) / total, 65_536 + 131_072), (1.0, 262_144)]
