"""``bagpipe bench sweep``: lookahead throughput and hit rate over cache size x lookahead L.

Every point of the grid (cache = 1, 2, 5, 10, 20% of all rows) x (L = 1, 10, 50, 200) is a
separate ``bagpipe train --mode lookahead --store memory`` process on the same generated
data, model, batch and optimizer; points are interleaved across repetitions (the order
alternates direction every repetition so slow drift of the machine hits all alike) and
the warm-up steps are left out of the throughput. A cache smaller than one batch's
unique rows cannot run (CapacityError); such points are not started and appear as
"too small" in the table. Once per repetition the auto-tuner runs too
(``--cache-budget-mb`` = the memory of a cache of ``autotune_percent`` of the rows), and
its throughput is compared with the best measured grid point.

Default size (why): the criteo-kaggle profile at scale 0.01 (337,632 rows, the Kaggle
table shapes and skew), DLRM's Kaggle recipe, batch 512, Adagrad, 240 steps of which 20
are warm-up, 2 repetitions: 21 configurations x 2 = 42 processes of ~10-20 s each, well
under 15 minutes on 2 cores. At this scale the grid spans every regime: at 1% the window
of L >= 10 does not fit (forced evictions), at 2% that of L >= 50 does not, from 5% on
every window fits; and 240 steps keep L = 200 distinct from a window over the whole run.
What matters for the oracle is the cache relative to the rows one window touches, not
the table size, so the same picture holds for larger tables with proportionally larger
batches or windows.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bagpipe.bench.harness.report import (
    header,
    markdown_table,
    median,
    percent,
    pyplot,
    save_png,
    step_times,
    throughput,
    write_results,
)
from bagpipe.bench.harness.runner import TrainFailed, launch, prepare_checked, widest_batch
from bagpipe.bench.harness.settings import Throughput
from bagpipe.errors import CapacityError, ConfigError
from bagpipe.optim.names import row_state_dim
from bagpipe.train.plot import legend


@dataclass(kw_only=True)
class SweepBench(Throughput):
    """The lookahead mode over cache size (1-20% of rows) x L (1, 10, 50, 200): samples/s,
    hit rate, forced evictions; plus the --cache-budget-mb auto-tuner against the best
    measured point (criteo-kaggle x 0.01, batch 512)."""

    name = "sweep"
    #: Under a minute: small batches, few steps, a 3 x 2 grid whose smallest cache is too small.
    QUICK = dict(
        batch_size=256,
        recipe="debug",
        steps=24,
        warmup=4,
        reps=1,
        cache_percents=(0.2, 2, 20),
        lookaheads=(1, 10),
        autotune_percent=2.0,
        eval_samples=512,
        threads=1,
    )

    scale: float = 0.01
    batch_size: int = 512
    steps: int = 240
    warmup: int = 20
    eval_samples: int = 2048
    run_timeout_s: float = 1800.0
    cache_percents: tuple[float, ...] = (1, 2, 5, 10, 20)
    """Cache sizes of the grid, in percent of all rows."""
    lookaheads: tuple[int, ...] = (1, 10, 50, 200)
    """Lookahead windows L of the grid."""
    store: Literal["memory", "disk"] = "memory"
    """Where the rows live (bagpipe train --store)."""
    autotune_percent: float = 5.0
    """The auto-tuner's budget buys a cache of this percent of the rows; 0 skips it."""

    def validate(self) -> None:
        super().validate()
        self.check(
            "cache_percents",
            bool(self.cache_percents) and all(0 < p <= 100 for p in self.cache_percents),
            "must be in (0, 100]",
        )
        self.check("lookaheads", bool(self.lookaheads) and all(L >= 1 for L in self.lookaheads), "must be >= 1")
        self.check("autotune_percent", 0 <= self.autotune_percent <= 100, "must be in [0, 100]")


def _key(pct: float, L: int) -> str:
    return f"{pct:g}%/L={L}"


def run(b: SweepBench) -> dict:
    # checked before the data set takes OUT/data's place: a refusal leaves --out as it was
    out, data, meta, (points, widest, budget) = prepare_checked(b, lambda d, m: grid(b, d, m.total_rows), False)
    total = meta.total_rows

    order = list(points)
    for rep in range(b.reps):
        for key in order if rep % 2 == 0 else order[::-1]:
            p = points[key]
            if p["too_small"]:
                continue
            run_dir = out / "runs" / f"{key.replace('%', 'pct').replace('/', '-').replace('=', '')}-{rep}"
            if run_dir.exists():
                shutil.rmtree(run_dir)
            if key == "auto":
                cache = dict(cache_budget_mb=f"{budget:.6f}")
            else:
                cache = dict(cache_rows=p["cache_rows"], lookahead=p["lookahead"])
            print(f"[rep {rep + 1}/{b.reps}] {key} ...", flush=True)
            try:
                s = launch(b, data, run_dir, f"sweep {key}", mode="lookahead", store=b.store, **cache)
            except TrainFailed as e:
                if not e.capacity_error:
                    raise
                p["too_small"] = True
                print("    too small for a batch's unique rows", flush=True)
                continue
            finally:
                shutil.rmtree(run_dir, ignore_errors=True)
            p["runs"].append(s)
            c = s["cache"]
            print(
                f"    {s['samples_per_s']:,.0f} samples/s, hit rate {c['hit_rate']:.1%}, "
                f"{c['forced_evictions']:,} forced evictions",
                flush=True,
            )
    shutil.rmtree(out / "runs", ignore_errors=True)
    payload = summarise(b, points, total, widest, budget)
    _plot(out, payload)
    write_results(out, "sweep", payload, payload["table"])
    if not any(p["runs"] for p in points.values()):
        raise CapacityError(
            f"bench sweep: nothing measured: every point was too small for a batch's unique rows "
            f"(see {out / 'results.md'}); {_what_to_do(b, total, widest)}"
        )
    return payload


def grid(b: SweepBench, data: Path, total: int) -> tuple[dict[str, dict], int, float]:
    """The sweep's points on ``data`` (``total`` rows), the most unique rows a batch has and
    the auto-tuner's budget (MiB); a sweep in which nothing can run is refused
    (:func:`refuse_unmeasurable`)."""
    from bagpipe.models import recipe
    from bagpipe.oracle.autotune import budget_mb_for_rows

    widest = widest_batch(data, b.batch_size, b.steps)  # the smallest cache that can run
    dim = recipe(b.model, b.recipe).embedding_dim
    state_dim = row_state_dim(b.optimizer, dim)

    points: dict[str, dict] = {}
    for pct in b.cache_percents:
        rows = max(1, int(pct / 100 * total))
        for L in b.lookaheads:
            points[_key(pct, L)] = {
                "cache_percent": pct,
                "cache_rows": rows,
                "lookahead": L,
                "too_small": rows < widest,
                "runs": [],
            }
    budget = 0.0
    if b.autotune_percent > 0:
        # the memory of a cache of autotune_percent of the rows, rounded up to the MiB digits passed on
        budget = (
            math.ceil(budget_mb_for_rows(max(1, int(b.autotune_percent / 100 * total)), dim, state_dim) * 1e6) / 1e6
        )
        points["auto"] = {
            "cache_percent": None,
            "cache_rows": None,
            "lookahead": None,
            "budget_mb": budget,
            "too_small": False,
            "runs": [],
        }
    refuse_unmeasurable(b, points, total, widest)
    return points, widest, budget


def _what_to_do(b: SweepBench, total: int, widest: int) -> str:
    least = math.ceil(100 * widest / total)  # percent
    small = " or drop --profile tiny" if b.profile == "tiny" else ""
    return f"raise --scale{small}, or give --cache-percents of at least {least:g}"


def refuse_unmeasurable(b: SweepBench, points: dict[str, dict], total: int, widest: int) -> None:
    """Refuse, in one line and before any run, a sweep in which no point can run: every
    cache of the grid and the auto-tuner's budget hold fewer rows than one batch's unique
    rows (``--profile tiny`` at ``--quick``'s scale: 266 rows in all). It used to run
    nothing, exit 0 and draw empty plots."""
    grid = [p for p in points.values() if p["cache_rows"] is not None]
    auto_rows = max(1, int(b.autotune_percent / 100 * total)) if b.autotune_percent > 0 else 0
    if any(not p["too_small"] for p in grid) or auto_rows >= widest:
        return
    largest = max(grid, key=lambda p: p["cache_rows"])
    auto = f", as is the auto-tuner's budget ({b.autotune_percent:g}%)" if b.autotune_percent > 0 else ""
    raise ConfigError(
        f"bench sweep: nothing measurable at this size: the largest cache of --cache-percents "
        f"({largest['cache_percent']:g}% of {total:,} rows = {largest['cache_rows']:,}) is smaller than the "
        f"{widest:,} unique rows a batch of {b.batch_size} has{auto}; {_what_to_do(b, total, widest)}"
    )


def _point_result(p: dict) -> dict:
    runs = p["runs"]
    r = {k: p[k] for k in ("cache_percent", "cache_rows", "lookahead", "too_small")}
    if p.get("budget_mb") is not None:
        r["budget_mb"] = p["budget_mb"]
    if not runs:
        return r
    sps, spread = throughput(runs)
    c = runs[0]["cache"]  # plans are deterministic: every repetition has the same counts
    r.update(
        samples_per_s=sps,
        spread=spread,
        runs=[x["samples_per_s"] for x in runs],
        hit_rate=c["hit_rate"],
        forced_evictions=c["forced_evictions"],
        misses=c["misses"],
        max_occupied=c["max_occupied"],
        time_per_step_ms=step_times(runs),
        wall_s=median(runs, "wall_s"),
    )
    if c.get("autotune"):  # the auto-tuned point (a grid point's summary has "autotune": null)
        r["cache_rows"], r["lookahead"] = c["cache_rows"], c["lookahead"]
        r["cache_percent"] = 100 * c["cache_rows"] / runs[0]["total_rows"]
        r["autotune"] = c["autotune"]
    return r


def summarise(b: SweepBench, points: dict[str, dict], total_rows: int, widest: int, budget: float) -> dict:
    res = {k: _point_result(p) for k, p in points.items()}
    grid = {k: v for k, v in res.items() if k != "auto" and "samples_per_s" in v}
    best_key = max(grid, key=lambda k: grid[k]["samples_per_s"]) if grid else None
    best = grid[best_key]["samples_per_s"] if best_key else float("nan")
    rows = []
    for k, v in res.items():
        if k == "auto":
            continue
        if v["too_small"]:
            rows.append(
                [
                    f"{v['cache_percent']:g}%",
                    f"{v['cache_rows']:,}",
                    v["lookahead"],
                    f"too small (a batch has up to {widest:,} unique rows)",
                    "-",
                    "-",
                    "-",
                    "-",
                ]
            )
            continue
        rows.append(
            [
                f"{v['cache_percent']:g}%",
                f"{v['cache_rows']:,}",
                v["lookahead"],
                v["samples_per_s"],
                percent(v["spread"]),
                f"{v['hit_rate']:.1%}",
                f"{v['forced_evictions']:,}",
                f"{v['samples_per_s'] / best:.2f}",
            ]
        )
    auto = res.get("auto")
    autotune = None
    if auto and "samples_per_s" in auto:
        fits = {k: v for k, v in grid.items() if v["cache_rows"] <= auto["cache_rows"]}
        best_in = max(fits, key=lambda k: fits[k]["samples_per_s"]) if fits else None
        autotune = {
            "budget_mb": auto["budget_mb"],
            "cache_rows": auto["cache_rows"],
            "cache_percent": auto["cache_percent"],
            "lookahead": auto["lookahead"],
            "reason": auto["autotune"]["reason"],
            "samples_per_s": auto["samples_per_s"],
            "best_point": best_key,
            "best_samples_per_s": best,
            "ratio_to_best": auto["samples_per_s"] / best,
            "best_point_within_budget": best_in,
            "ratio_to_best_within_budget": auto["samples_per_s"] / fits[best_in]["samples_per_s"] if best_in else None,
        }
        rows.append(
            [
                f"auto ({auto['budget_mb']:.3g} MiB)",
                f"{auto['cache_rows']:,}",
                auto["lookahead"],
                auto["samples_per_s"],
                percent(auto["spread"]),
                f"{auto['hit_rate']:.1%}",
                f"{auto['forced_evictions']:,}",
                f"{auto['samples_per_s'] / best:.2f}",
            ]
        )
    headers = ["cache (% of rows)", "cache rows", "L", "samples/s", "spread", "hit rate", "forced evictions", "vs best"]
    table = markdown_table(headers, rows)
    notes = [
        f"{total_rows:,} rows; {b.profile} x {b.scale:g}, {b.model}/{b.recipe}, batch {b.batch_size}, {b.optimizer}, "
        f"{b.steps} steps ({b.warmup} warm-up excluded), {b.reps} repetition(s), store {b.store}; median samples/s, "
        f"spread = (max - min) / median.",
    ]
    if best_key:
        notes.append(f"Best point: {best_key} at {best:,.0f} samples/s.")
    if autotune:
        within = ""
        if autotune["best_point_within_budget"]:
            within = (
                f", {autotune['ratio_to_best_within_budget']:.2f}x the best point whose cache fits the same budget "
                f"({autotune['best_point_within_budget']})"
            )
        notes.append(
            f"Auto-tuner (`--cache-budget-mb {autotune['budget_mb']:g}`): {autotune['cache_rows']:,} rows, "
            f"L={autotune['lookahead']} -> {autotune['samples_per_s']:,.0f} samples/s, "
            f"{autotune['ratio_to_best']:.2f}x the best measured point{within}. Its reason: {autotune['reason']}"
        )
    table = table + "\n\n" + "\n\n".join(notes)
    return {
        **header(b),
        "total_rows": total_rows,
        "max_unique_rows_per_batch": widest,
        "results": res,
        "best_point": best_key,
        "autotune": autotune,
        "table": table,
    }


def _plot(out: Path, payload: dict) -> None:
    plt = pyplot()
    res = payload["results"]
    Ls = sorted({v["lookahead"] for k, v in res.items() if k != "auto"})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for L in Ls:
        pts = sorted(
            (v["cache_percent"], v)
            for k, v in res.items()
            if k != "auto" and v["lookahead"] == L and "samples_per_s" in v
        )
        if not pts:
            continue
        x = [p[0] for p in pts]
        ax1.plot(x, [p[1]["samples_per_s"] for p in pts], marker="o", label=f"L={L}")
        ax2.plot(x, [100 * p[1]["hit_rate"] for p in pts], marker="o", label=f"L={L}")
    auto = res.get("auto")
    if auto and "samples_per_s" in auto:
        ax1.plot(
            [auto["cache_percent"]],
            [auto["samples_per_s"]],
            marker="*",
            markersize=14,
            color="black",
            linestyle="none",
            label=f"auto-tuned (L={auto['lookahead']})",
        )
        ax2.plot(
            [auto["cache_percent"]],
            [100 * auto["hit_rate"]],
            marker="*",
            markersize=14,
            color="black",
            linestyle="none",
            label=f"auto-tuned (L={auto['lookahead']})",
        )
    small = sorted({v["cache_percent"] for k, v in res.items() if k != "auto" and v["too_small"]})
    ticks = sorted({v["cache_percent"] for k, v in res.items() if k != "auto"})
    for ax, title, ylabel in ((ax1, "throughput", "samples/s"), (ax2, "cache hit rate", "hit rate (% of unique rows)")):
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{t:g}%" for t in ticks])
        ax.minorticks_off()
        ax.set_ylim(0, 100 if ax is ax2 else None)
        ax.set_xlabel("cache size (% of all rows)")
        ax.set_ylabel(ylabel)
        ax.set_title(title + (f" (too small: {', '.join(f'{s:g}%' for s in small)})" if small else ""))
        ax.grid(alpha=0.3)
        legend(ax, fontsize=8)  # none without a measured point (matplotlib warns of an empty one)
    save_png(fig, out / "sweep.png")
