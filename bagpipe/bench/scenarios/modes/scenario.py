"""``bagpipe bench modes``: full / nocache / lru / lookahead side by side.

Every run is a separate ``bagpipe train`` process (so peak memory is per mode) on the
same generated data, model, batch and optimizer. Disk-store runs start from a copy of
a fully written table file whose pages are dropped from the page cache first, so they
read from the device, not from memory.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from bagpipe.bench.harness.report import (
    forward_backward,
    header,
    markdown_table,
    median,
    median_spread,
    outside_compute,
    percent,
    pipeline_cpu,
    pyplot,
    save_png,
    stacked_step_times,
    step_times,
    throughput,
    times,
    write_results,
)
from bagpipe.bench.harness.runner import launch, prepare
from bagpipe.bench.harness.settings import CachePoint, Loaded, OnDevice, Throughput
from bagpipe.config.modes import mode_spec
from bagpipe.config.train import only_applicable
from bagpipe.optim.names import row_state_dim
from bagpipe.testbed.load import BackgroundLoad

ALL_MODES = ("full", "nocache", "lru", "lookahead")
STORES = ("memory", "disk", "disk-identity", "disk-frequency")
"""disk: the disk store in the row layout ``bagpipe train``'s default (``--store-layout auto``)
gives these runs; disk-identity and disk-frequency: in the layout named (each layout its own
template): the same modes on the same table file, its rows placed by slot or by use."""
TEMPLATES = {"identity": "store-template", "frequency": "store-template-frequency"}


@dataclass(kw_only=True)
class ModesBench(OnDevice, Loaded, CachePoint, Throughput):
    """Every mode (full, nocache, lru, lookahead) side by side on generated Criteo-Kaggle-sized
    data (33.8M rows at the default --scale 1; DLRM Kaggle recipe, batch 2048, Adagrad), with
    the memory and the disk store; full always runs in memory, the reference of the ratios.
    With --device cuda every run computes on the GPU: full with every table in GPU memory,
    the others with the cache on the GPU and the store in host memory or on disk.
    --background-load N measures a busy machine: N CPU-bound processes run beside every run."""

    name = "modes"
    QUICK = dict(scale=0.01, batch_size=256, recipe="debug", steps=8, warmup=2, reps=1, lookahead=8, stores=("memory",))

    modes: tuple[str, ...] = ALL_MODES
    """Modes to run: a comma-separated subset of full,nocache,lru,lookahead."""
    stores: tuple[str, ...] = ("memory", "disk")
    """Stores the non-full modes run with: a comma-separated subset of memory,disk,disk-identity,
    disk-frequency (disk: in the row layout train's default --store-layout auto picks for these
    runs; the others in the layout they name)."""

    def validate(self) -> None:
        super().validate()
        self.check_subset("modes", ALL_MODES)
        self.check_subset("stores", STORES)


def run_mode(b, data: Path, out: Path, run_dir: Path, mode: str, store: str, cache_rows: int) -> dict:
    """One ``bagpipe train --mode MODE --store STORE`` run (modes, peers); a disk store
    starts from a cold copy of OUT/store-template (:func:`fresh_cold_copy`)."""
    store_dir = None
    if store != "memory" and mode_spec(mode).store:
        store_dir = out / "store-run"
        fresh_cold_copy(
            out / TEMPLATES[layout_of(store, b.steps, b.batch_size, data)], store_dir
        )  # the store keeps the template's layout
    # the table file holds every row's initial value: the same starting tables as a fresh store
    return launch(
        b,
        data,
        run_dir,
        f"{mode}/{store}",
        **only_applicable(
            dict(
                mode=mode,
                store="memory" if store == "memory" else "disk",
                cache_rows=cache_rows,
                lookahead=b.lookahead,
                store_dir=store_dir,
                init_from_store=store_dir is not None or None,
            )
        ),
    )


def materialise_disk_store(template: Path, data_meta, dim: int, state_dim: int, seed: int, layout=None) -> None:
    """Write every row's initial value to a disk store once (the table as it would exist on
    disk), in the row layout ``layout`` (:class:`~bagpipe.store.layout.RowLayout`; None:
    identity). A template of other tables or another layout is made again."""
    from tqdm import tqdm

    from bagpipe.errors import DataError
    from bagpipe.store.disk import DiskStore, read_header
    from bagpipe.store.init import RowInitializer
    from bagpipe.store.rowlog import log_slots

    init = RowInitializer(data_meta.table_sizes, dim, seed)
    try:  # a damaged template (an interrupted bench) is made again, not a traceback
        h = read_header(template) if (template / "header.json").exists() else None
    except DataError:
        h = None
    if h is not None:
        want = (
            {"packed_rows": layout.num_packed, "crc32": layout.crc32(), "log_slots": log_slots(layout.num_packed)}
            if layout is not None and layout.num_packed
            else None
        )
        lay = h.get("layout")
        have = {k: lay.get(k) for k in ("packed_rows", "crc32", "log_slots")} if isinstance(lay, dict) else None
        same = (h.get("dim"), h.get("state_dim"), h.get("table_sizes"), h.get("seed")) == (
            dim,
            state_dim,
            data_meta.table_sizes,
            seed,
        )
        if same and want == have:
            return
    if template.exists():
        shutil.rmtree(template)
    store = DiskStore(init, state_dim, template, layout=layout)
    chunk = 1 << 20
    for a in tqdm(range(0, init.num_rows, chunk), desc="writing table file", unit="Mi rows"):
        b = min(a + chunk, init.num_rows)
        rows = np.arange(a, b, dtype=np.int64)
        store.load(rows, init.rows(rows), np.zeros((b - a, state_dim), np.float32))  # every row at its home
    store.close()


def fresh_cold_copy(template: Path, dest: Path) -> None:
    """Copy the table files and drop both copies from the page cache (fsync first, so
    the dirty pages of the new copy can be dropped)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(template, dest)
    drop_cached(dest)
    drop_cached(template)


def layout_of(store: str, steps: int, batch_size: int, data: Path) -> Literal["identity", "frequency"]:
    """The row layout of a disk store of the table: ``disk-identity``, ``disk-frequency``
    name theirs; ``disk`` is in the one ``bagpipe train --store-layout auto`` picks for a run
    of ``steps`` batches of ``batch_size`` over the train split in ``data``
    (:func:`bagpipe.budget.shape.auto_layout`)."""
    if store == "disk-identity":
        return "identity"
    if store == "disk-frequency":
        return "frequency"
    from bagpipe.budget.shape import auto_layout, frequency_peak
    from bagpipe.data.schema import DatasetMeta

    meta = DatasetMeta.load(data)
    n, F = meta.num_samples(), meta.num_features  # one-hot: a lookup a feature
    return auto_layout(steps, n // batch_size, frequency_peak(meta.total_rows, n * F, F)).name


def make_templates(
    stores, steps: int, batch_size: int, out: Path, data: Path, meta, dim: int, state_dim: int, seed: int
) -> None:
    """Write the table file of each row layout the disk ``stores`` need (:func:`layout_of`:
    OUT/store-template, OUT/store-template-frequency), once (:func:`materialise_disk_store`)."""
    for name in sorted({layout_of(s, steps, batch_size, data) for s in stores if s != "memory"}, reverse=True):
        layout = None
        if name == "frequency":
            from bagpipe.data.frequency import frequency_store_layout
            from bagpipe.data.shards import Dataset

            layout = frequency_store_layout(Dataset(data))
        materialise_disk_store(out / TEMPLATES[name], meta, dim, state_dim, seed=seed, layout=layout)


def drop_cached(store_dir: Path) -> None:
    """fsync every file of the store and drop it from the page cache."""
    for f in store_dir.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run(b: ModesBench) -> dict:
    from bagpipe.models import recipe

    out, data, meta = prepare(b)
    total = meta.total_rows
    cache_rows = b.cache_rows(total, b.batch_size * meta.num_features)
    dim = recipe(b.model, b.recipe).embedding_dim
    state_dim = row_state_dim(b.optimizer, dim)
    if any(m != "full" for m in b.modes):
        make_templates(b.stores, b.steps, b.batch_size, out, data, meta, dim, state_dim, seed=0)

    configs = []
    for store in b.stores:
        for mode in b.modes:
            if mode_spec(mode).store or store == "memory":  # the full tables are always in memory
                configs.append((mode, store))
    for mode in b.modes:  # the reference, held to no store's limit, even when only disk is measured
        if not mode_spec(mode).store and (mode, "memory") not in configs:
            configs.insert(0, (mode, "memory"))
    results: dict[str, list[dict]] = {f"{m}/{s}": [] for m, s in configs}
    with BackgroundLoad(b.background_load) as load:
        if b.background_load:
            print(f"background load: {b.background_load} CPU-bound process(es) {load.pids}", flush=True)
        for rep in range(b.reps):
            for mode, store in configs:
                key = f"{mode}/{store}"
                print(f"[rep {rep + 1}/{b.reps}] {key} ...", flush=True)
                run_dir = out / "runs" / f"{mode}-{store}-{rep}"
                if run_dir.exists():
                    shutil.rmtree(run_dir)
                s = run_mode(b, data, out, run_dir, mode, store, cache_rows)
                results[key].append(s)
                print(f"    {s['samples_per_s']:,.0f} samples/s, {pipeline_line(s)}", flush=True)
                shutil.rmtree(run_dir, ignore_errors=True)
    shutil.rmtree(out / "store-run", ignore_errors=True)
    payload = summarise(b, results, total, cache_rows)
    _plot(out, payload)
    write_results(out, "modes", payload, payload["table"])
    return payload


def pipeline_line(run: dict) -> str:
    share = run.get("pipeline_cpu_share")
    return (
        f"forward+backward {forward_backward(run):.1f} ms, outside compute {outside_compute(run):.1f} ms, "
        f"pipeline CPU {pipeline_cpu(run):.1f} ms/step ({0 if share is None else share:.0%} of compute), "
        f"peak anon RSS {run['peak_anon_rss_mb']:.0f} MiB"
    )


def summarise(b: ModesBench, results: dict[str, list[dict]], total_rows: int, cache_rows: int) -> dict:
    full = results.get("full/memory", [])
    full_sps, full_rss = median(full, "samples_per_s"), median(full, "peak_anon_rss_mb")
    full_fb = median_spread([forward_backward(r) for r in full])[0]
    rows, out = [], {}
    for key, runs in results.items():
        sps, spread = throughput(runs)
        fb = median_spread([forward_backward(r) for r in runs])[0]
        outside = median_spread([outside_compute(r) for r in runs])[0]
        pcpu = median_spread([pipeline_cpu(r) for r in runs])[0]
        share = median_spread([r.get("pipeline_cpu_share") or 0.0 for r in runs])[0]
        anon, peak = median(runs, "peak_anon_rss_mb"), median(runs, "peak_rss_mb")
        cache = runs[0].get("cache") or {}
        hit = cache.get("hit_rate", float("nan"))
        digests = sorted({r.get("params_sha256") for r in runs}, key=str)
        out[key] = {
            "samples_per_s": sps,
            "spread": spread,
            "ratio_to_full": sps / full_sps,
            "peak_anon_rss_mb": anon,
            "peak_rss_mb": peak,
            "anon_rss_ratio_to_full": anon / full_rss,
            "time_per_step_ms": step_times(runs),
            "hit_rate": hit,
            "cache": cache,
            "params_sha256": digests,
            "runs": [r["samples_per_s"] for r in runs],
            "forward_backward_ms": fb,
            "forward_backward_vs_full": fb / full_fb,
            "outside_compute_ms": outside,
            "pipeline_cpu_ms": pcpu,
            "pipeline_cpu_share": share,
            "threads_per_step_ms": [r.get("threads_per_step_ms") for r in runs],
        }
        rows.append(
            [
                key,
                sps,
                percent(spread),
                times(sps / full_sps),
                anon,
                percent(anon / full_rss),
                peak,
                "-" if hit != hit else f"{hit:.1%}",
                cache.get("forced_evictions", "-"),
                times(fb / full_fb),
                f"{outside:.1f}",
                f"{pcpu:.1f} ({share:.0%})",
            ]
        )
    headers = [
        "mode/store",
        "samples/s",
        "spread",
        "vs full",
        "peak anon RSS MiB",
        "vs full",
        "peak RSS MiB (incl. mapped file)",
        "hit rate",
        "forced evictions",
        "fwd+bwd vs full",
        "trainer ms/step outside compute",
        "pipeline CPU ms/step (of compute)",
    ]
    table = markdown_table(headers, rows)
    if b.background_load:
        table = f"With {b.background_load} CPU-bound background process(es) running.\n\n" + table
    # each disk store's row layout, as its runs' summaries report it (disk: train's default picked it)
    layouts = {
        key.split("/")[1]: ((runs[0].get("cache") or {}).get("store") or {}).get("layout")
        for key, runs in results.items()
        if runs and key.split("/")[1] != "memory"
    }
    if layouts:
        said = ", ".join(f"{store} {name}" for store, name in sorted(layouts.items()))
        table += f"\n\nRow layouts of the disk stores' table files: {said}."
    return {
        **header(b),
        "store_layouts": layouts,
        "total_rows": total_rows,
        "cache_rows": cache_rows,
        "cache_fraction_of_rows": cache_rows / total_rows,
        "results": out,
        "table": table,
    }


def _plot(out: Path, payload: dict) -> None:
    plt = pyplot()
    keys = list(payload["results"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    stacked_step_times(ax1, keys, [payload["results"][k]["time_per_step_ms"] for k in keys])
    ax1.set_title("time breakdown per iteration")
    ax1.legend(fontsize=8)
    ax1.tick_params(axis="x", rotation=30)
    sps = [payload["results"][k]["samples_per_s"] for k in keys]
    ax2.bar(keys, sps, color="tab:green")
    ax2.set_ylabel("samples/s")
    ax2.set_title("throughput")
    ax2.tick_params(axis="x", rotation=30)
    save_png(fig, out / "modes.png")
