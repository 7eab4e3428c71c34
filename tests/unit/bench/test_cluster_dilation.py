"""``bench cluster --dilation k``: the paper's cluster k times slower (every link and the
emulated compute), and the starved-role check that invalidates a figure."""

from __future__ import annotations

import os

import pytest

from bagpipe.bench.scenarios.cluster.report import _validity, dilation_line, dilation_section, starved_roles
from bagpipe.bench.scenarios.cluster.scenario import run_queue_wait_s
from bagpipe.bench.scenarios.cluster.settings import PAPER_CLUSTER, ClusterBench
from bagpipe.config.compute import V100_STEP_MS, parse_compute
from bagpipe.errors import ConfigError

pytestmark = pytest.mark.unit


def _bench(**kw) -> ClusterBench:
    return ClusterBench(out="unused", **kw)


@pytest.mark.parametrize("k", [1.0, 10.0, 100.0, 400.0])
def test_k_scales_every_link_and_the_compute(k):
    b = _bench(dilation=k, batch_size=2048, trainers=(8,))
    (rate,) = b.link_rates()
    assert rate == pytest.approx(10_000 / k)  # a trainer's NIC: 10 Gbit/s / k
    assert rate * b.server_ratio == pytest.approx(25_000 / k)  # the server's and the oracle's: 25 Gbit/s / k
    assert b.compute_ms() == pytest.approx(V100_STEP_MS * k)  # k x the V100's step of 2048 samples
    # what the trainers are told to emulate is the same delay
    spec = b.emulated_compute()
    assert spec is not None
    assert parse_compute(spec).seconds(2048) * 1000 == pytest.approx(b.compute_ms())
    d = dilation_section(b)
    assert (d["k"], d["trainer_mbit"], d["server_mbit"]) == (k, pytest.approx(10_000 / k), pytest.approx(25_000 / k))
    assert d["off_profile"] == ["L 20/60 (paper 200)", "tables at 0.25 of their cardinality"]
    assert f"k = {k:g}" in dilation_line(d)


def test_the_ratios_of_compute_and_links_do_not_depend_on_k():
    a, z = _bench(dilation=10.0), _bench(dilation=300.0)
    assert a.compute_ms() * a.link_rates()[0] == pytest.approx(z.compute_ms() * z.link_rates()[0])


def test_compute_scales_with_the_batch_and_the_assumed_gpu_step():
    b = _bench(dilation=50.0, batch_size=1024, gpu_step_ms=20.0)
    assert b.compute_ms() == pytest.approx(20.0 * 50 / 2)
    spec = b.emulated_compute()
    assert spec is not None and spec.endswith("us/sample")
    assert parse_compute(spec).seconds(1024) * 1000 == pytest.approx(b.compute_ms())
    assert _bench().link_rates() == ClusterBench.rates and _bench().emulated_compute() is None
    # the report names where the step time came from: the given one is not the module's assumption
    assert b.gpu_step_source().startswith("--gpu-step-ms")
    assert "V100_STEP_MS" in _bench(dilation=50.0).gpu_step_source()


def test_the_paper_profile_off_nothing():
    p = PAPER_CLUSTER
    b = _bench(
        dilation=100.0,
        trainers=(1, 2, 4, 8),
        batch_size=p["batch_size"],
        embedding_dim=p["embedding_dim"],
        large_lookahead=p["lookahead"],
        scale=1.0,
    )
    assert b.off_profile() == []


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(dilation=-1.0), "--dilation must be >= 0"),
        (dict(dilation=10.0, rates=(30.0,)), "--rates is set by --dilation"),
        (dict(dilation=10.0, server_ratio=3.0), "--server-ratio is the paper's 2.5"),
        (dict(dilation=10.0, digest=True), "--digest does not apply to --dilation"),
        (dict(gpu_step_ms=20.0), "--gpu-step-ms applies to --dilation k > 0 or --project"),
        (dict(dilation=10.0, gpu_step_ms=0.0), "--gpu-step-ms must be > 0"),
        (dict(starved_share=0.0), "--starved-share must be in"),
        (dict(ddp_bucket_mb=-0.5), r"--ddp-bucket-mb must be MiB in \[0, 1024\]"),
        (dict(ddp_bucket_mb=2048.0), r"--ddp-bucket-mb must be MiB in \[0, 1024\]"),
        (dict(ddp_bucket_mb=float("nan")), "ddp_bucket_mb must be a finite number, got nan"),
        (dict(congestion_control="vegas2"), "--congestion-control must be inherit or one this kernel offers"),
    ],
)
def test_refusals(settings, message):
    with pytest.raises(ConfigError, match=message) as e:
        _bench(**settings)
    assert "\n" not in str(e.value)


def test_a_role_over_the_run_queue_threshold_makes_the_figure_invalid():
    waits = {"trainer 0": 0.02, "trainer 1": 0.31, "server 0": 0.12, "oracle": 0.0}
    assert starved_roles(waits, 0.10) == ["trainer 1", "server 0"]
    assert starved_roles(waits, 0.5) == []
    v = {"valid": False, "starved": ["trainer 1", "server 0"], "run_queue_share": waits}
    assert _validity(v) == "INVALID: trainer 1 starved (31% on a run queue)"
    assert _validity({"valid": True}) == "yes" and _validity({"valid": None}) == "not measured"


def test_run_queue_wait_is_read_from_schedstat():
    mine = run_queue_wait_s(os.getpid())
    if mine is None:
        pytest.skip("this kernel keeps no schedstat")
    assert mine >= 0
    assert run_queue_wait_s(2**22 + 12345) is None  # no such process


def test_the_report_names_the_congestion_control_an_inheriting_sweep_ran():
    assert _bench().congestion_label() == "cubic"
    machine = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
    assert _bench(congestion_control="inherit").congestion_label() == f"inherit: {machine}"
