"""``bagpipe bench oracle``: planning throughput of the lookahead oracle alone.

Batches are generated and read into memory first; then the oracle plans them on one
thread (torch/numpy intra-op threads pinned to 1). Reports lookups planned per
second, per-batch planning time, the oracle's own state in MiB and the hit rate.

With ``--reference`` (the default) every point is also planned by the reference read
path (``LookaheadOracle(fast=False)``: one sort of the batch's lookups, as before the
map-based read), interleaved with the fast one, and the two are checked to give the
same plans (every array of every plan). The load average before and after is recorded:
the machine is shared.

With ``--hot-budget-mb M`` every point is also planned behind a hot tier of M MiB
(:class:`bagpipe.accel.hot.HotSplit`: the oracle plans only the cold rows), interleaved
with the plain runs: the time per batch of the oracle alone and of the whole planner
thread (split, oracle, merge). The hot rows are profiled on other inputs of the same
generated data (its train split, ``--profile-samples`` inputs read whole: as many as
FAE's 5% of Criteo Kaggle) than the planned batches (its eval split), so the share of
lookups they serve is what a run would see.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from bagpipe.bench.harness.report import (
    header,
    markdown_table,
    median_spread,
    percent,
    pyplot,
    save_png,
    write_results,
)
from bagpipe.bench.harness.settings import BenchConfig, Repeated


@dataclass(kw_only=True)
class OracleBench(Repeated, BenchConfig):
    """The oracle's planning throughput alone (one thread) vs batch size and lookahead L."""

    name = "oracle"
    QUICK = dict(
        scale=0.01, batch_sizes=(512,), lookaheads=(1, 8), batches=30, reps=1, hot_budget_mb=0.5, profile_samples=20_000
    )

    reps: int = 3
    batch_sizes: tuple[int, ...] = (1024, 2048, 4096)
    """Batch sizes to plan."""
    lookaheads: tuple[int, ...] = (1, 10, 50, 200)
    """Lookahead windows L to plan with."""
    batches: int = 120
    """Batches planned per measurement."""
    cache_fraction: float = 0.05
    """The oracle's cache as a fraction of all rows (at least one batch's lookups)."""
    hot_budget_mb: float = 96.0
    """Also plan behind a hot tier of this many MiB (rows of D = 16 and one Adagrad float); 0: off."""
    profile_samples: int = 2_000_000
    """Inputs of the independent sample the hot rows are profiled on."""
    reference: bool = True
    """Also plan every point with the reference read path (the sort of every lookup) and check the plans are equal."""
    retain: bool = True
    """Plan as a one-trainer job's oracle does, rows kept past their window until their slots
    are needed; --no-retain: as a data-parallel job's, each row written back after its window."""

    def validate(self) -> None:
        super().validate()
        self.check("batch_sizes", bool(self.batch_sizes) and all(B >= 1 for B in self.batch_sizes), "must be >= 1")
        self.check("lookaheads", bool(self.lookaheads) and all(L >= 1 for L in self.lookaheads), "must be >= 1")
        self.check("batches", self.batches >= 1, "must be >= 1")
        self.check("cache_fraction", 0 < self.cache_fraction <= 1, "must be in (0, 1]")
        self.check("hot_budget_mb", self.hot_budget_mb >= 0, "must be >= 0")
        self.check("profile_samples", self.profile_samples >= 1, "must be >= 1")


def oracle_state_mb(o) -> float:
    return o.state_bytes / 2**20


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(b: OracleBench) -> dict:
    import torch

    from bagpipe.data.shards import Dataset
    from bagpipe.data.stream import BatchStream
    from bagpipe.data.synthetic import SynthConfig, generate

    torch.set_num_threads(1)
    out = b.out_dir
    data = out / "data"
    need = max(b.batch_sizes) * (b.batches + 1)
    profiled = b.profile_samples if b.hot_budget_mb > 0 else 0
    # the planned batches come from the eval split; the hot rows are profiled on the train split
    generate(
        SynthConfig(
            profile=b.profile,
            samples=need + profiled + 1,
            scale=b.scale,
            seed=2,
            eval_fraction=need / (need + profiled + 1),
        ),
        str(data),
        overwrite=True,
        progress=False,
    )
    ds = Dataset(data)
    total = ds.meta.total_rows
    hot = None
    if b.hot_budget_mb > 0:
        from bagpipe.accel.profile import profile

        hot = profile(ds, b.hot_budget_mb, dim=16, state_dim=1, sample_rate=1.0)
        print(hot.line(), flush=True)
    load_start = _load()
    print(f"load average {load_start}", flush=True)
    paths = [True, False] if b.reference else [True]  # fast, then the reference
    rows, res = [], {}
    for B in b.batch_sizes:
        stream = BatchStream(ds, "eval", B, seed=0)
        batches = [(i, stream.batch(i)) for i in range(b.batches)]
        lookups = sum(int(x.rows.shape[0]) for _, x in batches)
        cache = max(int(b.cache_fraction * total), B * ds.meta.num_features)
        for L in b.lookaheads:
            runs = [
                _plan(batches, total, cache, L, h, fast, b.retain)
                for _ in range(b.reps)
                for h in ([None, hot] if hot else [None])
                for fast in paths
            ]
            plain = [r for r in runs if r["hot"] is None and r["fast"]]
            med, spread = median_spread([lookups / r["seconds"] for r in plain])
            key = f"B={B},L={L}"
            o = plain[-1]
            res[key] = {
                "batch_size": B,
                "lookahead": L,
                "lookups_per_s": med,
                "spread": spread,
                "runs_lookups_per_s": [round(lookups / r["seconds"]) for r in plain],
                "ms_per_batch": 1000 * lookups / med / len(batches),
                "state_mb": o["state_mb"],
                "hit_rate": o["hit_rate"],
                "forced_evictions": o["forced_evictions"],
            }
            row = [B, L, med / 1e6, percent(spread)]
            if b.reference:
                ref_runs = [lookups / r["seconds"] for r in runs if r["hot"] is None and not r["fast"]]
                ref, ref_spread = median_spread(ref_runs)
                same = _same_plans(batches, total, cache, L, b.retain)
                res[key]["reference"] = {
                    "lookups_per_s": ref,
                    "spread": ref_spread,
                    "speedup": med / ref,
                    "runs_lookups_per_s": [round(x) for x in ref_runs],
                    "identical_plans": same,
                }
                row += [ref / 1e6, percent(ref_spread), f"{med / ref:.2f}x", "yes" if same else "**NO**"]
            row += [res[key]["ms_per_batch"], o["state_mb"], f"{o['hit_rate']:.1%}"]
            if hot is not None:
                with_hot = [r for r in runs if r["hot"] is not None and r["fast"]]
                ms, ms_spread = median_spread([1000 * r["seconds"] / len(batches) for r in with_hot])
                own, _ = median_spread([1000 * r["oracle_s"] / len(batches) for r in with_hot])
                res[key]["hot"] = {
                    "ms_per_batch": ms,
                    "spread": ms_spread,
                    "oracle_ms_per_batch": own,
                    "speedup": res[key]["ms_per_batch"] / ms,
                    "lookup_share": with_hot[-1]["hot"],
                }
                row += [ms, percent(ms_spread), own, f"{res[key]['ms_per_batch'] / ms:.2f}x"]
                if b.reference:
                    ref_ms, _ = median_spread(
                        [1000 * r["seconds"] / len(batches) for r in runs if r["hot"] is not None and not r["fast"]]
                    )
                    res[key]["hot"]["reference_ms_per_batch"] = ref_ms
                    row += [ref_ms]
                row += [f"{with_hot[-1]['hot']:.1%}"]
            rows.append(row)
            ref_note = f" (reference {res[key]['reference']['lookups_per_s'] / 1e6:.1f}M)" if b.reference else ""
            print(f"B={B} L={L}: {med / 1e6:.1f}M lookups/s{ref_note}", flush=True)
    headers = ["batch", "L", "M lookups/s", "spread"]
    if b.reference:
        headers += ["reference M lookups/s", "spread", "faster", "same plans"]
    headers += ["ms/batch", "oracle state MiB", "hit rate"]
    if hot is not None:
        headers += ["ms/batch with hot tier", "spread", "of which oracle", "faster"]
        headers += ["reference ms/batch with hot tier"] if b.reference else []
        headers += ["lookups served hot"]
    load = {"start": load_start, "end": _load()}
    table = (
        markdown_table(headers, rows)
        + f"\n\nload average (1, 5, 15 min): {load['start']} at the start, {load['end']} at the end"
    )
    payload = {
        **header(b),
        "total_rows": total,
        "load_average": load,
        "hot": hot.report if hot is not None else None,
        "results": res,
        "table": table,
    }
    if payload["hot"] is not None:
        payload["hot"] = {k: v for k, v in payload["hot"].items() if k not in ("tables", "table_sizes")}
    _plot(out, res, b)
    write_results(out, "oracle", payload, table)
    return payload


def _plan(batches: list, total: int, cache: int, L: int, hot, fast: bool = True, retain: bool = True) -> dict:
    """Plan ``batches`` once (behind a hot tier when ``hot`` is given): seconds and figures."""
    from bagpipe.accel.hot import HotSplit
    from bagpipe.oracle import LookaheadOracle

    o = LookaheadOracle(total, cache, L, fast=fast, retain=retain)
    split = HotSplit(hot, cache) if hot is not None else None
    t0 = time.perf_counter()
    for _p in split.wrap(o, batches) if split is not None else o.plans(batches):
        pass
    dt = time.perf_counter() - t0
    st = o.stats.as_dict()
    return {
        "seconds": dt,
        "oracle_s": o.stats.seconds,
        "state_mb": oracle_state_mb(o),
        "hit_rate": st["hit_rate"],
        "forced_evictions": st["forced_evictions"],
        "retained_evictions": st["retained_evictions"],
        "retain": retain,
        "fast": fast,
        "hot": split.report()["lookup_share"] if split is not None else None,
    }


def _same_plans(batches: list, total: int, cache: int, L: int, retain: bool = True) -> bool:
    """Whether the fast and the reference read paths give equal plans (every array, every step); not timed."""
    from bagpipe.oracle import LookaheadOracle
    from bagpipe.oracle.plan import same_plan

    fast = LookaheadOracle(total, cache, L, retain=retain).plans(batches)
    ref = LookaheadOracle(total, cache, L, fast=False, retain=retain).plans(batches)
    return all(same_plan(a, b) for a, b in zip(fast, ref, strict=True))


def _plot(out: Path, res: dict, b: OracleBench) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for B in b.batch_sizes:
        pts = [
            (v["lookahead"], v["lookups_per_s"] / 1e6, v.get("reference", {}).get("lookups_per_s", 0) / 1e6)
            for v in res.values()
            if v["batch_size"] == B
        ]
        (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"batch {B}")
        if b.reference:
            ax.plot(
                [p[0] for p in pts],
                [p[2] for p in pts],
                marker="x",
                linestyle="--",
                color=line.get_color(),
                label=f"batch {B}, reference read",
            )
    ax.set_xscale("log")
    ax.set_xlabel("lookahead L (batches)")
    ax.set_ylabel("million lookups planned / s (1 thread)")
    ax.legend()
    save_png(fig, out / "oracle.png")
