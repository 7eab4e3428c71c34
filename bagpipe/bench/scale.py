"""``bagpipe bench scale``: tables larger than memory, under a cgroup memory limit.

Each configuration is a ``bagpipe train`` process. The cached modes run on the disk
store inside a fresh memory control group (:mod:`bagpipe.bench.memlimit`) whose limit
``--memory-limit-mb`` counts the page cache too, so the table file (Criteo-Kaggle
profile at full cardinality, D = 64 by default: 33.8M rows x 65 floats = 8.8 GB, 4.3x
the 2 GiB limit) cannot be cached: a miss is a real device read. ``full`` runs on the
memory store with no limit: the ceiling the others are held to.

    full            every table in memory, no limit (also the compute-only step time)
    nocache         each batch's rows read and written back, synchronously
    lru             LRU cache of --cache-fraction of the rows, misses read synchronously
    lookahead       the oracle's cache of the same size, L = --lookahead
    lookahead+hot   the same memory: --hot-share of it a hot tier, the rest cache
    reads-only      (a probe, not training) the lookahead run's misses read step after
                    step from the store under the same limit (:mod:`bagpipe.bench.readprobe`)

The table file is written once, every row materialised (its initial value and zero
state, the tables every mode starts from; nothing is left as a hole to be initialised
lazily). A run writes back the rows it trained; before the next run those rows (every
row of the run's batches) are rewritten to their initial values, and the file is
dropped from the page cache (fsync, ``POSIX_FADV_DONTNEED``) before every run, so each
starts cold from the same tables and every mode's ``params_sha256`` must equal
``full``'s. Repetitions interleave the configurations.

Reported per configuration: samples/s (median, spread), its ratios to full, nocache and
lru, ms per step, bytes read from the device per measured step (``/proc/self/io``), the
group's peak memory (page cache included) against the limit, limit hits and OOM kills,
the cache's hit rate, the digest; and the targets: lookahead's step time against
max(full's step time, the reads-only step time).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bagpipe.bench.config import CachePoint, Throughput
from bagpipe.bench.memlimit import MemoryGroup, find_memory_controller
from bagpipe.bench.modes import drop_cached, materialise_disk_store
from bagpipe.bench.report import (
    header,
    markdown_table,
    median,
    median_spread,
    pyplot,
    save_png,
    stacked_step_times,
    step_times,
    write_results,
)
from bagpipe.bench.runner import TrainFailed, launch, prepare
from bagpipe.optim.names import row_state_dim

CONFIGS = ("full", "nocache", "lru", "lookahead", "lookahead+hot")
PROBE = "reads-only"
SEED = 0  # bagpipe train's default --seed: the initial rows of the table file


@dataclass(kw_only=True)
class ScaleBench(CachePoint, Throughput):
    """full (memory store, no limit) against nocache, lru and lookahead (with and without a
    hot tier) on a disk store inside a memory cgroup far smaller than the table file:
    Criteo-Kaggle profile at full cardinality, D = 64 (8.8 GB of rows and Adagrad state)
    under 2 GiB, DLRM Kaggle MLPs, batch 2048, Adagrad, a 5% cache."""

    name = "scale"
    QUICK = dict(
        scale=0.02,
        batch_size=256,
        recipe="debug",
        embedding_dim=16,
        steps=12,
        warmup=3,
        reps=1,
        lookahead=4,
        memory_limit_mb=1024,
        eval_samples=512,
        threads=1,
        configs=CONFIGS[:4],
    )

    steps: int = 40
    warmup: int = 10
    eval_samples: int = 4096
    embedding_dim: int = 64
    """D of every table (bagpipe train --embedding-dim)."""
    memory_limit_mb: float = 2048.0
    """The memory group's limit for each cached run, MiB, page cache included."""
    configs: tuple[str, ...] = CONFIGS
    """Configurations to run: a comma-separated subset of """ + ",".join(CONFIGS) + """ (full runs first)."""
    hot_share: float = 0.75
    """Share of the cache's memory lookahead+hot gives its hot tier (the rest is its cache)."""
    probe: bool = True
    """Also run the reads-only probe (the lookahead run's misses read under the limit, nothing else)."""
    digest: bool = True
    """Compute every run's params_sha256 (reads the whole table at the end of each run, not timed)."""

    def validate(self) -> None:
        super().validate()
        self.check_subset("configs", CONFIGS)
        self.check("embedding_dim", self.embedding_dim >= 1, "must be >= 1")
        self.check("memory_limit_mb", self.memory_limit_mb >= 64, "must be >= 64")
        self.check("hot_share", 0 < self.hot_share < 1, "must be in (0, 1)")


def touched_rows(data: Path, batch_size: int, steps: int, seed: int) -> np.ndarray:
    """Every row of the first ``steps`` training batches (ascending): what a run can write."""
    from bagpipe.data.shards import Dataset
    from bagpipe.data.stream import BatchStream

    stream = BatchStream(Dataset(data), "train", batch_size, seed=seed)
    return np.unique(np.concatenate([stream.batch(k).rows.numpy() for k in range(steps)]))


def restore_rows(store_dir: Path, meta, dim: int, state_dim: int, rows: np.ndarray) -> None:
    """Rewrite ``rows`` of the table file to their initial values and zero state, then
    drop the file from the page cache."""
    from bagpipe.store.disk import DiskStore
    from bagpipe.store.init import RowInitializer

    init = RowInitializer(meta.table_sizes, dim, SEED)
    with DiskStore(init, state_dim, store_dir, create=False) as store:
        for a in range(0, len(rows), 1 << 20):
            r = rows[a : a + (1 << 20)]
            store.write(r, init.rows(r), np.zeros((len(r), state_dim), np.float32))
        store.drop_page_cache()


def settings(b: ScaleBench, cache_rows: int, row_bytes: int) -> dict[str, dict]:
    """Each configuration's ``bagpipe train`` options."""
    hot_rows = int(b.hot_share * cache_rows)
    la = dict(mode="lookahead", lookahead=b.lookahead)
    return {
        "full": dict(mode="full", store="memory"),
        "nocache": dict(mode="nocache"),
        "lru": dict(mode="lru", cache_rows=cache_rows),
        "lookahead": dict(la, cache_rows=cache_rows),
        "lookahead+hot": dict(la, cache_rows=cache_rows - hot_rows, hot_budget_mb=hot_rows * row_bytes / 2**20),
    }


def run(b: ScaleBench) -> dict:
    from bagpipe.models import recipe  # noqa: F401 - fails early on a bad model/recipe pair

    controller, where = find_memory_controller()
    if controller is None:
        why = f"bench scale: skipped: no memory cgroup can be used here ({where})"
        print(why, flush=True)
        payload = {**header(b), "skipped": why, "table": why}
        write_results(b.out_dir, "scale", payload, why)
        return payload
    print(f"memory limit through the {where}", flush=True)
    out, data, meta = prepare(b)
    dim = b.embedding_dim
    state_dim = row_state_dim(b.optimizer, dim)
    row_bytes = 4 * (dim + state_dim)
    total = meta.total_rows
    cache_rows = b.cache_rows(total, b.batch_size * meta.num_features)
    store_dir = out / "store"
    header_file = store_dir / "header.json"
    if header_file.exists() and json.loads(header_file.read_text()).get("dim") != dim:
        shutil.rmtree(store_dir)  # a table file of another D
    materialise_disk_store(store_dir, meta, dim, state_dim, seed=SEED)
    table_bytes = total * row_bytes
    limit = int(b.memory_limit_mb * 2**20)
    print(
        f"table file {table_bytes / 2**30:.2f} GiB ({total:,} rows x {row_bytes} B) under a "
        f"{b.memory_limit_mb:g} MiB limit ({table_bytes / limit:.1f}x)",
        flush=True,
    )
    touched = touched_rows(data, b.batch_size, b.steps + b.lookahead + 1, SEED)
    opts = settings(b, cache_rows, row_bytes)
    configs = [c for c in CONFIGS if c in b.configs]
    results: dict[str, list[dict]] = {c: [] for c in configs}
    failures: dict[str, list[str]] = {}
    probes: list[dict] = []
    dirty = False
    for rep in range(b.reps):
        for key in configs:
            print(f"[rep {rep + 1}/{b.reps}] {key} ...", flush=True)
            run_dir = out / "runs" / key.replace("+", "-")
            shutil.rmtree(run_dir, ignore_errors=True)
            if key == "full":
                s = launch(b, data, run_dir, key, digest=b.digest, embedding_dim=dim, **opts[key])
            else:
                if dirty:
                    restore_rows(store_dir, meta, dim, state_dim, touched)
                drop_cached(store_dir)
                dirty = True
                with MemoryGroup(controller, limit, "bagpipe-scale") as group:
                    try:
                        s = launch(
                            b,
                            data,
                            run_dir,
                            key,
                            preexec_fn=group.enter,
                            digest=b.digest,
                            embedding_dim=dim,
                            store="disk",
                            store_dir=store_dir,
                            init_from_store=True,
                            **opts[key],
                        )
                    except TrainFailed as e:
                        report = group.report()
                        failures.setdefault(key, []).append(f"{e.stderr.strip()[-300:]} (group: {report})")
                        print(
                            f"    failed: OOM kills {report['oom_kills']}, peak {report['peak_mb']:.0f} MiB", flush=True
                        )
                        continue
                    s["memory_group"] = group.report()
            results[key].append(s)
            g = s.get("memory_group")
            print(
                f"    {s['samples_per_s']:,.0f} samples/s, {_io(s)['read_bytes'] / 2**20:.1f} MiB read/step"
                + (f", group peak {g['peak_mb']:.0f} MiB of {g['limit_mb']:.0f}" if g else ""),
                flush=True,
            )
            shutil.rmtree(run_dir, ignore_errors=True)
        if b.probe and "lookahead" in configs:  # a configuration of this scenario (the probe reads as it does)
            print(f"[rep {rep + 1}/{b.reps}] {PROBE} ...", flush=True)
            drop_cached(store_dir)  # the probe only reads: the file stays as the last run left it
            probes.append(run_probe(b, controller, limit, out, data, store_dir, cache_rows, dim, state_dim))
            print(
                f"    {probes[-1]['ms_per_step']:.0f} ms/step for {probes[-1]['fetched_rows_per_step']:,.0f} rows",
                flush=True,
            )
    payload = summarise(b, results, failures, probes, total, cache_rows, table_bytes, where)
    _plot(out, payload)
    write_results(out, "scale", payload, payload["table"])
    return payload


def run_probe(
    b: ScaleBench,
    controller,
    limit: int,
    out: Path,
    data: Path,
    store_dir: Path,
    cache_rows: int,
    dim: int,
    state_dim: int,
) -> dict:
    """The reads-only probe (:mod:`bagpipe.bench.readprobe`) in its own process and memory group."""
    spec = {
        "data": str(data),
        "store_dir": str(store_dir),
        "batch_size": b.batch_size,
        "steps": b.steps,
        "warmup": b.warmup,
        "cache_rows": cache_rows,
        "lookahead": b.lookahead,
        "dim": dim,
        "state_dim": state_dim,
        "seed": SEED,
    }
    spec_file, result_file = out / "probe-settings.json", out / "probe-result.json"
    spec_file.write_text(json.dumps(spec))
    with MemoryGroup(controller, limit, "bagpipe-scale-probe") as group:
        proc = subprocess.run(
            [sys.executable, "-m", "bagpipe.bench.readprobe", str(spec_file), str(result_file)],
            capture_output=True,
            text=True,
            preexec_fn=group.enter,
            timeout=b.run_timeout_s or None,
        )
        if proc.returncode != 0:
            raise TrainFailed(PROBE, proc.returncode, proc.stderr)
        res = json.loads(result_file.read_text()) | {"memory_group": group.report()}
    return res


def _io(s: dict) -> dict:
    return s.get("io_per_step") or {
        "read_bytes": float("nan"),
        "write_bytes": float("nan"),
        "major_faults": float("nan"),
    }


def _med(runs: list[dict], fn) -> float:
    return median_spread([fn(r) for r in runs])[0] if runs else float("nan")


def summarise(
    b: ScaleBench,
    results: dict[str, list[dict]],
    failures: dict,
    probes: list[dict],
    total_rows: int,
    cache_rows: int,
    table_bytes: int,
    where: str,
) -> dict:
    sps = {
        k: median_spread([r["samples_per_s"] for r in runs]) if runs else (float("nan"), float("nan"))
        for k, runs in results.items()
    }
    ref = {k: sps.get(k, (float("nan"),))[0] for k in ("full", "nocache", "lru")}
    digests = {k: sorted({r.get("params_sha256") for r in runs}, key=str) for k, runs in results.items()}
    full_digest = digests.get("full", [None])
    rows, res = [], {}
    for key, runs in results.items():
        med, spread = sps[key]
        step_ms = 1000 * b.batch_size / med if med == med and med else float("nan")
        cache = (runs[0].get("cache") or {}) if runs else {}
        group = [r["memory_group"] for r in runs if "memory_group" in r]
        peak = max((g["peak_mb"] for g in group), default=float("nan"))
        res[key] = {
            "samples_per_s": med,
            "spread": spread,
            "step_ms": step_ms,
            "ratio_to_full": med / ref["full"],
            "ratio_to_nocache": med / ref["nocache"],
            "ratio_to_lru": med / ref["lru"],
            "read_mb_per_step": _med(runs, lambda r: _io(r)["read_bytes"] / 2**20),
            "written_mb_per_step": _med(runs, lambda r: _io(r)["write_bytes"] / 2**20),
            "major_faults_per_step": _med(runs, lambda r: _io(r)["major_faults"]),
            "group_peak_mb": peak,
            "limit_mb": b.memory_limit_mb if group else None,
            "limit_hits": [g["limit_hits"] for g in group],
            "oom_kills": sum(g["oom_kills"] for g in group),
            "peak_anon_rss_mb": median(runs, "peak_anon_rss_mb") if runs else float("nan"),
            "hit_rate": cache.get("hit_rate"),
            "hot": (cache.get("hot") or {}).get("lookup_share"),
            "time_per_step_ms": step_times(runs) if runs else {},
            "params_sha256": digests[key],
            "same_digest_as_full": (digests[key] == full_digest) if b.digest and "full" in results else None,
            "runs": [r["samples_per_s"] for r in runs],
            "failures": failures.get(key, []),
        }
        r = res[key]
        rows.append(
            [
                key,
                med,
                f"{spread:.0%}" if spread == spread else "-",
                step_ms,
                f"{r['ratio_to_full']:.2f}x",
                f"{r['ratio_to_nocache']:.2f}x",
                f"{r['ratio_to_lru']:.2f}x",
                r["read_mb_per_step"],
                "-" if not group else f"{peak:,.0f} / {b.memory_limit_mb:g}",
                "-" if not group else r["oom_kills"],
                "-" if r["hit_rate"] is None else f"{r['hit_rate']:.1%}",
                {True: "= full", False: "DIFFERS", None: "-"}[r["same_digest_as_full"]] if key != "full" else "-",
            ]
        )
    probe = {}
    if probes:
        probe = {
            "ms_per_step": median_spread([p["ms_per_step"] for p in probes])[0],
            "spread": median_spread([p["ms_per_step"] for p in probes])[1],
            "fetched_rows_per_step": probes[0]["fetched_rows_per_step"],
            "rows_per_s": median_spread([p["rows_per_s"] for p in probes])[0],
            "read_mb_per_step": median_spread([p["read_bytes"] / 2**20 / max(p["steps"], 1) for p in probes])[0],
            "group_peak_mb": max(p["memory_group"]["peak_mb"] for p in probes),
            "runs": probes,
        }
        rows.append(
            [
                PROBE,
                float("nan"),
                f"{probe['spread']:.0%}",
                probe["ms_per_step"],
                "-",
                "-",
                "-",
                probe["read_mb_per_step"],
                f"{probe['group_peak_mb']:,.0f} / {b.memory_limit_mb:g}",
                "-",
                "-",
                "-",
            ]
        )
    headers = [
        "config",
        "samples/s",
        "spread",
        "ms/step",
        "vs full",
        "vs nocache",
        "vs lru",
        "MiB read/step",
        "group peak MiB / limit",
        "OOM kills",
        "hit rate",
        "params_sha256",
    ]
    targets = _targets(res, probe)
    table = markdown_table(headers, rows) + "\n\n" + _targets_lines(targets)
    return {
        **header(b),
        "memory_controller": where,
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


def _targets(res: dict, probe: dict) -> dict:
    la = res.get("lookahead")
    if not la:
        return {}
    compute = res.get("full", {}).get("step_ms", float("nan"))
    reads = probe.get("ms_per_step", float("nan"))
    bound = max(compute, reads) if reads == reads else compute
    within = [g for k, v in res.items() if k != "full" for g in [v["group_peak_mb"]] if g == g]
    return {
        "lookahead_step_ms": la["step_ms"],
        "compute_only_step_ms": compute,
        "reads_only_step_ms": reads,
        "lookahead_vs_bound": la["step_ms"] / bound,
        "bound_side": "reads" if reads == reads and reads > compute else "compute",
        "lookahead_vs_nocache": la["ratio_to_nocache"],
        "lookahead_vs_lru": la["ratio_to_lru"],
        "lookahead_vs_full": la["ratio_to_full"],
        "peak_within_limit": all(v["group_peak_mb"] <= v["limit_mb"] for v in res.values() if v["limit_mb"])
        and bool(within),
        "oom_kills": sum(v["oom_kills"] for v in res.values()),
    }


def _targets_lines(t: dict) -> str:
    if not t:
        return ""
    ok = lambda c: "met" if c else "missed"  # noqa: E731
    return "\n".join(
        [
            f"- lookahead step {t['lookahead_step_ms']:.0f} ms vs max(compute {t['compute_only_step_ms']:.0f} ms, reads "
            f"{t['reads_only_step_ms']:.0f} ms) = {t['lookahead_vs_bound']:.2f}x (target <= 1.15x: "
            f"{ok(t['lookahead_vs_bound'] <= 1.15)}; the bound is the {t['bound_side']} side)",
            f"- lookahead vs nocache {t['lookahead_vs_nocache']:.2f}x (target >= 2x: {ok(t['lookahead_vs_nocache'] >= 2)}), "
            f"vs lru {t['lookahead_vs_lru']:.2f}x (target >= 1.3x: {ok(t['lookahead_vs_lru'] >= 1.3)}), "
            f"vs full {t['lookahead_vs_full']:.2f}x (target >= 0.7x: {ok(t['lookahead_vs_full'] >= 0.7)})",
            f"- every group's peak within its limit: {t['peak_within_limit']}; OOM kills: {t['oom_kills']}",
        ]
    )


def _plot(out: Path, payload: dict) -> None:
    plt = pyplot()
    res = payload["results"]
    keys = [k for k in res if res[k]["runs"]]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.5))
    stacked_step_times(ax1, keys, [res[k]["time_per_step_ms"] for k in keys])
    probe = payload.get("reads_only") or {}
    if probe:
        ax1.axhline(probe["ms_per_step"], color="k", ls="--", lw=1, label="reads-only probe")
    ax1.set_title("time per iteration (trainer thread)")
    ax1.legend(fontsize=7)
    ax1.tick_params(axis="x", rotation=30)
    ax2.bar(keys, [res[k]["samples_per_s"] for k in keys], color="tab:green")
    ax2.set_ylabel("samples/s")
    ax2.set_title(
        f"throughput ({payload['table_gib']:.1f} GiB of rows, limit {payload['config']['memory_limit_mb']:g} MiB)"
    )
    ax2.tick_params(axis="x", rotation=30)
    limited = [k for k in keys if res[k]["limit_mb"]]
    ax3.bar(limited, [res[k]["group_peak_mb"] for k in limited], color="tab:blue", label="group peak")
    ax3.bar(limited, [res[k]["peak_anon_rss_mb"] for k in limited], color="tab:orange", label="trainer anon RSS")
    ax3.axhline(payload["config"]["memory_limit_mb"], color="r", ls="--", label="limit")
    ax3.set_ylabel("MiB")
    ax3.set_title("memory of the group (page cache included)")
    ax3.legend(fontsize=7)
    ax3.tick_params(axis="x", rotation=30)
    save_png(fig, out / "scale.png")
