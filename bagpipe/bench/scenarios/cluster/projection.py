"""``bagpipe bench cluster --project N,...``: the paper's cluster past this machine, by the
cost model alone (no process, no network).

For every number of trainers N in ``--project``, every number of embedding servers S in
``--project-servers`` and every mode: the oracle's planner is replayed on the profile's
batches for N trainers of ``--batch-size`` each (:func:`~bagpipe.bench.scenarios.cluster.cost_model.traffic_for`,
as ``bench cluster`` models its measured points), and
:func:`~bagpipe.bench.scenarios.cluster.cost_model.predict_emulated_ms` turns the bytes of
every link into a step at the paper's undilated cluster: compute ``--gpu-step-ms`` per
2048 samples (or each of ``--project-step-ms``: one replay serves them all), a trainer's
link 10 Gbit/s, every server's and the oracle's 25 Gbit/s, each times
``--project-efficiency`` (what a TCP stream achieves of a shaped rate: the probes of
``bench cluster`` measured 0.95-0.97). The cache is sized as the sweep's for N trainers
(``--cache-fraction`` of all rows, at least one global batch of ids). The table gives samples/s, per trainer, the
share of the ideal (N x compute alone), the speedups, the share of a step on embedding
access (a synchronous mode's wait for its rows), every term of the step and which one
bounds it.
"""

from __future__ import annotations

import time
from pathlib import Path

from bagpipe.bench.harness.report import header, markdown_table, write_results
from bagpipe.bench.harness.runner import data_samples, ensure_synth
from bagpipe.bench.scenarios.cluster.cost_model import PlanTraffic, predict_emulated_ms, traffic_for
from bagpipe.bench.scenarios.cluster.settings import PAPER_CLUSTER, ClusterBench, job_config
from bagpipe.config.compute import V100_BATCH
from bagpipe.data.schema import DatasetMeta


def paper_rates(traffic: PlanTraffic, efficiency: float) -> dict[str, tuple[float, float]]:
    """Bytes/s (up, down) of every host of ``traffic`` on the paper's NICs times ``efficiency``."""
    out = {}
    for name in traffic.links:
        mbit = PAPER_CLUSTER["trainer_mbit"] if name.startswith("trainer") else PAPER_CLUSTER["server_mbit"]
        rate = mbit * 1e6 / 8 * efficiency
        out[name] = (rate, rate)
    return out


def projection_row(
    n: int, servers: int, key: str, traffic: PlanTraffic, batch: int, compute_ms: float, efficiency: float
) -> dict:
    """One projected point: ``n`` trainers of ``batch`` samples, ``servers`` servers, mode ``key``."""
    pipelined = key.startswith("lookahead")
    pred = predict_emulated_ms(traffic, paper_rates(traffic, efficiency), compute_ms, pipelined)
    step = float(pred["step_ms"])
    sps = n * batch / step * 1000
    ideal = n * batch / compute_ms * 1000
    return {
        "trainers": n,
        "servers": servers,
        "compute_ms": compute_ms,
        "config": key,
        "samples_per_s": sps,
        "per_trainer": sps / n,
        "share_of_ideal": sps / ideal,
        "model": pred,
        "rows_fetched_per_step": traffic.rows_fetched,
        "bytes_per_step": traffic.per_link(),
    }


def speedups(rows: list[dict]) -> None:
    """``speedup_over_nocache`` / ``_lru`` of every row, at the same trainers, servers and compute."""
    at = {(r["trainers"], r["servers"], r["compute_ms"], r["config"]): r for r in rows}
    for r in rows:
        for base in ("nocache", "lru"):
            ref = at.get((r["trainers"], r["servers"], r["compute_ms"], base))
            r[f"speedup_over_{base}"] = r["samples_per_s"] / ref["samples_per_s"] if ref else None


def project(b: ClusterBench) -> dict:
    """The projection's table and JSON in ``--out`` (see the module docstring)."""
    assert b.out is not None
    out = Path(b.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    top = max(b.project)
    ensure_synth(data, b.profile, data_samples(b.batch_size * top, b.steps), b.scale, seed=1)
    meta = DatasetMeta.load(data)
    computes = [ms * b.batch_size / V100_BATCH for ms in b.projected_step_ms()]
    rows = []
    caches = {}
    for n in b.project:
        caches[n] = cache_rows = b.cache_rows(meta.total_rows, b.batch_size * n * meta.num_features)
        for s in b.project_servers:
            for key, mode, L in b.configs():
                t0 = time.perf_counter()
                cfg = job_config(b.with_servers(s), data, out / "unused", n, mode, L, cache_rows)
                traffic = traffic_for(cfg, meta, b.warmup)  # the bytes do not depend on the compute
                for compute_ms in computes:
                    rows.append(projection_row(n, s, key, traffic, b.batch_size, compute_ms, b.project_efficiency))
                    print(
                        f"{n} trainers, {s} server(s), {key}, compute {compute_ms:g} ms: "
                        f"{rows[-1]['samples_per_s']:,.0f} samples/s ({rows[-1]['model']['bottleneck']}; "
                        f"replayed in {time.perf_counter() - t0:.0f} s)",
                        flush=True,
                    )
    speedups(rows)
    payload = {
        **header(b),
        "projection": rows,
        "compute_ms": computes,
        "cache_rows": caches,
        "total_rows": meta.total_rows,
        "efficiency": b.project_efficiency,
    }
    payload["table"] = projection_table(payload)
    write_results(out, "cluster", payload, payload["table"])
    return payload


def projection_table(payload: dict) -> str:
    sx = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
    rows = []
    for r in payload["projection"]:
        m = r["model"]
        rows.append(
            [
                r["trainers"],
                r["servers"],
                f"{r['compute_ms']:g}",
                r["config"],
                f"{r['samples_per_s']:,.0f}",
                f"{r['per_trainer']:,.0f}",
                f"{r['share_of_ideal']:.2f}",
                sx(r["speedup_over_nocache"]),
                sx(r["speedup_over_lru"]),
                f"{m['embedding_share']:.0%}",
                f"{m['compute_ms']:.1f} / {m['embedding_ms']:.1f} / {m['dense_ms']:.1f} "
                f"({m.get('dense_exposed_ms', m['dense_ms']):.1f}) / "
                f"{m['sync_urgent_ms']:.1f} / {m['sync_deferred_ms']:.1f}",
                f"{m['trainer_link_ms']:.1f} / {m['server_link_ms']:.1f} / {m['oracle_link_ms']:.1f}",
                f"{m['step_ms']:.1f}",
                m["bottleneck"],
            ]
        )
    computes = " / ".join(f"{ms:g}" for ms in payload["compute_ms"])
    head = (
        f"Projection by the cost model (no process ran): the paper's cluster, compute {computes} ms a step "
        f"(an assumption), trainer links 10 Gbit/s, servers and oracle 25 Gbit/s, each x {payload['efficiency']:g}; "
        f"cache (rows, by trainers) "
        f"{', '.join(f'{n}: {c:,}' for n, c in payload['cache_rows'].items())} of {payload['total_rows']:,} rows."
    )
    table = markdown_table(
        [
            "trainers",
            "servers",
            "compute ms",
            "mode",
            "samples/s",
            "per trainer",
            "of ideal",
            "vs nocache",
            "vs lru",
            "on embedding access",
            "ms: compute / embedding (sync modes) / dense all-reduce (left after the backward) / row sync urgent / deferred",
            "ms of bytes on the busiest trainer / server / oracle link",
            "ms/step",
            "bound",
        ],
        rows,
    )
    return head + "\n\n" + table
