"""Tables, targets and plots of ``bagpipe bench cluster`` (its runs are in :mod:`bagpipe.bench.scenarios.cluster.scenario`).

Per configuration (link rate, trainers, mode): the median samples/s of the repetitions
and its spread; speedups over ``nocache`` and ``lru`` at the same rate and trainers,
and the share of the ideal (N x ``--mode full`` on one process without a network);
trainer 0's step split into compute / waiting for rows / synchronisation / the rest;
bytes per step on trainer 0's, server 0's and the oracle's links (interface counters)
against the cost model's; each role's CPU (share of one core) over the measured steps;
the model's step time. Then the issue's targets, each with the figure that meets or
misses it.
"""

from __future__ import annotations

from pathlib import Path

from bagpipe.bench.harness.report import header, markdown_table, median_spread, pyplot, save_png
from bagpipe.bench.scenarios.cluster.cost_model import model_for, traffic_for
from bagpipe.bench.scenarios.cluster.settings import ClusterBench
from bagpipe.data.schema import DatasetMeta

ROLES = ("trainer 0", "server 0", "oracle")


def _split(t: dict, step_ms: float) -> dict[str, float]:
    """Trainer 0's step (ms): compute, waiting for rows, synchronisation, the rest."""
    compute = t["forward"] + t["backward"] + t["optimizer"]
    rows = t["wait_embeddings"] + t["writeback"]
    sync = t["sync_wait"]
    return {
        "compute": compute,
        "rows": rows,
        "sync": sync,
        "other": max(step_ms - compute - rows - sync, 0.0),
        "step": step_ms,
    }


def _med(values: list[float]) -> float:
    return median_spread(values)[0] if values else float("nan")


def summarise(
    b: ClusterBench, results: dict, ideal: list[dict], probes: dict, cache_rows: int, meta: DatasetMeta
) -> dict:
    ideal_sps, ideal_spread = median_spread([s["samples_per_s"] for s in ideal])
    ideal_digest = ideal[0].get("params_sha256") if ideal else None
    traffic: dict = {}
    out: dict = {}
    for (n, rate, key), runs in sorted(results.items(), key=lambda kv: (kv[0][0], -kv[0][1], kv[0][2])):
        sums = [r["summary"] for r in runs]
        sps, spread = median_spread([s["samples_per_s"] for s in sums])
        batch = b.batch_size * n
        step_ms = 1000 * batch / sps
        t = {k: _med([s["time_per_step_ms"][k] for s in sums]) for k in sums[0]["time_per_step_ms"]}
        windows = [r["window"] for r in runs if r["window"]]
        measured = {
            role: {d: _med([w["bytes_per_step"][role][d] for w in windows]) for d in ("sent", "received")}
            for role in (windows[0]["bytes_per_step"] if windows else {})
        }
        cpu = {
            role: _med([w["cpu_share"].get(role, float("nan")) for w in windows])
            for role in (windows[0]["cpu_share"] if windows else {})
        }
        cfg = runs[0]["config"]
        if (n, key) not in traffic:
            traffic[(n, key)] = traffic_for(cfg, meta, 0)  # every step, as the interface counters count them
        tr = traffic[(n, key)]
        model = model_for(cfg, tr, t, probes[rate])
        model_bytes = tr.per_link()
        out[f"{rate:g}/{n}/{key}"] = {
            "rate_mbit": rate,
            "server_rate_mbit": rate * b.server_ratio,
            "trainers": n,
            "config": key,
            "mode": cfg.cache.mode,
            "lookahead": cfg.cache.lookahead if cfg.cache.spec.looks_ahead else None,
            "samples_per_s": sps,
            "spread": spread,
            "runs": [s["samples_per_s"] for s in sums],
            "ideal_samples_per_s": n * ideal_sps,
            "share_of_ideal": sps / (n * ideal_sps) if ideal_sps else float("nan"),
            "step_ms": _split(t, step_ms),
            "embedding_share": (t["wait_embeddings"] + t["writeback"]) / step_ms,
            "bytes_per_step": measured,
            "model_bytes_per_step": model_bytes,
            "bytes_vs_model": tr.within(measured),
            "model_bytes_racing_the_reading": tr.per_link(tr.racing),
            "model": model,
            "cpu_share": cpu,
            "hit_rate": sums[0].get("cache", {}).get("hit_rate"),
            "rows_fetched_per_step": tr.rows_fetched,
            "plan_bytes": tr.plan_bytes,
            "digest_equals_full": (sums[0].get("params_sha256") == ideal_digest) if ideal_digest and n == 1 else None,
        }
    for v in out.values():  # speedups at the same rate and trainers
        for base in ("nocache", "lru"):
            ref = out.get(f"{v['rate_mbit']:g}/{v['trainers']}/{base}")
            v[f"speedup_over_{base}"] = v["samples_per_s"] / ref["samples_per_s"] if ref else None
    payload = {
        **header(b),
        "cache_rows": cache_rows,
        "total_rows": meta.total_rows,
        "ideal_samples_per_s": ideal_sps,
        "ideal_spread": ideal_spread,
        "probes_mbit": {f"{r:g}": p for r, p in probes.items()},
        "results": out,
    }
    payload["targets"] = targets(b, out)
    payload["table"] = tables(b, payload)
    return payload


def _lookahead_keys(out: dict) -> list[str]:
    return sorted(
        {v["config"] for v in out.values() if v["lookahead"] is not None}, key=lambda k: int(k.split("L")[-1])
    )


def targets(b: ClusterBench, out: dict) -> list[dict]:
    """The issue's targets, each with its figure (None where the sweep did not run what it needs)."""
    found = []
    la = _lookahead_keys(out)
    one = [v for v in out.values() if v["trainers"] == 1]
    nocache = {v["rate_mbit"]: v for v in one if v["config"] == "nocache"}
    bound = [r for r, v in nocache.items() if v["embedding_share"] >= 0.75]
    if bound and la:
        rate = max(bound)  # the fastest link at which nocache spends >= 75% of its step on embedding access
        best = max((out[f"{rate:g}/1/{k}"] for k in la), key=lambda v: v["samples_per_s"])
        found += [
            {
                "target": f"lookahead >= 2.5x nocache at {rate:g} Mbit/s (nocache {nocache[rate]['embedding_share']:.0%} on embeddings)",
                "value": best["speedup_over_nocache"],
                "met": best["speedup_over_nocache"] >= 2.5,
            },
            {
                "target": f"lookahead >= 1.3x lru at {rate:g} Mbit/s",
                "value": best["speedup_over_lru"],
                "met": best["speedup_over_lru"] is not None and best["speedup_over_lru"] >= 1.3,
            },
            {
                "target": f"lookahead within 1.25x of the ideal at {rate:g} Mbit/s",
                "value": 1 / best["share_of_ideal"],
                "met": 1 / best["share_of_ideal"] <= 1.25,
            },
        ]
    elif la:
        found.append(
            {
                "target": "a rate at which nocache spends >= 75% of its step on embedding access",
                "value": None,
                "met": False,
            }
        )
    if la and len(nocache) > 1:
        rates = sorted(nocache, reverse=True)
        sp = [max(out[f"{r:g}/1/{k}"]["speedup_over_nocache"] for k in la) for r in rates]
        found.append(
            {
                "target": "lookahead's speedup over nocache grows as the rate falls (1 trainer)",
                "value": [round(x, 2) for x in sp],
                "met": all(b2 >= a - 0.05 * a for a, b2 in zip(sp, sp[1:])),
            }
        )
    four = [v for v in out.values() if v["trainers"] == 4 and v["lookahead"] is not None]
    if four:
        best = {}
        for v in four:
            if v["speedup_over_nocache"] is not None:
                best[v["rate_mbit"]] = max(best.get(v["rate_mbit"], 0.0), v["speedup_over_nocache"])
        if best:
            rate = min(best)
            found.append(
                {
                    "target": f"4 trainers sharing one server's link: lookahead >= 3x nocache (at {rate:g} Mbit/s)",
                    "value": best[rate],
                    "met": best[rate] >= 3,
                }
            )
    worst = 0.0
    for v in out.values():
        for role, dirs in v["bytes_vs_model"].items():
            for d, ratio in dirs.items():
                if v["model_bytes_per_step"][role][d] > 10_000:  # links with traffic (not a few ACKs)
                    worst = max(worst, abs(ratio - 1))
    found.append(
        {"target": "bytes per step on each link within 10% of the cost model", "value": worst, "met": worst <= 0.10}
    )
    return found


def tables(b: ClusterBench, payload: dict) -> str:
    out = payload["results"]
    rows, rows2 = [], []
    for v in out.values():
        st = v["step_ms"]
        sx = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
        rows.append(
            [
                f"{v['rate_mbit']:g} / {v['server_rate_mbit']:g}",
                v["trainers"],
                v["config"],
                v["samples_per_s"],
                f"{v['spread']:.0%}",
                sx(v["speedup_over_nocache"]),
                sx(v["speedup_over_lru"]),
                f"{v['share_of_ideal']:.2f}",
                f"{st['compute']:.0f} / {st['rows']:.0f} / {st['sync']:.0f} / {st['other']:.0f}",
                f"{v['embedding_share']:.0%}",
                f"{v['model']['step_ms']:.0f} ({v['model']['bottleneck'] or '-'})",
            ]
        )
        m, mm = v["bytes_per_step"], v["model_bytes_per_step"]
        cells = []
        for role in ROLES:
            if role in m:
                cells.append(
                    f"{m[role]['sent'] / 1e6:.2f} / {m[role]['received'] / 1e6:.2f} "
                    f"({mm[role]['sent'] / 1e6:.2f} / {mm[role]['received'] / 1e6:.2f})"
                )
            else:
                cells.append("-")
        cpu = " / ".join(f"{v['cpu_share'].get(r, float('nan')):.2f}" for r in ROLES)
        rows2.append([f"{v['rate_mbit']:g}", v["trainers"], v["config"], *cells, cpu])
    t1 = markdown_table(
        [
            "Mbit/s trainer / server",
            "trainers",
            "mode",
            "samples/s",
            "spread",
            "vs nocache",
            "vs lru",
            "of ideal",
            "ms/step compute / rows / sync / other",
            "share on embedding access",
            "model ms/step (bottleneck)",
        ],
        rows,
    )
    t2 = markdown_table(
        [
            "Mbit/s",
            "trainers",
            "mode",
            "trainer 0 MB/step sent / received (model)",
            "server 0 (model)",
            "oracle (model)",
            "CPU cores: trainer 0 / server 0 / oracle",
        ],
        rows2,
    )
    probes = markdown_table(
        ["trainer link Mbit/s", *[f"{r} sent / received" for r in ROLES]],
        [
            [r, *[f"{p[role]['sent']:.0f} / {p[role]['received']:.0f}" for role in ROLES]]
            for r, p in payload["probes_mbit"].items()
        ],
    )
    tg = markdown_table(
        ["target", "figure", "met"],
        [
            [
                t["target"],
                "not measured"
                if t["value"] is None
                else (f"{t['value']:.2f}" if isinstance(t["value"], float) else t["value"]),
                "yes" if t["met"] else "no",
            ]
            for t in payload["targets"]
        ],
    )
    ideal = f"ideal (--mode full, one process, batch {b.batch_size}, no network): {payload['ideal_samples_per_s']:,.0f} samples/s per trainer"
    return "\n\n".join([t1, t2, "probe: achieved Mbit/s on each link under the shaping\n\n" + probes, ideal, tg])


def plot(out: Path, payload: dict) -> None:
    if "results" not in payload:
        return
    res = list(payload["results"].values())
    plt = pyplot()
    ns = sorted({v["trainers"] for v in res})
    fig, axes = plt.subplots(1, len(ns) + 1, figsize=(5 * (len(ns) + 1), 4.5), squeeze=False)
    for ax, n in zip(axes[0], ns):
        for key in sorted({v["config"] for v in res if v["trainers"] == n}):
            pts = sorted((v["rate_mbit"], v["samples_per_s"]) for v in res if v["trainers"] == n and v["config"] == key)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key)
        ax.axhline(n * payload["ideal_samples_per_s"], color="gray", linestyle="--", label="ideal (full, no network)")
        ax.set_xscale("log")
        ax.set_xlabel("trainer link, Mbit/s (servers x2.5)")
        ax.set_ylabel("samples/s")
        ax.set_title(f"{n} trainer(s), 1 embedding server")
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    la = _lookahead_keys(payload["results"])
    for rate in sorted({v["rate_mbit"] for v in res}, reverse=True):
        for base, style in (("nocache", "-"), ("lru", ":")):
            pts = []
            for n in ns:
                cands = [payload["results"].get(f"{rate:g}/{n}/{k}", {}).get(f"speedup_over_{base}") for k in la]
                cands = [c for c in cands if c]
                if cands:
                    pts.append((n, max(cands)))
            if pts:
                ax.plot(
                    [p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=f"{rate:g} Mbit/s, over {base}"
                )
    ax.set_xlabel("trainers")
    ax.set_ylabel("lookahead speedup")
    ax.set_xticks(ns)
    ax.set_title("speedup against trainers")
    ax.legend(fontsize=7)
    save_png(fig, out / "cluster.png")
