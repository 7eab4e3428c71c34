"""``bagpipe bench modes``: full / nocache / lru / lookahead side by side.

Every run is a separate ``bagpipe train`` process (so peak memory is per mode) on the
same generated data, model, batch and optimizer. Disk-store runs start from a copy of
a fully written table file whose pages are dropped from the page cache first, so they
read from the device, not from memory.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bagpipe.bench.report import machine, markdown_table, median_spread, write_results
from bagpipe.bench.runner import ensure_synth, run_train
from bagpipe.errors import ConfigError

ALL_MODES = ("full", "nocache", "lru", "lookahead")


@dataclass(kw_only=True)
class ModesBench:
    """Settings of the modes scenario (defaults: the issue's Criteo Kaggle configuration)."""

    out: str = "bench-out/modes"
    profile: str = "criteo-kaggle"
    scale: float = 1.0
    """Table cardinality factor (1.0: 33.8M rows)."""
    model: str = "dlrm"
    recipe: str = "kaggle"
    batch_size: int = 2048
    optimizer: str = "adagrad"
    lr: float = 0.05
    steps: int = 60
    warmup: int = 10
    reps: int = 2
    stores: tuple[str, ...] = ("memory", "disk")
    modes: tuple[str, ...] = ALL_MODES
    cache_fraction: float = 0.05
    """Cache slots as a fraction of all rows (lru, lookahead)."""
    lookahead: int = 20
    threads: int = 0
    keep_data: bool = True

    def __post_init__(self):
        bad = [m for m in self.modes if m not in ALL_MODES]
        if bad:
            raise ConfigError(f"unknown mode(s) {bad}; choose from {ALL_MODES}")
        if any(s not in ("memory", "disk") for s in self.stores):
            raise ConfigError(f"stores must be memory and/or disk, got {self.stores}")
        if self.steps <= self.warmup:
            raise ConfigError("steps must exceed warmup")
        if not 0 < self.cache_fraction <= 1:
            raise ConfigError("cache_fraction must be in (0, 1]")

    @classmethod
    def quick(cls, **kw) -> "ModesBench":
        base = dict(scale=0.01, batch_size=256, recipe="debug", steps=8, warmup=2, reps=1, lookahead=8, stores=("memory",))
        base.update(kw)
        return cls(**base)


def _run_train(b: ModesBench, data: Path, run_dir: Path, mode: str, store: str, store_dir: Path | None, cache_rows: int) -> dict:
    args = [
        "--data", str(data), "--out", str(run_dir),
        "--model", b.model, "--recipe", b.recipe, "--batch-size", str(b.batch_size),
        "--optimizer", b.optimizer, "--lr", str(b.lr), "--steps", str(b.steps), "--warmup-steps", str(b.warmup),
        "--mode", mode, "--store", store, "--cache-rows", str(cache_rows), "--lookahead", str(b.lookahead),
        "--no-progress", "--no-final-checkpoint", "--no-digest", "--eval-samples", "20000",
    ]
    if b.threads:
        args += ["--threads", str(b.threads)]
    if store_dir is not None:
        args += ["--store-dir", str(store_dir)]
    return run_train(args, run_dir / "summary.json", f"{mode}/{store}")


def _materialise_disk_store(template: Path, data_meta, dim: int, state_dim: int, seed: int) -> None:
    """Write every row's initial value to a disk store once (the table as it would exist on disk)."""
    from tqdm import tqdm

    from bagpipe.store.disk import DiskStore
    from bagpipe.store.init import RowInitializer

    if (template / "header.json").exists():
        return
    init = RowInitializer(data_meta.table_sizes, dim, seed)
    store = DiskStore(init, state_dim, template)
    chunk = 1 << 20
    for a in tqdm(range(0, init.num_rows, chunk), desc="writing table file", unit="Mi rows"):
        b = min(a + chunk, init.num_rows)
        rows = np.arange(a, b, dtype=np.int64)
        store.write(rows, init.rows(rows), np.zeros((b - a, state_dim), np.float32))
    store.close()


def _fresh_cold_copy(template: Path, dest: Path) -> None:
    """Copy the table files and drop both copies from the page cache (fsync first, so
    the dirty pages of the new copy can be dropped)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(template, dest)
    for f in [*dest.iterdir(), *template.iterdir()]:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run(b: ModesBench) -> dict:
    from bagpipe.data.schema import DatasetMeta
    from bagpipe.models import recipe

    out = Path(b.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    samples = b.batch_size * (b.steps + 2)
    samples = int(samples / 0.9) + 1
    ensure_synth(data, b.profile, samples, b.scale, seed=1)
    meta = DatasetMeta.load(data)
    total = meta.total_rows
    cache_rows = max(int(b.cache_fraction * total), b.batch_size * meta.num_features)
    dim = recipe(b.model, b.recipe).embedding_dim
    state_dim = 1 if b.optimizer == "adagrad" else 0
    template = out / "store-template"
    if "disk" in b.stores and any(m != "full" for m in b.modes):
        _materialise_disk_store(template, meta, dim, state_dim, seed=0)

    configs = []
    for store in b.stores:
        for mode in b.modes:
            if mode == "full" and store == "disk":
                continue  # full is always in memory: the limit the others are held to
            configs.append((mode, store))
    if "full" in b.modes and ("full", "memory") not in configs:
        configs.insert(0, ("full", "memory"))
    results: dict[str, list[dict]] = {f"{m}/{s}": [] for m, s in configs}
    for rep in range(b.reps):
        for mode, store in configs:
            key = f"{mode}/{store}"
            print(f"[rep {rep + 1}/{b.reps}] {key} ...", flush=True)
            run_dir = out / "runs" / f"{mode}-{store}-{rep}"
            if run_dir.exists():
                shutil.rmtree(run_dir)
            store_dir = None
            if store == "disk" and mode != "full":
                store_dir = out / "store-run"
                _fresh_cold_copy(template, store_dir)
            s = _run_train(b, data, run_dir, mode, store, store_dir, cache_rows)
            results[key].append(s)
            print(f"    {s['samples_per_s']:,.0f} samples/s, peak anon RSS {s['peak_anon_rss_mb']:.0f} MiB", flush=True)
            shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(out / "store-run", ignore_errors=True)
    payload = summarise(b, results, total, cache_rows)
    _plot(out, payload)
    write_results(out, "modes", payload, payload["table"])
    return payload


def summarise(b: ModesBench, results: dict[str, list[dict]], total_rows: int, cache_rows: int) -> dict:
    full = results.get("full/memory", [])
    full_sps = median_spread([r["samples_per_s"] for r in full])[0] if full else float("nan")
    full_rss = median_spread([r["peak_anon_rss_mb"] for r in full])[0] if full else float("nan")
    rows, out = [], {}
    for key, runs in results.items():
        sps, spread = median_spread([r["samples_per_s"] for r in runs])
        anon = median_spread([r["peak_anon_rss_mb"] for r in runs])[0]
        peak = median_spread([r["peak_rss_mb"] for r in runs])[0]
        bd = {k: median_spread([r["time_per_step_ms"][k] for r in runs])[0] for k in runs[0]["time_per_step_ms"]}
        cache = runs[0].get("cache", {})
        hit = cache.get("hit_rate", float("nan"))
        digests = sorted({r.get("params_sha256") for r in runs})
        out[key] = {
            "samples_per_s": sps, "spread": spread, "ratio_to_full": sps / full_sps,
            "peak_anon_rss_mb": anon, "peak_rss_mb": peak, "anon_rss_ratio_to_full": anon / full_rss,
            "time_per_step_ms": bd, "hit_rate": hit, "cache": cache, "params_sha256": digests,
            "runs": [r["samples_per_s"] for r in runs],
        }
        rows.append([key, sps, f"{spread:.0%}", f"{sps / full_sps:.2f}x", anon, f"{anon / full_rss:.0%}", peak,
                     "-" if hit != hit else f"{hit:.1%}", cache.get("forced_evictions", "-")])
    headers = ["mode/store", "samples/s", "spread", "vs full", "peak anon RSS MiB", "vs full", "peak RSS MiB (incl. mapped file)", "hit rate", "forced evictions"]
    table = markdown_table(headers, rows)
    return {
        "scenario": "modes", "config": asdict(b), "machine": machine(), "total_rows": total_rows,
        "cache_rows": cache_rows, "cache_fraction_of_rows": cache_rows / total_rows, "results": out, "table": table,
    }


def _plot(out: Path, payload: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(payload["results"])
    parts = ["wait_embeddings", "forward", "backward", "optimizer", "writeback"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    bottom = np.zeros(len(keys))
    for p in parts:
        vals = np.array([payload["results"][k]["time_per_step_ms"].get(p, 0.0) for k in keys])
        ax1.bar(keys, vals, bottom=bottom, label=p)
        bottom += vals
    ax1.set_ylabel("ms per step (trainer thread)")
    ax1.set_title("time breakdown per iteration")
    ax1.legend(fontsize=8)
    ax1.tick_params(axis="x", rotation=30)
    sps = [payload["results"][k]["samples_per_s"] for k in keys]
    ax2.bar(keys, sps, color="tab:green")
    ax2.set_ylabel("samples/s")
    ax2.set_title("throughput")
    ax2.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(out / "modes.png", dpi=110)
    plt.close(fig)
