"""``bagpipe bench mlperf``: an MLPerf-sized DLRM-DCNv2 trained on this machine's disk.

The ``criteo-1tb`` profile (MLPerf DLRM-DCNv2's 26 tables capped at 40M rows, 204.2M
rows, multi-hot: 214 ids a sample) and the ``dcn-mlperf`` recipe (D = 128, bottom MLP
512-256-128, three rank-512 DCN-v2 cross layers, top MLP 1024-1024-512-256-1) with
row-wise Adagrad: 204.2M rows x (128 + 1) floats = 105 GB of rows and optimizer state,
four times this machine's memory. One ``bagpipe train --mode lookahead --store disk``
process trains ``--steps`` batches on a fresh disk store: sparse files (nothing is
allocated until a row is written back) and lazy initialisation (a row never written
reads as its initial value, computed on the fly). No memory limit is imposed; the
trainer's own peak memory is the figure.

Reported: samples/s (warm-up excluded), the wall time of the steps and of the whole
process, the trainer's peak RSS (and anonymous RSS), the disk the store's files
occupy (allocated blocks) against their apparent size, bytes read and written per
step, the cache's hit rate and forced evictions, and the oracle's own state (its row
map grows with the window, not with the 204M-row table). The store is deleted after
the run unless ``--keep-store`` (after the results are written: freeing the scattered
blocks of the written rows took minutes here, the filesystem trimming each one).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from bagpipe.bench.harness.report import (
    header,
    markdown_table,
    pyplot,
    save_png,
    stacked_step_times,
    write_results,
)
from bagpipe.bench.harness.runner import launch, prepare
from bagpipe.bench.harness.settings import Model, OnDevice, Profile, Recipe, Throughput


@dataclass(kw_only=True)
class MLPerfBench(OnDevice, Throughput):
    """MLPerf DLRM-DCNv2 at full size (criteo-1tb profile: 204.2M rows, 105 GB with Adagrad
    state) trained for a bounded number of steps with the lookahead cache on a fresh sparse
    disk store. With --device cuda it is cDLRM's setting: tables and optimizer state larger
    than the GPU's memory, the cache on the GPU fed from the disk store."""

    name = "mlperf"
    QUICK = dict(
        scale=0.0005, batch_size=128, steps=4, warmup=1, cache_rows=60_000, lookahead=2, eval_samples=256, threads=1
    )

    profile: Profile = "criteo-1tb"
    model: Model = "dcn"
    recipe: Recipe = "dcn-mlperf"
    batch_size: int = 2048
    steps: int = 20
    warmup: int = 4
    reps: int = 1
    lr: float = 0.005
    """Learning rate (0.05, the other scenarios' default, diverged here: loss 4.5e11 by step 10)."""
    eval_samples: int = 2048
    cache_rows: int = 2_000_000
    """Cache slots of the lookahead run (each holds D + S floats: 516 bytes at D = 128)."""
    lookahead: int = 4
    """L, batches the lookahead oracle reads ahead."""
    keep_store: bool = False
    """Keep OUT/store (the sparse table files) after the run."""

    def validate(self) -> None:
        super().validate()
        self.check("cache_rows", self.cache_rows >= 1, "must be >= 1")
        self.check("lookahead", self.lookahead >= 1, "must be >= 1")


def allocated(path: Path) -> tuple[int, int]:
    """(allocated bytes, apparent bytes) of the files under ``path``."""
    used = size = 0
    for f in path.iterdir():
        st = os.stat(f)
        used += st.st_blocks * 512
        size += st.st_size
    return used, size


def run(b: MLPerfBench) -> dict:
    t0 = time.perf_counter()
    out, data, meta = prepare(b)
    data_s = time.perf_counter() - t0
    store_dir = out / "store"
    runs = []
    for rep in range(b.reps):
        shutil.rmtree(store_dir, ignore_errors=True)  # every run starts from fresh (sparse, lazy) tables
        run_dir = out / "runs" / f"lookahead-{rep}"
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"[rep {rep + 1}/{b.reps}] lookahead on {meta.total_rows:,} rows ...", flush=True)
        s = launch(
            b,
            data,
            run_dir,
            "lookahead",
            mode="lookahead",
            store="disk",
            store_dir=store_dir,
            cache_rows=b.cache_rows,
            lookahead=b.lookahead,
        )
        s["disk_used_bytes"], s["disk_apparent_bytes"] = allocated(store_dir)
        runs.append(s)
        print(
            f"    {s['samples_per_s']:,.0f} samples/s, {s['seconds']:.0f} s of steps, peak RSS {s['peak_rss_mb']:,.0f} MiB, "
            f"disk {s['disk_used_bytes'] / 2**30:.2f} GiB used of {s['disk_apparent_bytes'] / 2**30:,.0f} GiB",
            flush=True,
        )
        shutil.rmtree(run_dir, ignore_errors=True)
    payload = summarise(b, runs, meta, data_s)
    _plot(out, payload)
    write_results(out, "mlperf", payload, payload["table"])
    if not b.keep_store:
        # can take minutes: the written rows are scattered 4 KiB blocks, and a filesystem
        # mounted with `discard` (this machine's ext4) trims each one as it is freed
        print(f"deleting {store_dir} (--keep-store keeps it) ...", flush=True)
        shutil.rmtree(store_dir, ignore_errors=True)
    return payload


def summarise(b: MLPerfBench, runs: list[dict], meta, data_s: float) -> dict:
    from bagpipe.bench.harness.report import median_spread, step_times

    sps, spread = median_spread([r["samples_per_s"] for r in runs])
    r = runs[0]
    cache = r.get("cache") or {}
    io = r.get("io_per_step") or {}
    dim = r.get("embedding_dim", 0)
    table_gb = meta.total_rows * 4 * (dim + 1) / 1e9
    res = {
        "samples_per_s": sps,
        "spread": spread,
        "runs": [x["samples_per_s"] for x in runs],
        "step_s": b.batch_size / sps if sps else float("nan"),
        "steps_seconds": r["seconds"],
        "process_wall_s": r["wall_s"],
        "peak_rss_mb": max(x["peak_rss_mb"] for x in runs),
        "peak_anon_rss_mb": max(x["peak_anon_rss_mb"] for x in runs),
        "disk_used_gib": r["disk_used_bytes"] / 2**30,
        "disk_apparent_gib": r["disk_apparent_bytes"] / 2**30,
        "read_mb_per_step": io.get("read_bytes", float("nan")) / 2**20,
        "written_mb_per_step": io.get("write_bytes", float("nan")) / 2**20,
        "hit_rate": cache.get("hit_rate"),
        "forced_evictions": cache.get("forced_evictions"),
        "planner_state_mb": cache.get("state_mb"),
        "per_row_map_mb": meta.total_rows * 4 / 2**20,
        "time_per_step_ms": step_times(runs),
        "eval_auc": r.get("eval_auc"),
        "train_logloss": r.get("train_logloss"),
    }
    rows = [
        [
            f"{meta.total_rows:,} rows ({table_gb:,.0f} GB with state)",
            sps,
            res["step_s"],
            res["steps_seconds"],
            res["process_wall_s"],
            res["peak_rss_mb"],
            f"{res['disk_used_gib']:.2f} / {res['disk_apparent_gib']:,.0f}",
            res["read_mb_per_step"],
            res["written_mb_per_step"],
            "-" if res["hit_rate"] is None else f"{res['hit_rate']:.1%}",
            res["forced_evictions"],
            res["planner_state_mb"],
            res["per_row_map_mb"],
        ]
    ]
    headers = [
        "tables",
        "samples/s",
        "s/step",
        "s of steps",
        "process wall s",
        "peak RSS MiB",
        "disk GiB used / apparent",
        "MiB read/step",
        "MiB written/step",
        "hit rate",
        "forced evictions",
        "oracle state MiB",
        "a per-row map would be MiB",
    ]
    table = markdown_table(headers, rows) + (
        f"\n\n- {b.steps} steps of batch {b.batch_size} (warm-up {b.warmup}), L = {b.lookahead}, "
        f"{b.cache_rows:,} cache rows; data generated in {data_s:.0f} s; steps finished in "
        f"{res['steps_seconds'] / 60:.1f} min (target < 10 min: {'met' if res['steps_seconds'] < 600 else 'missed'})"
    )
    return {
        **header(b),
        "total_rows": meta.total_rows,
        "table_gb": table_gb,
        "data_seconds": data_s,
        "results": {"lookahead": res},
        "table": table,
    }


def _plot(out: Path, payload: dict) -> None:
    plt = pyplot()
    res = payload["results"]["lookahead"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    stacked_step_times(ax1, ["lookahead"], [res["time_per_step_ms"]])
    ax1.set_title(f"time per iteration ({payload['total_rows'] / 1e6:.0f}M rows)")
    ax1.legend(fontsize=8)
    names = ["peak RSS", "oracle state", "disk used", "tables (apparent)"]
    vals = [
        res["peak_rss_mb"] / 1024,
        (res["planner_state_mb"] or 0) / 1024,
        res["disk_used_gib"],
        res["disk_apparent_gib"],
    ]
    ax2.bar(names, vals, color=["tab:blue", "tab:orange", "tab:green", "tab:gray"])
    ax2.set_yscale("log")
    ax2.set_ylabel("GiB")
    ax2.set_title("memory and disk")
    save_png(fig, out / "mlperf.png")
