"""``bagpipe bench approx``: the opt-in approximations against the exact runs they replace.

Every configuration is a separate ``bagpipe train`` process on the same data and model:

    exact        --mode full on one process: the reference
    skip-stale   the same with Slipstream's stale-input skip (--skip-stale, its defaults)
    dist-exact   --trainers N --servers S, the exact partitioned cache
    periodic     the same with cDLRM's periodic averaging (--cache-sync periodic:K)

on (a) generated data of the Criteo-Kaggle profile and (b) the preprocessed real Criteo
Kaggle sample in ``../shared/data`` (skipped with the reason printed when absent). For
each: samples/s (median of ``--reps`` interleaved repetitions without evaluations, and
the spread) and its ratio to the exact counterpart (skip-stale : exact, periodic :
dist-exact), the final eval AUC and log loss and their difference to the counterpart,
the bytes all-reduced per step (periodic beside the exact partitioned and replicated
caches), Slipstream's threshold and skipped share; and one more run per configuration
with ``--eval-every`` for the plot of eval AUC over steps (``approx.png``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bagpipe.bench.harness.report import (
    fixed,
    header,
    markdown_table,
    median,
    percent,
    pyplot,
    save_png,
    throughput,
    write_results,
)
from bagpipe.bench.harness.runner import data_samples, ensure_synth, run_train, train_args
from bagpipe.bench.harness.settings import CriteoSample, Throughput
from bagpipe.bench.scenarios.convergence.scenario import CRITEO_SAMPLE, SHARED_DATA, _preprocess_criteo

CONFIGS = ("exact", "skip-stale", "dist-exact", "periodic")
REFERENCE = {"exact": "exact", "skip-stale": "exact", "dist-exact": "dist-exact", "periodic": "dist-exact"}


@dataclass(kw_only=True)
class ApproxBench(CriteoSample, Throughput):
    """Exact runs vs Slipstream's stale-input skip (one process) and cDLRM's periodic
    averaging (data-parallel trainers): samples/s, eval AUC and log loss, bytes
    synchronised, eval AUC over steps; on generated Criteo-Kaggle-profile data and on the
    real Criteo sample in ../shared/data."""

    name = "approx"
    #: The tiny profile and the debug recipe; its distributed runs (2 trainers + a server + the
    #: oracle, each a process) make it a few minutes on two cores, not one.
    QUICK = dict(
        profile="tiny",
        scale=1.0,
        recipe="debug",
        batch_size=128,
        steps=60,
        warmup=5,
        reps=1,
        eval_every=20,
        eval_samples=2048,
        criteo_steps=40,
        criteo_eval_every=20,
        threads=1,
    )

    scale: float = 0.05
    steps: int = 600
    warmup: int = 20
    eval_samples: int = 50000
    configs: tuple[str, ...] = CONFIGS
    """Configurations to run: a comma-separated subset of """ + ",".join(CONFIGS) + """."""
    samples: int = 0
    """Inputs generated (0: just enough for --steps: one epoch)."""
    eval_every: int = 100
    """Eval points of the curve runs on the generated data (every N steps)."""
    period: int = 4
    """K of periodic: the trainers' copies are averaged every K steps."""
    stale_start: int = 0
    """s of skip-stale (bagpipe train --stale-start): the step its first snapshot follows."""
    trainers: int = 2
    """N, data-parallel trainers of dist-exact and periodic."""
    servers: int = 1
    """S, embedding servers of dist-exact and periodic."""
    cache_rows: int = 0
    """Cache slots of dist-exact and periodic (0: bagpipe train's default, 5% of the rows)."""

    def validate(self) -> None:
        super().validate()
        self.check_subset("configs", CONFIGS)
        for name in ("eval_every", "period", "servers"):
            self.check(name, getattr(self, name) >= 1, "must be >= 1")
        self.check("trainers", self.trainers >= 2, "must be >= 2 (periodic averages several trainers' copies)")
        self.check("samples", self.samples >= 0, "must be >= 0")
        self.check("cache_rows", self.cache_rows >= 0, "must be >= 0")
        self.check("stale_start", 0 <= self.stale_start < self.steps, "must be a step >= 0 and below --steps")


def _settings(b: ApproxBench, key: str) -> dict:
    dist = dict(mode="lookahead", trainers=b.trainers, servers=b.servers, cache_rows=b.cache_rows or None)
    table: dict[str, dict[str, Any]] = {
        "exact": dict(mode="full"),
        "skip-stale": dict(mode="full", skip_stale=True, stale_start=b.stale_start),
        "dist-exact": dict(dist, cache_sync="partitioned"),
        "periodic": dict(dist, cache_sync=f"periodic:{b.period}"),
    }
    return table[key]


def _curve(run_dir: Path) -> list[dict]:
    pts = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "eval_auc" in r:
            pts.append({"step": r["step"], "eval_auc": r["eval_auc"], "eval_logloss": r["eval_logloss"]})
    return pts


def _dataset(b: ApproxBench, name: str, data: Path, steps: int, batch: int, eval_every: int, out: Path) -> dict:
    common: dict[str, Any] = dict(
        steps=steps,
        batch_size=batch,
        eval_samples=b.eval_samples if name == "generated" else None,
        warmup_steps=min(b.warmup, steps - 1),
    )
    runs: dict[str, list[dict]] = {k: [] for k in b.configs}
    curves, commands = {}, {}
    for rep in range(b.reps + 1):  # rep 0: the curve runs (with evaluations); then the timed ones
        for key in b.configs:
            run_dir = out / "runs" / f"{name}-{key}-{rep}"
            shutil.rmtree(run_dir, ignore_errors=True)
            extra: dict[str, Any] = dict(eval_every=eval_every) if rep == 0 else {}
            args = train_args(b, data, run_dir, **common, **_settings(b, key), **extra)
            label = "curve" if rep == 0 else f"rep {rep}/{b.reps}"
            print(f"{name} [{label}] {key} ...", flush=True)
            s = run_train(args, run_dir / "summary.json", f"approx {name}/{key}", timeout=b.run_timeout_s or None)
            if rep == 0:
                curves[key] = _curve(run_dir)
                commands[key] = "bagpipe train " + " ".join(args).replace(str(out) + "/", "")
            else:
                runs[key].append(s)
            print(
                f"    {s['samples_per_s']:,.0f} samples/s, eval AUC {fixed(s['eval_auc'])}, log loss {fixed(s['eval_logloss'])}",
                flush=True,
            )
            shutil.rmtree(run_dir, ignore_errors=True)
    res = {}
    for key, rs in runs.items():
        med, spread = throughput(rs)
        s = rs[0]
        d = s.get("distributed") or {}
        approx = s.get("approximation") or {}
        skip = approx.get("skip_stale") or {}
        res[key] = {
            "samples_per_s": med,
            "spread": spread,
            "runs": [r["samples_per_s"] for r in rs],
            "eval_auc": median(rs, "eval_auc"),
            "eval_logloss": median(rs, "eval_logloss"),
            "exact": s["exact"],
            "sync_bytes_per_step": d.get("sync_bytes_per_step"),
            "partitioned_sync_bytes_per_step": d.get("partitioned_sync_bytes_per_step"),
            "replicated_sync_bytes_per_step": d.get("replicated_sync_bytes_per_step"),
            "threshold": skip.get("threshold"),
            "skipped_share": skip.get("skipped_share"),
            "skip_stale": skip or None,
            "curve": curves.get(key, []),
            "command": commands.get(key),
        }
    for key, r in res.items():
        ref = res.get(REFERENCE[key])
        r["reference"] = REFERENCE[key] if ref is not None else None
        r["ratio"] = r["samples_per_s"] / ref["samples_per_s"] if ref else None
        r["auc_diff"] = r["eval_auc"] - ref["eval_auc"] if ref else None
        r["logloss_diff"] = r["eval_logloss"] - ref["eval_logloss"] if ref else None
    return {"dataset": name, "steps": steps, "batch_size": batch, "eval_every": eval_every, "results": res}


def run(b: ApproxBench) -> dict:
    out = b.out_dir
    out.mkdir(parents=True, exist_ok=True)
    datasets: dict[str, dict] = {}
    data = out / "data-generated"
    ensure_synth(data, b.profile, b.samples or data_samples(b.batch_size, b.steps), b.scale, seed=1, progress=False)
    datasets["generated"] = _dataset(b, "generated", data, b.steps, b.batch_size, b.eval_every, out)
    skipped = None
    src = (Path(b.shared_data) if b.shared_data else SHARED_DATA) / CRITEO_SAMPLE
    if not b.criteo:
        skipped = "turned off (--no-criteo)"
    elif not src.exists():
        skipped = f"{src} not found (the real data samples live in ../shared/data next to the repository)"
    if skipped:
        print(f"criteo sample skipped: {skipped}", flush=True)
    else:
        cdata = out / "data-criteo"
        _preprocess_criteo(src, cdata)
        datasets["criteo-kaggle-sample"] = _dataset(
            b, "criteo-kaggle-sample", cdata, b.criteo_steps, b.criteo_batch_size, b.criteo_eval_every, out
        )
    shutil.rmtree(out / "runs", ignore_errors=True)
    table = _table(datasets) + (f"\n\nCriteo sample skipped: {skipped}." if skipped else "")
    payload = {**header(b), "datasets": datasets, "criteo_skipped": skipped, "table": table}
    _plot(out, datasets)
    write_results(out, "approx", payload, table)
    return payload


def _mib(x) -> str:
    return "-" if x is None else f"{x / 2**20:.3f}"


def _signed(x) -> str:
    return "-" if x is None else f"{x:+.4f}"


def _table(datasets: dict) -> str:
    rows = []
    for name, d in datasets.items():
        for key, r in d["results"].items():
            skip = "-" if r["threshold"] is None else f"T = {r['threshold']:.3g}, {r['skipped_share']:.1%} skipped"
            rows.append(
                [
                    name,
                    key,
                    r["samples_per_s"],
                    percent(r["spread"]),
                    "-" if key == r["reference"] or r["ratio"] is None else f"{r['ratio']:.2f}x vs {r['reference']}",
                    f"{fixed(r['eval_auc'])}",
                    "-" if key == r["reference"] else _signed(r["auc_diff"]),
                    f"{fixed(r['eval_logloss'])}",
                    "-" if key == r["reference"] else _signed(r["logloss_diff"]),
                    _mib(r["sync_bytes_per_step"]),
                    _mib(r["partitioned_sync_bytes_per_step"]),
                    _mib(r["replicated_sync_bytes_per_step"]),
                    skip,
                ]
            )
    headers = [
        "dataset",
        "config",
        "samples/s",
        "spread",
        "vs exact",
        "eval AUC",
        "AUC diff",
        "eval log loss",
        "log loss diff",
        "MiB synced/step",
        "partitioned MiB/step",
        "replicated MiB/step",
        "skip-stale",
    ]
    return markdown_table(headers, rows)


def _plot(out: Path, datasets: dict) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(datasets), figsize=(6.5 * len(datasets), 4.2), squeeze=False)
    for ax, (name, d) in zip(axes[0], datasets.items()):
        for key, r in d["results"].items():
            pts = r["curve"]
            ax.plot(
                [p["step"] for p in pts],
                [p["eval_auc"] for p in pts],
                marker="o",
                markersize=4,
                linestyle="--" if key in ("skip-stale", "periodic") else "-",
                label=key,
            )
        ax.set_title(f"{name}: eval AUC over steps")
        ax.set_xlabel("step")
        ax.set_ylabel("eval AUC")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_png(fig, out / "approx.png")
