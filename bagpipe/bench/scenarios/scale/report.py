"""The figures, targets, table and plot of ``bagpipe bench scale`` (:mod:`bagpipe.bench.scenarios.scale.scenario`).

Per configuration, over its repetitions: samples/s (median of the runs that finished,
and which failed and why), ratios to full, nocache and lru, the share of nocache's step
spent waiting for rows, bytes read per step, the group's peak against its limit, the
largest dirty / writeback figures its memory.stat showed, the trainer's anonymous
memory at step 100 (a shorter run's last) and at its last step, OOM kills (failed runs
included), hit rate and digest; above the table, the row layout of the store's table
file (--store-layout). A configuration none of whose runs finished shows ``failed: why`` in place of
every figure that would need a finished run.
"""

from __future__ import annotations

from pathlib import Path

from bagpipe.bench.harness.report import (
    header,
    markdown_table,
    median_spread,
    percent,
    pipeline_cpu,
    pyplot,
    save_png,
    stacked_step_times,
    step_times,
)

#: memory.stat samples kept per run in results.json (evenly thinned).
SERIES_POINTS = 400
#: Targets of issue 21 (docs/beyond-memory.md).
DIRTY_BOUND_MB = 64
FLAT = 0.05
READS_SHARE = 0.30


def thin(series: list[dict], points: int = SERIES_POINTS) -> list[dict]:
    """At most ``points`` samples of a series, evenly spaced (the last one kept)."""
    if len(series) <= points:
        return series
    step = len(series) / points
    return [series[int(i * step)] for i in range(points)] + [series[-1]]


def anon_at(summary: dict, step: int) -> float | None:
    """The trainer's anonymous MiB recorded nearest ``step`` (its summary's memory.by_step)."""
    points = ((summary.get("memory") or {}).get("by_step")) or []
    if not points:
        return None
    return min(points, key=lambda p: abs(p[0] - step))[1]


def _nan() -> float:
    return float("nan")


def _anon_estimate(summary: dict) -> float:
    m = summary.get("memory") or {}
    return m.get("estimate_mb", _nan()) - (m.get("estimate_parts_mb") or {}).get("store page cache", 0.0)


def _config(b, key: str, runs: list[dict], full_digest, bitwise: dict[str, bool]) -> dict:
    ok = [r for r in runs if r.get("status") == "ok"]
    failed = [r for r in runs if r.get("status") != "ok"]
    med, spread = median_spread([r["samples_per_s"] for r in ok])
    groups = [r["memory_group"] for r in runs if "memory_group" in r]
    steps = [r["steps"] for r in ok]
    last = max(steps) if steps else b.steps
    early = min(100, last)
    waits = [r["time_per_step_ms"]["wait_embeddings"] for r in ok]
    total_ms = [sum(r["time_per_step_ms"].values()) for r in ok]
    digests = sorted({r.get("params_sha256") for r in ok}, key=str)
    return {
        "status": "ok" if ok and not failed else ("failed" if not ok else "partly failed"),
        "failures": [r.get("why", "?") for r in failed],
        "samples_per_s": med,
        "spread": spread,
        "runs": [r["samples_per_s"] if r.get("status") == "ok" else None for r in runs],
        "step_ms": 1000 * b.batch_size / med if ok and med else _nan(),
        "time_per_step_ms": step_times(ok) if ok else {},
        "reads_share_of_step": median_spread([w / t for w, t in zip(waits, total_ms) if t])[0],
        "read_mb_per_step": median_spread([(r.get("io_per_step") or {}).get("read_bytes", 0) / 2**20 for r in ok])[0],
        "written_mb_per_step": median_spread([(r.get("io_per_step") or {}).get("write_bytes", 0) / 2**20 for r in ok])[
            0
        ],
        "limit_mb": groups[0]["limit_mb"] if groups else None,
        "group_peak_mb": max((g["peak_mb"] for g in groups), default=_nan()),
        "max_dirty_mb": max((g.get("max", {}).get("dirty", 0.0) for g in groups), default=_nan()),
        "max_writeback_mb": max((g.get("max", {}).get("writeback", 0.0) for g in groups), default=_nan()),
        "max_mapped_mb": max((g.get("max", {}).get("mapped", 0.0) for g in groups), default=_nan()),
        "limit_hits": [g["limit_hits"] for g in groups],
        "oom_kills": sum(g["oom_kills"] for g in groups),
        "anon_step": [early, last],
        "anon_mb": [[anon_at(r, early), anon_at(r, last)] for r in ok],
        "peak_anon_rss_mb": median_spread([r["peak_anon_rss_mb"] for r in ok])[0],
        "estimate_mb": median_spread([(r.get("memory") or {}).get("estimate_mb", _nan()) for r in ok])[0],
        # the estimate of the process's own memory (the page cache it pins left out), against its measured peak
        "estimate_anon_mb": median_spread([_anon_estimate(r) for r in ok])[0],
        "hit_rate": (ok[0].get("cache") or {}).get("hit_rate") if ok else None,
        "last_checkpoint_steps": [r.get("last_checkpoint_step") for r in runs],
        "hot_lookup_share": ((ok[0].get("cache") or {}).get("hot") or {}).get("lookup_share") if ok else None,
        "pipeline_cpu_ms": median_spread([pipeline_cpu(r) for r in ok])[0],
        "pipeline_cpu_share": median_spread([r.get("pipeline_cpu_share") or 0.0 for r in ok])[0],
        # each run's CPU per thread (summary.json's threads_per_step_ms) and its store's
        # counters and layout (the row log's slots and rows in it at the end)
        "threads_per_step_ms": [r.get("threads_per_step_ms") for r in ok],
        "store": [r.get("store") for r in ok],
        "params_sha256": digests,
        "same_digest_as_full": (
            None if not (b.digest and ok and full_digest and key != "full") else digests == full_digest
        ),
        "bitwise": bitwise.get(key, True),
        "memory_series": [r.get("memory_series", []) for r in runs],
        "budget": [(r.get("memory") or {}).get("sizes") for r in ok[:1]],
    }


def summarise(
    b,
    results: dict[str, list[dict]],
    probes: list[dict],
    total_rows,
    cache_rows,
    table_bytes,
    where,
    bitwise: dict[str, bool] | None = None,
) -> dict:
    """``bitwise``: configuration -> whether its mode promises full's digest (ModeSpec.bitwise;
    a configuration missing from it does)."""
    bitwise = bitwise or {}
    full_runs = [r for r in results.get("full", []) if r.get("status") == "ok"]
    full_digest = sorted({r.get("params_sha256") for r in full_runs}, key=str) or None
    res = {k: _config(b, k, runs, full_digest, bitwise) for k, runs in results.items()}
    ref = {k: res[k]["samples_per_s"] if k in res else _nan() for k in ("full", "nocache", "lru")}
    for r in res.values():
        for k, v in ref.items():
            r[f"ratio_to_{k}"] = r["samples_per_s"] / v
    probe = {}
    if probes:
        ms, sp = median_spread([p["ms_per_step"] for p in probes])
        probe = {"ms_per_step": ms, "spread": sp, "runs": probes}
    targets = _targets(res)
    table = _layout_line(b) + "\n\n" + markdown_table(*_rows(res, b)) + "\n\n" + _target_lines(targets, res)
    return {
        "memory_controller": where,
        **header(b),
        "total_rows": total_rows,
        "cache_rows": cache_rows,
        "cache_fraction_of_rows": cache_rows / total_rows,
        "table_gib": table_bytes / 2**30,
        "table_to_limit": table_bytes / (b.memory_limit_mb * 2**20),
        "results": res,
        "reads_only": probe,
        "targets": targets,
        "table": table,
    }


def _layout_line(b) -> str:
    """The row layout the disk store's table file was measured in (results.json's
    config.store_layout): a table of an identity run and one of a frequency run looked
    alike (newcomer round 18)."""
    return f"disk store's table file in the {b.store_layout} row layout (--store-layout {b.store_layout})"


def _early_step(res: dict) -> str:
    """The step the anonymous memory is first read at (its ``anon_step``: step 100, or
    the last step of a shorter run such as --quick's), as the table and targets say it."""
    steps = sorted({r["anon_step"][0] for r in res.values() if r.get("anon_step")})
    return ", ".join(f"{s:,}" for s in steps) or "100"


def _ratio(r: dict, k: str) -> str:
    v = r[f"ratio_to_{k}"]
    return f"{v:.2f}x" if v == v else "-"


def _rows(res: dict, b) -> tuple[list[str], list[list]]:
    headers = ["config", "samples/s (median)", "runs", "spread", "vs full", "vs nocache", "vs lru",
               "rows' wait / step", "MiB read/step", "group peak / limit MiB", "max dirty MiB",
               f"anon MiB at step {_early_step(res)} / last", "OOM kills", "hit rate", "pipeline CPU ms/step (of compute)",
               "last checkpoint", "params_sha256"]  # fmt: skip
    rows = []
    for key, r in res.items():
        if r["status"] == "failed":  # nothing a finished run would give
            why = "; ".join(dict.fromkeys(r["failures"]))
            peak = "-" if r["limit_mb"] is None else f"{r['group_peak_mb']:,.0f} / {r['limit_mb']:,.0f}"
            rows.append([key, f"failed: {why}", "-", "-", "-", "-", "-", "-", "-", peak,
                         f"{r['max_dirty_mb']:.0f}", "-", r["oom_kills"], "-", "-", _checkpoints(r), "-"])  # fmt: skip
            continue
        runs = ", ".join("failed" if v is None else f"{v:,.0f}" for v in r["runs"])
        anon = "; ".join(f"{a:,.0f} / {z:,.0f}" for a, z in r["anon_mb"] if a is not None and z is not None)
        same = r["same_digest_as_full"]
        rows.append(
            [
                key,
                r["samples_per_s"],
                runs,
                percent(r["spread"]),
                _ratio(r, "full"),
                _ratio(r, "nocache"),
                _ratio(r, "lru"),
                f"{r['reads_share_of_step']:.0%}",
                r["read_mb_per_step"],
                "-" if r["limit_mb"] is None else f"{r['group_peak_mb']:,.0f} / {r['limit_mb']:,.0f}",
                "-" if r["limit_mb"] is None else f"{r['max_dirty_mb']:.0f}",
                anon or "-",
                "-" if r["limit_mb"] is None else r["oom_kills"],
                "-" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}",
                f"{r['pipeline_cpu_ms']:.1f} ({r['pipeline_cpu_share']:.0%})",
                _checkpoints(r),
                "reference"
                if key == "full"
                else {
                    True: "= full",
                    False: "differs" if r["bitwise"] else "differs (by design: within rounding)",
                    None: "-",
                }[same],
            ]
        )
    return headers, rows


def _checkpoints(r: dict) -> str:
    """The step of each run's last checkpoint ("-": none)."""
    steps = r.get("last_checkpoint_steps") or []
    return ", ".join("-" if s is None else f"step {s:,}" for s in steps) or "-"


def _targets(res: dict) -> dict:
    limited = {k: v for k, v in res.items() if v["limit_mb"]}
    la, nc = res.get("lookahead"), res.get("nocache")
    flat = {}
    for k, v in limited.items():
        pairs = [(a, z) for a, z in v["anon_mb"] if a and z]
        flat[k] = max((abs(z - a) / a for a, z in pairs), default=_nan())
    t = {
        "finished": {k: v["status"] == "ok" for k, v in limited.items()},
        "oom_kills": sum(v["oom_kills"] for v in limited.values()),
        "digests_equal_full": {k: v["same_digest_as_full"] for k, v in limited.items() if v["bitwise"]},
        "peak_within_limit": {k: v["group_peak_mb"] <= v["limit_mb"] for k, v in limited.items()},
        "anon_change_step_100_to_last": flat,
        "max_dirty_mb": {k: v["max_dirty_mb"] for k, v in limited.items()},
        "nocache_reads_share": nc["reads_share_of_step"] if nc else _nan(),
    }
    if la:
        t |= {
            "lookahead_vs_lru": la["ratio_to_lru"],
            "lookahead_vs_nocache": la["ratio_to_nocache"],
            "lookahead_vs_full": la["ratio_to_full"],
        }
    t["reads_bound"] = t["nocache_reads_share"] >= READS_SHARE
    return t


def _target_lines(t: dict, res: dict) -> str:
    ok = lambda c: "met" if c else "missed"  # noqa: E731
    fin = t["finished"]
    flat = t["anon_change_step_100_to_last"]
    lines = [
        f"- every limited run finished: {ok(all(fin.values()))} ({', '.join(k for k, v in fin.items() if not v) or 'all'}"
        f"{' failed' if not all(fin.values()) else ''}); OOM kills: {t['oom_kills']}",
        "- every digest equal to full's (hotline: within rounding by design, not compared): "
        + ok(all(v is True for v in t["digests_equal_full"].values()))
        + f" ({', '.join(f'{k} {v}' for k, v in t['digests_equal_full'].items())})",
        f"- every group's peak within its limit: {ok(all(t['peak_within_limit'].values()))}",
        f"- anonymous memory at the last step within 5% of step {_early_step(res)}: "
        + (
            ok(all(v <= FLAT for v in flat.values() if v == v) and all(v == v for v in flat.values()))
            if flat
            else "not measured"
        )
        + " ("
        + ", ".join(f"{k} {v:+.1%}" if v == v else f"{k} n/a" for k, v in t["anon_change_step_100_to_last"].items())
        + ")",
        f"- dirty pages <= {DIRTY_BOUND_MB} MiB at every sample: "
        + ok(all(v <= DIRTY_BOUND_MB for v in t["max_dirty_mb"].values()))
        + " (max "
        + ", ".join(f"{k} {v:.0f}" for k, v in t["max_dirty_mb"].items())
        + " MiB)",
    ]
    if "lookahead_vs_lru" in t:
        share = t["nocache_reads_share"]
        kind = f"reads {share:.0%} of nocache's step: " + ("reads matter" if t["reads_bound"] else "compute-bound")
        if t["reads_bound"]:
            speed = (
                f"lookahead vs lru {t['lookahead_vs_lru']:.2f}x (>= 1.3x: {ok(t['lookahead_vs_lru'] >= 1.3)}), "
                f"vs nocache {t['lookahead_vs_nocache']:.2f}x (>= 2x: {ok(t['lookahead_vs_nocache'] >= 2)})"
            )
        else:
            speed = f"lookahead vs lru {t['lookahead_vs_lru']:.2f}x (>= 0.95x: {ok(t['lookahead_vs_lru'] >= 0.95)})"
        full = f"vs unlimited full {t['lookahead_vs_full']:.2f}x (>= 0.8x: {ok(t['lookahead_vs_full'] >= 0.8)})"
        lines.append(f"- {kind}; {speed}; {full}")
    return "\n".join(lines)


def plot(out: Path, payload: dict) -> None:
    plt = pyplot()
    res = payload["results"]
    keys = list(res)
    done = [k for k in keys if res[k]["status"] != "failed"]
    fig, axes = plt.subplots(2, 2, figsize=(15, 9))
    (ax1, ax2), (ax3, ax4) = axes
    stacked_step_times(ax1, done, [res[k]["time_per_step_ms"] for k in done])
    ax1.set_title("time per step (trainer thread)")
    ax1.legend(fontsize=7)
    ax1.tick_params(axis="x", rotation=30)
    ax2.bar(keys, [res[k]["samples_per_s"] if k in done else 0 for k in keys], color="tab:green")
    for i, k in enumerate(keys):
        if k not in done:
            ax2.text(i, 0, "failed", ha="center", va="bottom", color="red", rotation=90)
    ax2.set_ylabel("samples/s")
    ax2.set_title(
        f"throughput ({payload['table_gib']:.1f} GiB of rows, limit {payload['config']['memory_limit_mb']:g} MiB)"
    )
    ax2.tick_params(axis="x", rotation=30)
    limit = payload["config"]["memory_limit_mb"]
    for k in keys:
        series = (res[k]["memory_series"] or [[]])[0]
        if not series:
            continue
        t = [s["t"] for s in series]
        (line,) = ax3.plot(t, [s["usage"] for s in series], lw=1, label=f"{k} usage")
        ax3.plot(t, [s["anon"] for s in series], lw=1, ls="--", color=line.get_color(), label=f"{k} anon")
        ax4.plot(t, [s["dirty"] + s["writeback"] for s in series], lw=1, color=line.get_color(), label=k)
    ax3.axhline(limit, color="r", ls=":", label="limit")
    ax3.set_xlabel("seconds (first repetition)")
    ax3.set_ylabel("MiB")
    ax3.set_title("the group's memory over time (usage: page cache included)")
    ax3.legend(fontsize=6, ncol=2)
    ax4.axhline(DIRTY_BOUND_MB, color="r", ls=":", label=f"{DIRTY_BOUND_MB} MiB")
    ax4.set_xlabel("seconds (first repetition)")
    ax4.set_ylabel("MiB")
    ax4.set_title("dirty + writeback pages of the group")
    ax4.legend(fontsize=7)
    save_png(fig, out / "scale.png")
