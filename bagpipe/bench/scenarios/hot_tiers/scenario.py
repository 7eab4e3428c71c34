"""``bagpipe bench accel``: BagPipe, FAE and Hotline on the same data, model and memory budget.

Every configuration is a separate ``bagpipe train`` process on the same generated data
(the Criteo-Kaggle profile at full cardinality), DLRM's Kaggle recipe, batch 2048,
row-wise Adagrad, the disk store (a cold copy of a fully written table file per run),
and the same trainer memory budget ``--budget-mb`` for rows held in the trainer (hot
tier + cache, 4 (D + S) bytes a row):

    nocache        no cache: each batch's rows read and written back (one batch staged)
    lru            an LRU cache of the whole budget, misses read synchronously
    fae            FAE: hot rows (the budget less one staged batch), cold rows read per batch
    fae-split      the same with FAE's regrouped schedule (all-hot batches apart): an
                   approximation, so its AUC and log loss are the figures to compare
    hotline        Hotline: hot rows as fae; each batch's popular inputs compute while its
                   cold rows are read, then the rest
    lookahead      BagPipe: the oracle's cache of the whole budget
    lookahead+hot  BagPipe with a hot tier: --hot-share of the budget for hot rows, the rest cache

The hot rows are profiled once per budget, as FAE does, from a ``--hot-sample-rate``
sample of the whole train split (``bagpipe profile``; the time is reported), and the runs
read them with ``--hot-rows``. The data has ``--samples`` inputs (Criteo Kaggle's count by
default) so that the profile samples as many inputs as FAE's does; the runs train
``--steps`` batches of it. Reported per configuration: samples/s (median of interleaved
repetitions, spread), the ratio to ``lookahead``, peak anonymous memory, the cache's hit
rate on the rows it plans, the share of lookups the hot tier serves, the planner's time
per step (and the hot split's), eval AUC and log loss. The hit rate is n/a where the
hot tier served every lookup (the cache planned no row); nocache, fae and hotline have
no cache ("-": they stage one batch).

A budget under which every configuration keeps every row of the tables in its hot tier
or cache (``--profile tiny`` at ``--quick``'s scale) compares nothing slow, and one that
does not cover a batch's staged rows leaves fae and hotline no hot tier: both are
refused in one line, before anything is generated or run.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from bagpipe.bench.harness.report import (
    header,
    markdown_table,
    median,
    percent,
    pyplot,
    save_png,
    stacked_step_times,
    step_times,
    throughput,
    write_results,
)
from bagpipe.bench.harness.runner import data_samples, ensure_synth, launch
from bagpipe.bench.harness.settings import Throughput, cache_slots
from bagpipe.bench.scenarios.modes.scenario import fresh_cold_copy, materialise_disk_store
from bagpipe.config.modes import mode_spec
from bagpipe.errors import ConfigError

if TYPE_CHECKING:
    from bagpipe.data.schema import DatasetMeta

CONFIGS = ("nocache", "lru", "fae", "fae-split", "hotline", "lookahead", "lookahead+hot")
CRITEO_KAGGLE_SAMPLES = 45_840_617


@dataclass(kw_only=True)
class AccelBench(Throughput):
    """BagPipe (lookahead, with and without a hot tier), FAE and Hotline against the nocache
    and lru baselines under one trainer memory budget (hot tier + cache), Criteo-Kaggle
    profile at full cardinality, DLRM Kaggle recipe, batch 2048, Adagrad, disk store."""

    name = "accel"
    QUICK = dict(
        scale=0.01,
        samples=40_000,
        batch_size=256,
        recipe="debug",
        steps=8,
        warmup=2,
        reps=1,
        lookahead=8,
        budget_mb=0.5,
        eval_samples=1024,
        threads=1,
    )

    reps: int = 3
    samples: int = CRITEO_KAGGLE_SAMPLES
    """Inputs generated (0: just enough for --steps); the profile samples --hot-sample-rate of the train split."""
    configs: tuple[str, ...] = CONFIGS
    """Configurations to run: a comma-separated subset of """ + ",".join(CONFIGS) + """."""
    budget_mb: float = 128.0
    """Trainer memory for rows (hot tier + cache, with optimizer state) every configuration gets, MiB."""
    hot_share: float = 0.75
    """Share of the budget lookahead+hot gives its hot tier (the rest is its cache)."""
    hot_sample_rate: float = 0.05
    """Share of the train split the profile reads (FAE's 5%)."""
    lookahead: int = 20
    """L of the lookahead configurations."""
    store: Literal["disk", "memory"] = "disk"
    """Where the rows live (bagpipe train --store)."""

    def validate(self) -> None:
        super().validate()
        self.check_subset("configs", CONFIGS)
        self.check("samples", self.samples >= 0, "must be >= 0")
        self.check("budget_mb", self.budget_mb > 0, "must be > 0")
        self.check("hot_share", 0 < self.hot_share < 1, "must be in (0, 1)")
        self.check("hot_sample_rate", 0 < self.hot_sample_rate <= 1, "must be in (0, 1]")
        self.check("lookahead", self.lookahead >= 1, "must be >= 1")


@dataclass(frozen=True)
class Tables:
    """What :func:`plan_budget` reads of a data set's meta (DatasetMeta has both)."""

    total_rows: int
    num_features: int


def tables(b: AccelBench) -> Tables:
    """The generated data's tables, known from the profile and scale before it is generated."""
    from bagpipe.data.profiles import profile_tables

    sizes = profile_tables(b.profile, b.scale)  # one table a feature, as bagpipe synth writes them
    return Tables(total_rows=sum(sizes), num_features=len(sizes))


def _held_rows(b: AccelBench, shape: Tables, row_bytes: int) -> dict[str, int]:
    """The rows each of ``b.configs`` that has a hot tier or cache can keep in trainer
    memory under the budget (nocache, which has neither, is not among them)."""
    rows = int(b.budget_mb * (1 << 20) // row_bytes)
    fae = max(rows - b.batch_size * shape.num_features, 0)  # the budget less one staged batch (plan_budget)
    held = {"lru": rows, "fae": fae, "fae-split": fae, "hotline": fae, "lookahead": rows, "lookahead+hot": rows}
    return {k: held[k] for k in b.configs if k in held}


def _least_scale(profile: str, more_than: int) -> float:
    """The least --scale, at two significant digits, whose tables have more than ``more_than`` rows."""
    from bagpipe.data.profiles import profile_tables

    def rows(s: float) -> int:
        return sum(profile_tables(profile, s))

    lo, hi = 0.0, 1.0
    while rows(hi) <= more_than:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if rows(mid) > more_than else (mid, hi)
    step = 10 ** (math.floor(math.log10(hi)) - 1)
    return float(f"{math.ceil(round(hi / step, 9)) * step:.2g}")


def refuse_unmeasurable(b: AccelBench, shape: Tables, row_bytes: int) -> None:
    """Refuse, in one line and before anything is generated or run, a comparison in which
    every configuration with a hot tier or cache keeps every row of the tables in trainer
    memory: nothing is read from the store, so there is nothing slow to compare
    (``--profile tiny`` at ``--quick``'s scale: 266 rows, a budget of 14,563). It used to
    run all seven, exit 0 and report ratios and targets of the same in-memory training."""
    held = _held_rows(b, shape, row_bytes)
    total = shape.total_rows
    if not held or min(held.values()) < total:
        return
    rows = int(b.budget_mb * (1 << 20) // row_bytes)
    small = ", or drop --profile tiny" if b.profile == "tiny" else ""
    staged = b.batch_size * shape.num_features if any(k in FAE_LIKE for k in held) else 0
    raise ConfigError(
        f"bench accel: nothing measurable at this size: the {total:,} rows of all tables ({b.profile} x {b.scale:g}) "
        f"fit in --budget-mb {b.budget_mb:g} ({rows:,} rows of {row_bytes} bytes), so every configuration keeps "
        f"every row in its hot tier or cache and none reads one from the store; raise --scale to at least "
        f"{_least_scale(b.profile, max(held.values())):g}"  # where none holds every row
        f", or lower --budget-mb to at most {_most_budget_mb(total + staged, row_bytes):g}{small}"
    )


def _most_budget_mb(rows: int, row_bytes: int) -> float:
    """The largest --budget-mb, at three significant digits (rounded down), that holds fewer
    than ``rows`` rows (``rows``: the tables' plus the staged batch's, where a configuration
    stages one: then one of them reads cold rows from the store)."""
    mib = 1 << 20
    exact = rows * row_bytes / mib
    step = 10 ** (math.floor(math.log10(exact)) - 2)
    mb = math.floor(round(exact / step, 9)) * step
    while mb > step and int(mb * mib // row_bytes) >= rows:  # (the exact budget holds them all)
        mb -= step
    return float(f"{mb:.3g}")


FAE_LIKE = ("fae", "fae-split", "hotline")
"""The configurations that hold one staged batch's rows besides their hot tier (plan_budget)."""


def _least_budget_mb(rows: int, row_bytes: int) -> float:
    """The least --budget-mb, at three significant digits (rounded up), that holds ``rows`` rows."""
    mib = 1 << 20
    exact = rows * row_bytes / mib
    step = 10 ** (math.floor(math.log10(exact)) - 2)
    mb = math.ceil(round(exact / step, 9)) * step
    while int(mb * mib // row_bytes) < rows:  # (a float that lands a hair short)
        mb += step
    return float(f"{mb:.3g}")


def refuse_no_hot_tier(b: AccelBench, shape: Tables, row_bytes: int) -> None:
    """Refuse, in one line and before anything is generated or run, a budget that leaves a
    configuration with a hot tier no hot row: fae, fae-split and hotline hold one batch's
    staged rows (B x F) besides their hot tier, so a budget that covers no more than that
    leaves them none, and lookahead+hot's --hot-share of a budget of a row or two rounds
    down to none. It used to generate the data and the table file into --out and only
    then stop on the profile's ``hot budget must be > 0 MiB, got 0.0`` (a budget the user
    never gave)."""
    rows = int(b.budget_mb * (1 << 20) // row_bytes)
    staged = b.batch_size * shape.num_features
    fae = [k for k in b.configs if k in FAE_LIKE]
    if fae and rows <= staged:
        names = ", ".join(fae[:-1]) + (" and " if len(fae) > 1 else "") + fae[-1]
        hold, their, them = ("hold", "their", "them") if len(fae) > 1 else ("holds", "its", "it")
        raise ConfigError(
            f"bench accel: --budget-mb {b.budget_mb:g} ({rows:,} rows of {row_bytes} bytes) does not cover one "
            f"batch's staged rows (--batch-size {b.batch_size} x {shape.num_features} features = {staged:,} rows), "
            f"which {names} {hold} besides {their} hot tier, so it leaves {them} no hot row; give --budget-mb of at "
            f"least {_least_budget_mb(staged + 1, row_bytes):g}"
        )
    if "lookahead+hot" in b.configs and int(b.hot_share * rows) < 1:
        least = math.ceil(1 / b.hot_share)
        while int(b.hot_share * least) < 1:
            least += 1
        raise ConfigError(
            f"bench accel: --budget-mb {b.budget_mb:g} ({rows:,} rows of {row_bytes} bytes) leaves lookahead+hot "
            f"no hot row (--hot-share {b.hot_share:g} of it); give --budget-mb of at least "
            f"{_least_budget_mb(least, row_bytes):g}"
        )


def plan_budget(b: AccelBench, meta: Tables | DatasetMeta, row_bytes: int) -> dict[str, dict]:
    """Each configuration's ``bagpipe train`` settings under the one budget (hot MiB, cache rows).

    The cache never gets more slots than the tables have rows: a budget that holds
    every row (``--profile tiny``) caches every row.
    """
    mib = 1 << 20
    total = meta.total_rows
    rows = int(b.budget_mb * mib // row_bytes)
    staged_mb = b.batch_size * meta.num_features * row_bytes / mib  # one batch's rows (nocache, fae, hotline)
    fae_hot = max(b.budget_mb - staged_mb, 0.0)
    hot_rows = int(b.hot_share * rows)
    la = dict(mode="lookahead", lookahead=b.lookahead)
    return {
        "nocache": dict(mode="nocache"),
        "lru": dict(mode="lru", cache_rows=cache_slots(rows, total)),
        "fae": dict(mode="fae", hot_mb=fae_hot),
        "fae-split": dict(mode="fae", fae_schedule="split", hot_mb=fae_hot),
        "hotline": dict(mode="hotline", hot_mb=fae_hot),
        "lookahead": dict(la, cache_rows=cache_slots(rows, total)),
        "lookahead+hot": dict(la, cache_rows=cache_slots(rows - hot_rows, total), hot_mb=hot_rows * row_bytes / mib),
    }


def run(b: AccelBench) -> dict:
    from bagpipe.accel.profile import profile
    from bagpipe.data.shards import Dataset
    from bagpipe.models import recipe

    dim = recipe(b.model, b.recipe).embedding_dim
    state_dim = 1 if b.optimizer == "adagrad" else 0
    shape, row_bytes = tables(b), 4 * (dim + state_dim)
    refuse_no_hot_tier(b, shape, row_bytes)  # before --out is made or data generated
    refuse_unmeasurable(b, shape, row_bytes)
    out = b.out_dir
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    if ensure_synth(data, b.profile, b.samples or data_samples(b.batch_size, b.steps), b.scale, seed=1):
        shutil.rmtree(out / "store-template", ignore_errors=True)  # rows of another data set
        for f in out.glob("hot-*.npz"):
            f.unlink()
    ds = Dataset(data)
    meta = ds.meta
    settings = plan_budget(b, meta, 4 * (dim + state_dim))
    if b.store == "disk":
        materialise_disk_store(out / "store-template", meta, dim, state_dim, seed=0)
    profiles: dict[float, dict] = {}
    for key in b.configs:  # one profile per hot budget, as FAE profiles before training
        mb = settings[key].get("hot_mb")
        if mb is not None and mb not in profiles:
            path = out / f"hot-{mb:.3f}MiB.npz"
            t0 = time.perf_counter()
            hot = profile(ds, mb, dim=dim, state_dim=state_dim, sample_rate=b.hot_sample_rate, seed=0, progress=True)
            hot.save(path)
            profiles[mb] = {
                "file": path,
                "seconds": time.perf_counter() - t0,
                **{k: v for k, v in hot.report.items() if k not in ("tables", "table_sizes")},
            }
            print(f"profile for {mb:.1f} MiB: {hot.line()}", flush=True)
    results: dict[str, list[dict]] = {k: [] for k in b.configs}
    for rep in range(b.reps):
        for key in b.configs:
            print(f"[rep {rep + 1}/{b.reps}] {key} ...", flush=True)
            s = _run_one(b, out, key, settings[key], profiles)
            results[key].append(s)
            print(f"    {s['samples_per_s']:,.0f} samples/s, peak anon RSS {s['peak_anon_rss_mb']:.0f} MiB", flush=True)
    shutil.rmtree(out / "store-run", ignore_errors=True)
    payload = summarise(b, results, settings, profiles, meta.total_rows)
    _plot(out, payload)
    write_results(out, "accel", payload, payload["table"])
    return payload


def _run_one(b: AccelBench, out: Path, key: str, setting: dict, profiles: dict) -> dict:
    run_dir = out / "runs" / key.replace("+", "-")
    shutil.rmtree(run_dir, ignore_errors=True)
    opts = {k: v for k, v in setting.items() if k != "hot_mb"}
    if "hot_mb" in setting:
        opts["hot_rows"] = profiles[setting["hot_mb"]]["file"]
    store_dir = None
    if b.store == "disk":
        store_dir = out / "store-run"
        fresh_cold_copy(out / "store-template", store_dir)
    s = launch(
        b,
        data=out / "data",
        run_dir=run_dir,
        label=key,
        store=b.store,
        store_dir=store_dir,
        init_from_store=store_dir is not None or None,
        **opts,
    )
    shutil.rmtree(run_dir, ignore_errors=True)
    return s


def summarise(b: AccelBench, results: dict[str, list[dict]], settings: dict, profiles: dict, total_rows: int) -> dict:
    sps = {k: throughput(runs)[0] for k, runs in results.items()}
    ref = sps.get("lookahead", float("nan"))
    rows, res = [], {}
    for key, runs in results.items():
        med, spread = throughput(runs)
        cache = runs[0].get("cache") or {}
        hot = cache.get("hot") or {}
        sized = mode_spec(runs[0]["mode"]).sized_cache  # nocache, fae, hotline: one staged batch, no cache
        cold = cache.get("unique_rows", 1) > 0  # the planner saw a row: a hot tier can serve every lookup
        plan_ms = median([{"v": (r["cache"] or {}).get("planning_ms_per_step", float("nan"))} for r in runs], "v")
        split_ms = median(
            [{"v": ((r["cache"] or {}).get("hot") or {}).get("split_ms_per_step", 0.0)} for r in runs], "v"
        )
        res[key] = {
            "samples_per_s": med,
            "spread": spread,
            "ratio_to_lookahead": med / ref,
            "peak_anon_rss_mb": median(runs, "peak_anon_rss_mb"),
            "time_per_step_ms": step_times(runs),
            "mode": runs[0]["mode"],
            "hit_rate": cache.get("hit_rate") if sized and cold else None,
            "hot_lookup_share": hot.get("lookup_share"),
            "hot_rows": hot.get("rows", 0),
            "cache_rows": cache.get("cache_rows") if sized else None,
            "planning_ms_per_step": plan_ms,
            "hot_split_ms_per_step": split_ms,
            "popular_inputs_per_step": hot.get("popular_inputs_per_step"),
            "all_hot_batches": hot.get("all_hot_batches"),
            "eval_auc": median(runs, "eval_auc"),
            "eval_logloss": median(runs, "eval_logloss"),
            "settings": {k: str(v) for k, v in settings[key].items()},
            "runs": [r["samples_per_s"] for r in runs],
        }
        r = res[key]
        rows.append(
            [
                key,
                med,
                percent(spread),
                f"{med / ref:.2f}x",
                r["peak_anon_rss_mb"],
                r["hot_rows"],
                r["cache_rows"] if sized else "-",
                ("n/a" if not cold else _pct(r["hit_rate"])) if sized else "-",
                _pct(r["hot_lookup_share"]),
                plan_ms,
                split_ms if hot else "-",
                r["eval_auc"],
                r["eval_logloss"],
            ]
        )
    headers = [
        "config",
        "samples/s",
        "spread",
        "vs lookahead",
        "peak anon RSS MiB",
        "hot rows",
        "cache rows",
        "hit rate (cold)",
        "lookups served hot",
        "planner ms/step",
        "hot split ms/step",
        "eval AUC",
        "eval log loss",
    ]
    table = markdown_table(headers, rows)
    targets = {}
    if "lookahead+hot" in sps:
        peers = [sps[k] for k in ("fae", "hotline") if k in sps]
        targets = {
            "lookahead_hot_vs_lookahead": sps["lookahead+hot"] / ref,
            "lookahead_hot_vs_best_of_fae_hotline": sps["lookahead+hot"] / max(peers) if peers else None,
            "planning_ms_lookahead": res.get("lookahead", {}).get("planning_ms_per_step"),
            "planning_plus_split_ms_lookahead_hot": res["lookahead+hot"]["planning_ms_per_step"]
            + res["lookahead+hot"]["hot_split_ms_per_step"],
        }
    profile_info = {
        f"{mb:.3f}": {k: (str(v) if k == "file" else v) for k, v in p.items()} for mb, p in profiles.items()
    }
    return {
        **header(b),
        "total_rows": total_rows,
        "budget_mb": b.budget_mb,
        "profiles": profile_info,
        "results": res,
        "targets": targets,
        "table": table,
    }


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def _plot(out: Path, payload: dict) -> None:
    plt = pyplot()
    keys = list(payload["results"])
    res = payload["results"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    stacked_step_times(ax1, keys, [res[k]["time_per_step_ms"] for k in keys])
    ax1.set_title(f"time per iteration (budget {payload['budget_mb']:g} MiB)")
    ax1.legend(fontsize=8)
    ax1.tick_params(axis="x", rotation=30)
    ax2.bar(keys, [res[k]["samples_per_s"] for k in keys], color="tab:green")
    ax2.set_ylabel("samples/s")
    ax2.set_title("throughput")
    ax2.tick_params(axis="x", rotation=30)
    save_png(fig, out / "accel.png")
