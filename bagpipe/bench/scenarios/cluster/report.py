"""Tables, targets and plots of ``bagpipe bench cluster`` (its runs are in :mod:`bagpipe.bench.scenarios.cluster.scenario`).

Per configuration (link rate, trainers, mode): the median samples/s of the repetitions
and its spread; speedups over ``nocache`` and ``lru`` at the same rate and trainers,
and the share of the ideal (N x ``--mode full`` on one process without a network);
trainer 0's step split into compute / waiting for rows / synchronisation / the rest;
bytes per step on trainer 0's, server 0's and the oracle's links (interface counters)
against the cost model's; each role's CPU (share of one core) over the measured steps;
the model's samples/s beside the measured (their ratio) and what bounds the model's
step. Then the issue's targets, each with the figure that meets or misses it (with
``--dilation``, issue 31's acceptance: :func:`scaling_targets`).

A configuration whose role waited on a run queue for more than ``--starved-share`` of
the measured wall time (starved of CPU: its figures are this machine's, not the
cluster's) is marked invalid. With ``--dilation k`` the payload and the tables state k,
the emulated compute, the link rates it implies and what the sweep ran differently
from the paper's cluster.
"""

from __future__ import annotations

from pathlib import Path

from bagpipe.bench.harness.report import header, markdown_table, median_spread, percent, pyplot, save_png
from bagpipe.bench.scenarios.cluster.cost_model import model_for, traffic_for
from bagpipe.bench.scenarios.cluster.settings import PAPER_CLUSTER, ClusterBench
from bagpipe.bench.scenarios.cluster.tcp import tcp_cell, tcp_medians
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


def _bytes_medians(windows: list[dict], key: str) -> dict[str, dict[str, float]]:
    """Every host's bytes a step (the windows' ``key``), median over repetitions; {} if absent."""
    return {
        role: {d: _med([w[key][role][d] for w in windows]) for d in ("sent", "received")}
        for role in (windows[0].get(key, {}) if windows else {})
    }


def _med(values: list[float]) -> float:
    return median_spread(values)[0] if values else float("nan")


def summarise(
    b: ClusterBench, results: dict, ideal: list[dict], probes: dict, cache_rows: int, meta: DatasetMeta
) -> dict:
    ideal_sps, ideal_spread = median_spread([s["samples_per_s"] for s in ideal])
    ideal_digest = ideal[0].get("params_sha256") if ideal else None
    traffic: dict = {}
    measured_steps: dict = {}
    out: dict = {}
    for (n, rate, key), runs in sorted(results.items(), key=lambda kv: (kv[0][0], -kv[0][1], kv[0][2])):
        sums = [r["summary"] for r in runs]
        sps, spread = median_spread([s["samples_per_s"] for s in sums])
        batch = b.batch_size * n
        step_ms = 1000 * batch / sps
        t = {k: _med([s["time_per_step_ms"][k] for s in sums]) for k in sums[0]["time_per_step_ms"]}
        windows = [r["window"] for r in runs if r["window"]]
        measured = _bytes_medians(windows, "bytes_per_step")
        cpu = {
            role: _med([w["cpu_share"].get(role, float("nan")) for w in windows])
            for role in (windows[0]["cpu_share"] if windows else {})
        }
        waits = {
            role: max(w.get("run_queue_share", {}).get(role, 0.0) for w in windows)
            for role in (windows[0].get("run_queue_share", {}) if windows else {})
        }
        after_warmup = _bytes_medians(windows, "bytes_per_measured_step")
        starved = starved_roles(waits, b.starved_share)
        cfg = runs[0]["config"]
        if (n, key) not in traffic:
            traffic[(n, key)] = traffic_for(cfg, meta, 0)  # every step, as the interface counters count them
            # the measured steps' bytes (after the warm-up, as samples/s is): the step time of a
            # dilated run, and the bytes of the steps after the warm-up of any run
            measured_steps[(n, key)] = traffic_for(cfg, meta, b.warmup)
        tr = traffic[(n, key)]
        model = model_for(cfg, measured_steps[(n, key)] if b.dilation else tr, t, probes[rate])
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
            "bytes_per_measured_step": after_warmup,
            "bytes_vs_model_measured_steps": measured_steps[(n, key)].within(after_warmup) if after_warmup else {},
            "model": model,
            "model_samples_per_s": model["samples_per_s"],
            "vs_model": sps / model["samples_per_s"] if model["samples_per_s"] else float("nan"),
            "cpu_share": cpu,
            "run_queue_share": waits,
            "tcp": tcp_medians(windows),
            "starved": starved,
            "valid": not starved if waits else None,
            "hit_rate": sums[0].get("cache", {}).get("hit_rate"),
            "dense_wait_ms": _med(
                [
                    (s.get("approximation") or {})
                    .get("emulated_compute", {})
                    .get("dense_wait_ms_per_step", float("nan"))
                    for s in sums
                ]
            ),
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
    if b.dilation:
        payload["dilation"] = dilation_section(b)
    payload["targets"] = targets(b, out) + (scaling_targets(out, b.warmup) if b.dilation else [])
    payload["table"] = tables(b, payload)
    return payload


def starved_roles(waits: dict[str, float], threshold: float) -> list[str]:
    """The roles that waited on a run queue for more than ``threshold`` of the wall time, worst first."""
    return sorted((r for r, x in waits.items() if x > threshold), key=lambda r: -waits[r])


def dilation_section(b: ClusterBench) -> dict:
    """k and what it implies: the emulated compute and every link k times slower than the paper's."""
    rate = b.link_rates()[0]
    return {
        "k": b.dilation,
        "gpu_step_ms": b.gpu_step_ms,
        "gpu_step_ms_source": b.gpu_step_source(),
        "emulate_compute": b.emulated_compute(),
        "compute_ms_per_step": b.compute_ms(),
        "paper_trainer_mbit": PAPER_CLUSTER["trainer_mbit"],
        "paper_server_mbit": PAPER_CLUSTER["server_mbit"],
        "ddp_bucket_mb": b.ddp_bucket_mb,
        "trainer_mbit": rate,
        "server_mbit": rate * b.server_ratio,
        "off_profile": b.off_profile(),
    }


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


MODEL_TOLERANCE = 0.15
"""A measured point agrees with the cost model when within this fraction of its samples/s."""


def scaling_targets(out: dict, warmup: int) -> list[dict]:
    """Issue 31's acceptance at the paper's profile (``--dilation``): nocache's share of
    its step on embedding access, lookahead against nocache, lru and the ideal and its
    weak scaling at the most trainers the sweep ran, every point against the model."""
    found: list[dict] = []
    la = _lookahead_keys(out)
    ns = sorted({v["trainers"] for v in out.values()})
    top = ns[-1] if ns else 0
    at = {(v["trainers"], v["config"]): v for v in out.values()}

    def best(n: int) -> dict | None:
        cands = [at[(n, k)] for k in la if (n, k) in at]
        return max(cands, key=lambda v: v["samples_per_s"]) if cands else None

    nocache = [v for v in out.values() if v["config"] == "nocache"]
    if nocache:
        share = min(v["embedding_share"] for v in nocache)
        found.append(
            {
                "target": "nocache spends >= 70% of its step on embedding access (least of its points)",
                "value": share,
                "met": share >= 0.70,
            }
        )
    b = best(top)
    if b is not None:
        for base, x in (("nocache", 3.0), ("lru", 1.5)):
            v = b[f"speedup_over_{base}"]
            found.append(
                {"target": f"{top} trainers: lookahead >= {x:g}x {base}", "value": v, "met": v is not None and v >= x}
            )
        found.append(
            {
                "target": f"{top} trainers: lookahead within 1.3x of the ideal (after {warmup} warm-up steps)",
                "value": 1 / b["share_of_ideal"],
                "met": 1 / b["share_of_ideal"] <= 1.3,
            }
        )
        one = best(1)
        if one is not None and top > 1:
            eff = (b["samples_per_s"] / top) / one["samples_per_s"]
            found.append(
                {
                    "target": f"lookahead weak-scaling efficiency, {top} trainers against 1, >= 0.8",
                    "value": eff,
                    "met": eff >= 0.8,
                }
            )
    worst = max((abs(v["vs_model"] - 1) for v in out.values()), default=0.0)
    found.append(
        {
            "target": f"every point within {MODEL_TOLERANCE:.0%} of the cost model's samples/s",
            "value": worst,
            "met": worst <= MODEL_TOLERANCE,
        }
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
                percent(v["spread"]),
                sx(v["speedup_over_nocache"]),
                sx(v["speedup_over_lru"]),
                f"{v['share_of_ideal']:.2f}",
                f"{st['compute']:.0f} / {st['rows']:.0f} / {st['sync']:.0f} / {st['other']:.0f}",
                _dense_wait(v),
                _share(v),
                f"{v['model_samples_per_s']:,.0f} ({v['vs_model']:.2f}; {v['model']['bottleneck'] or '-'})",
                _validity(v),
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
        others = [x for r, x in v["cpu_share"].items() if r.startswith("trainer") and r != "trainer 0"]
        cpu += f" / {max(others):.2f}" if others else " / -"
        waits = v.get("run_queue_share") or {}
        worst = max(waits, key=lambda r: waits[r]) if waits else None
        wait = f"{waits[worst]:.0%} ({worst})" if worst else "not measured"
        rows2.append([f"{v['rate_mbit']:g}", v["trainers"], v["config"], *cells, cpu, wait, tcp_cell(v)])
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
            "dense all-reduce after the backward, ms (model)",
            "share on embedding access (model)",
            "model samples/s (measured / model; bound)",
            "valid",
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
            "CPU cores: trainer 0 / server 0 / oracle / busiest other trainer",
            f"run-queue wait, worst role (starved above {b.starved_share:.0%})",
            "TCP segments sent again: trainer 0 / server 0 / worst host; most retransmission timeouts a step",
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
    probes = f"probe: achieved Mbit/s on each link under the shaping (TCP: {b.congestion_label()})\n\n" + probes
    parts = [t1, t2, probes, ideal, tg]
    if "dilation" in payload:
        parts[3] = (
            f"ideal (the emulated compute alone, batch {b.batch_size}): "
            f"{payload['ideal_samples_per_s']:,.0f} samples/s per trainer"
        )
        parts.insert(0, dilation_line(payload["dilation"]))
    return "\n\n".join(parts)


def dilation_line(d: dict) -> str:
    """One paragraph: k, the emulated compute and the links it implies, what differs from the paper."""
    off = "; ".join(d["off_profile"]) or "none"
    return (
        f"dilation k = {d['k']:g}: the paper's cluster {d['k']:g} times slower. Compute emulated "
        f"(--emulate-compute {d['emulate_compute']}): {d['compute_ms_per_step']:.0f} ms a step "
        f"= k x {d['gpu_step_ms']:g} ms per 2048 samples ({d['gpu_step_ms_source']}); links: trainer "
        f"{d['paper_trainer_mbit']:,.0f} / k = {d['trainer_mbit']:g} Mbit/s, server and oracle "
        f"{d['paper_server_mbit']:,.0f} / k = {d['server_mbit']:g} Mbit/s. Off the paper's profile: {off}. "
        "Runs with emulated compute do not train (summary exact false). Dense gradients all-reduced in "
        + (
            f"{d['ddp_bucket_mb']:g} MiB buckets"
            if d.get("ddp_bucket_mb")
            else "DDP's default buckets (1 MiB, then 25 MiB)"
        )
        + " while the emulated backward runs."
    )


def _dense_wait(v: dict) -> str:
    """The dense all-reduce trainer 0 waited for after its emulated backward, and the model's."""
    got, model = v.get("dense_wait_ms", float("nan")), v["model"].get("dense_exposed_ms")
    if got != got:  # NaN: real compute, not measured apart
        return "-"
    return f"{got:.0f}" + ("" if model is None else f" ({model:.0f})")


def _share(v: dict) -> str:
    model = v["model"].get("embedding_share")
    return f"{v['embedding_share']:.0%}" + ("" if model is None else f" ({model:.0%})")


def _validity(v: dict) -> str:
    if v.get("valid") is None:
        return "not measured"
    if v["valid"]:
        return "yes"
    worst = v["starved"][0]
    return f"INVALID: {worst} starved ({v['run_queue_share'][worst]:.0%} on a run queue)"


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
