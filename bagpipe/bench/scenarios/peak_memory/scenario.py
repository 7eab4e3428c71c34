"""``bagpipe bench memory``: the estimate ``bagpipe plan`` prints, against the measured
peak of real runs.

Each configuration is a ``bagpipe train`` process (no memory limit, no budget: nothing
is resized, so the estimate is of exactly what runs) on generated Criteo-Kaggle data:

    full/memory            every table in the trainer
    nocache/disk           a disk store, one batch staged
    lru/disk               a disk store and an LRU cache of --cache-fraction of the rows
    lookahead/disk         the oracle's cache of the same size, L = --lookahead
    lookahead+hot/disk     the same memory, half of it a hot tier
    lookahead/memory       the rows in a memory store in the trainer
    lookahead/disk 1x2     one trainer, its rows on 2 embedding-server processes (disk
                           stores): the trainer and each server against their own estimates

The estimate compared is that of the process's own memory -- every part but the page
cache the run pins (the dirty-page bound and reads in flight: a bound, reported beside
the group's measured dirty pages where a memory cgroup can be made) -- and the measured
peak is the process's anonymous memory over its whole run, sampled every 50 ms
(summary.json's ``memory``; a server's in ``distributed.servers_report``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bagpipe.bench.harness.report import header, markdown_table, median_spread, pyplot, save_png, write_results
from bagpipe.bench.harness.runner import TrainFailed, launch, prepare
from bagpipe.bench.harness.settings import CachePoint, Repeated, TrainBench
from bagpipe.testbed.memlimit import MemoryGroup, find_memory_controller

CONFIGS = (
    "full/memory",
    "nocache/disk",
    "lru/disk",
    "lookahead/disk",
    "lookahead+hot/disk",
    "lookahead/memory",
    "lookahead/disk 1x2",
)
#: The target: the estimate within this share of the measured peak.
WITHIN = 0.15


@dataclass(kw_only=True)
class PeakMemoryBench(CachePoint, Repeated, TrainBench):
    """bagpipe plan's estimate against the measured peak anonymous memory of real runs:
    the modes, the memory and disk stores, and embedding servers (Criteo-Kaggle profile
    at a quarter of its cardinality, D = 64, DLRM Kaggle MLPs, batch 2048, 1% cache)."""

    name = "memory"
    QUICK = dict(scale=0.02, batch_size=256, recipe="debug", embedding_dim=16, steps=20, reps=1, lookahead=4)

    scale: float = 0.25
    steps: int = 100
    reps: int = 1
    cache_fraction: float = 0.01
    eval_samples: int = 4096
    embedding_dim: int = 64
    """D of every table (bagpipe train --embedding-dim)."""
    configs: tuple[str, ...] = CONFIGS
    """Configurations: a comma-separated subset of """ + ",".join(CONFIGS) + "."

    def validate(self) -> None:
        super().validate()
        self.check_subset("configs", CONFIGS)
        self.check("embedding_dim", self.embedding_dim >= 1, "must be >= 1")


def _options(key: str, cache_rows: int, row_bytes: int, lookahead: int) -> dict:
    mode, _, rest = key.partition("/")
    store, _, layout = rest.partition(" ")
    opts: dict = dict(mode=mode.replace("+hot", ""), store=store)
    if opts["mode"] in ("lru", "lookahead"):
        opts["cache_rows"] = cache_rows
    if opts["mode"] == "lookahead":
        opts["lookahead"] = lookahead
    if "+hot" in mode:
        opts["cache_rows"] = cache_rows // 2
        opts["hot_budget_mb"] = cache_rows // 2 * row_bytes / 2**20
    if layout:
        trainers, servers = layout.split("x")
        opts |= dict(trainers=int(trainers), servers=int(servers))
    return opts


def _processes(s: dict) -> list[dict]:
    """(process, estimate of its own memory, measured peak) of a run's summary."""
    m = s["memory"]
    out = [_pair("trainer", m["estimate_mb"], m["estimate_parts_mb"], m["peak_anon_mb"])]
    for i, srv in enumerate((s.get("distributed") or {}).get("servers_report") or []):
        sm = srv.get("memory") or {}
        if sm.get("estimate_mb") is not None:
            out.append(_pair(f"server {i}", sm["estimate_mb"], sm.get("estimate_parts_mb", {}), sm["peak_anon_mb"]))
    return out


def _pair(name: str, total: float, parts: dict, peak: float) -> dict:
    pinned = parts.get("store page cache", 0.0)
    return {
        "process": name,
        "estimate_mb": total,
        "estimate_own_mb": total - pinned,
        "pinned_page_cache_mb": pinned,
        "peak_anon_mb": peak,
        "parts_mb": parts,
    }


def run(b: PeakMemoryBench) -> dict:
    from bagpipe.optim.names import row_state_dim

    out, data, meta = prepare(b)
    dim = b.embedding_dim
    row_bytes = 4 * (dim + row_state_dim(b.optimizer, dim))
    cache_rows = b.cache_rows(meta.total_rows, b.batch_size * meta.num_features)
    controller, where = find_memory_controller()
    configs = [c for c in CONFIGS if c in b.configs]
    results: dict[str, list[dict]] = {c: [] for c in configs}
    for rep in range(b.reps):
        for key in configs:
            print(f"[rep {rep + 1}/{b.reps}] {key} ...", flush=True)
            run_dir = out / "runs" / key.replace("/", "-").replace(" ", "-").replace("+", "-")
            opts = _options(key, cache_rows, row_bytes, b.lookahead)
            try:
                if controller is not None:  # a group without a limit: its dirty pages are measured too
                    with MemoryGroup(controller, 0, "bagpipe-memory") as group:
                        sampler = group.sample(0.5)
                        try:
                            s = launch(b, data, run_dir, key, preexec_fn=group.enter, embedding_dim=dim, **opts)
                        finally:
                            sampler.stop()
                        s["group_max"] = sampler.maxima()
                else:
                    s = launch(b, data, run_dir, key, embedding_dim=dim, **opts)
            except TrainFailed as e:
                results[key].append({"failed": e.stderr.strip().splitlines()[-1:] or ["?"]})
                print(f"    FAILED: {results[key][-1]['failed'][0]}", flush=True)
                continue
            procs = _processes(s)
            results[key].append({"processes": procs, "group_max": s.get("group_max", {})})
            print(
                "    "
                + "; ".join(
                    f"{p['process']}: estimate {p['estimate_own_mb']:,.0f} MiB, peak {p['peak_anon_mb']:,.0f} MiB"
                    for p in procs
                ),
                flush=True,
            )
    payload = summarise(b, results, where if controller is not None else None)
    _plot(out, payload)
    write_results(out, "memory", payload, payload["table"])
    return payload


def summarise(b: PeakMemoryBench, results: dict[str, list[dict]], cgroup: str | None) -> dict:
    rows: list[list] = []
    res: dict[str, dict] = {}
    for key, runs in results.items():
        ok = [r for r in runs if "processes" in r]
        if not ok:
            res[key] = {"failed": [r.get("failed") for r in runs]}
            rows.append([key, "-", "failed", "-", "-", "-", "-", "-"])
            continue
        for i, proc in enumerate(ok[0]["processes"]):
            est = proc["estimate_own_mb"]
            peak, spread = median_spread([r["processes"][i]["peak_anon_mb"] for r in ok])
            err = est / peak - 1
            dirty = max(
                (r["group_max"].get("dirty", 0.0) + r["group_max"].get("writeback", 0.0) for r in ok), default=0
            )
            name = f"{key} ({proc['process']})" if len(ok[0]["processes"]) > 1 else key
            res[name] = {
                "estimate_own_mb": est,
                "peak_anon_mb": peak,
                "spread": spread,
                "error": err,
                "within_target": abs(err) <= WITHIN,
                "pinned_page_cache_mb": proc["pinned_page_cache_mb"],
                "measured_dirty_writeback_mb": dirty if cgroup else None,
                "parts_mb": proc["parts_mb"],
            }
            rows.append(
                [
                    name,
                    est,
                    peak,
                    f"{err:+.1%}",
                    "yes" if abs(err) <= WITHIN else "no",
                    proc["pinned_page_cache_mb"],
                    "-" if not cgroup else dirty,
                    ", ".join(f"{k} {v:,.0f}" for k, v in proc["parts_mb"].items() if v >= 1),
                ]
            )
    headers = ["configuration (process)", "estimate MiB (own memory)", "measured peak anon MiB", "error",
               f"within {WITHIN:.0%}", "pinned page cache (bound) MiB", "measured max dirty + writeback MiB",
               "estimate by part (MiB)"]  # fmt: skip
    hits = sum(1 for v in res.values() if v.get("within_target"))
    table = markdown_table(headers, rows) + (
        f"\n\nWithin {WITHIN:.0%} of the measured peak: {hits} of {len(res)} processes "
        f"(target: at least four configurations: {'met' if hits >= 4 else 'missed'})."
    )
    return {**header(b), "memory_controller": cgroup, "results": res, "within": hits, "table": table}


def _plot(out: Path, payload: dict) -> None:
    plt = pyplot()
    res = {k: v for k, v in payload["results"].items() if "estimate_own_mb" in v}
    keys = list(res)
    fig, ax = plt.subplots(figsize=(12, 4.5))
    x = range(len(keys))
    ax.bar([i - 0.2 for i in x], [res[k]["estimate_own_mb"] for k in keys], width=0.4, label="estimate (bagpipe plan)")
    ax.bar([i + 0.2 for i in x], [res[k]["peak_anon_mb"] for k in keys], width=0.4, label="measured peak (anon)")
    ax.set_xticks(list(x), keys, rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("MiB")
    ax.set_title("a process's memory: the estimate against the measured peak")
    ax.legend(fontsize=8)
    save_png(fig, out / "memory.png")
