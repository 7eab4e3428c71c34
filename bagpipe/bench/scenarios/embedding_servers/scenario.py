"""``bagpipe bench distributed``: the cost of disaggregation and of cache synchronisation.

Side by side, on the same generated Criteo-Kaggle-profile data, model, global batch
and optimizer, each configuration a separate ``bagpipe train`` (the distributed ones
through the local launcher, every role a process on loopback):

* ``in-process``: one process, lookahead mode, the store in the trainer's memory;
* ``1 trainer + 2 servers``: the same rows on two embedding-server processes, the
  oracle in its own process (the cost of disaggregation);
* ``2 trainers + 2 servers, partitioned`` and ``..., replicated``: data-parallel
  training with the partitioned cache (rows one trainer uses and then drops are not
  synchronised) and with a fully replicated one (every planned row synchronised);
  the bytes each trainer all-reduces per iteration are the point; ``..., owner
  exchange`` (``--cache-sync owner``): the bytes trainer 0 sends to the rows' owners
  and next users instead.

All roles share this machine's cores, so the distributed throughputs measure overheads
on one box, not scaling.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from bagpipe.bench.harness.report import (
    header,
    markdown_table,
    median,
    median_spread,
    percent,
    pyplot,
    save_png,
    throughput,
    write_results,
)
from bagpipe.bench.harness.runner import launch, prepare
from bagpipe.bench.harness.settings import CachePoint, Throughput

# key -> (label, trainers, servers, cache sync); trainers 0 = one process, in-process store
CONFIGS = {
    "in-process": ("in-process store (1 process)", 0, 0, "partitioned"),
    "1x2": ("1 trainer + 2 servers", 1, 2, "partitioned"),
    "2x2-partitioned": ("2 trainers + 2 servers, partitioned cache", 2, 2, "partitioned"),
    "2x2-replicated": ("2 trainers + 2 servers, replicated cache", 2, 2, "replicated"),
    "2x2-owner": ("2 trainers + 2 servers, owner exchange", 2, 2, "owner"),
}


@dataclass(kw_only=True)
class DistributedBench(CachePoint, Throughput):
    """1 trainer + 2 embedding-server processes vs the in-process store (the cost of
    disaggregation), and 2 trainers with the partitioned vs a fully replicated cache (bytes
    synchronised per iteration), every role a process on this machine. --batch-size is the
    global batch (each of N trainers trains on batch_size / N samples)."""

    name = "distributed"
    QUICK = dict(scale=0.01, batch_size=256, recipe="debug", steps=12, warmup=2, reps=1, lookahead=4)

    modes: tuple[str, ...] = tuple(CONFIGS)
    """Configurations to run: a comma-separated subset of in-process,1x2,2x2-partitioned,2x2-replicated,2x2-owner."""

    def validate(self) -> None:
        super().validate()
        self.check_subset("modes", tuple(CONFIGS))


def _run(b: DistributedBench, data: Path, run_dir: Path, config: str, cache_rows: int) -> dict:
    _, trainers, servers, sync = CONFIGS[config]
    topology = dict(trainers=trainers, servers=servers, cache_sync=sync) if trainers else {}
    return launch(b, data, run_dir, config, mode="lookahead", cache_rows=cache_rows, lookahead=b.lookahead, **topology)


def run(b: DistributedBench) -> dict:
    out, data, meta = prepare(b)
    total = meta.total_rows
    cache_rows = b.cache_rows(total, b.batch_size * meta.num_features)
    results: dict[str, list[dict]] = {c: [] for c in b.modes}
    for rep in range(b.reps):
        for config in b.modes:
            print(f"[rep {rep + 1}/{b.reps}] {CONFIGS[config][0]} ...", flush=True)
            run_dir = out / "runs" / f"{config}-{rep}"
            shutil.rmtree(run_dir, ignore_errors=True)
            s = _run(b, data, run_dir, config, cache_rows)
            results[config].append(s)
            d = s.get("distributed") or {}
            print(
                f"    {s['samples_per_s']:,.0f} samples/s, embedding sync {d.get('sync_bytes_per_step', 0) / 2**20:.2f} MiB/step",
                flush=True,
            )
            shutil.rmtree(run_dir, ignore_errors=True)
    payload = summarise(b, results, total, cache_rows)
    _plot(out, payload)
    write_results(out, "distributed", payload, payload["table"])
    return payload


def summarise(b: DistributedBench, results: dict[str, list[dict]], total_rows: int, cache_rows: int) -> dict:
    base_sps = median(results.get("in-process", []), "samples_per_s")
    rows, out = [], {}
    for config, runs in results.items():
        sps, spread = throughput(runs)
        d = runs[0].get("distributed") or {}
        steps = runs[0]["steps"]
        sync = median_spread([(r.get("distributed") or {}).get("sync_bytes_per_step", 0.0) for r in runs])[0]
        rep_sync = d.get("replicated_sync_bytes_per_step", 0.0)
        fetched = d.get("fetched_rows_per_trainer", [(runs[0].get("cache") or {}).get("rows_fetched", 0)])
        out[config] = {
            "samples_per_s": sps,
            "spread": spread,
            "ratio_to_in_process": sps / base_sps,
            "sync_bytes_per_step": sync,
            "replicated_sync_bytes_per_step_counterfactual": rep_sync,
            "sync_rows_per_step": d.get("sync_rows_per_step", 0.0),
            "sync_overlapped_share": d.get("sync_overlapped_share"),
            "fetched_rows_per_trainer_per_step": [f / steps for f in fetched],
            "hit_rate": (runs[0].get("cache") or {}).get("hit_rate"),
            "time_per_step_ms": runs[0]["time_per_step_ms"],
            "peak_anon_rss_mb_trainer0": runs[0]["peak_anon_rss_mb"],
            "runs": [r["samples_per_s"] for r in runs],
        }
        rows.append(
            [
                CONFIGS[config][0],
                sps,
                percent(spread),
                f"{sps / base_sps:.2f}x",
                "-" if not d else f"{sync / 2**20:.2f}",
                "-" if d.get("trainers", 1) < 2 else f"{rep_sync / 2**20:.2f}",
                "-" if d.get("trainers", 1) < 2 or not rep_sync else f"{sync / rep_sync:.0%}",
                ", ".join(f"{f / steps:,.0f}" for f in fetched),
                median(runs, "peak_anon_rss_mb"),
            ]
        )
    headers = [
        "configuration",
        "samples/s",
        "spread",
        "vs in-process",
        "embedding sync MiB/step/trainer",
        "if fully replicated",
        "partitioned / replicated",
        "rows fetched/step (per trainer)",
        "trainer 0 peak anon RSS MiB",
    ]
    return {
        **header(b),
        "total_rows": total_rows,
        "cache_rows": cache_rows,
        "results": out,
        "table": markdown_table(headers, rows),
    }


def _plot(out: Path, payload: dict) -> None:
    plt = pyplot()
    keys = list(payload["results"])
    res = payload["results"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax1.bar(
        [CONFIGS[k][0].replace(", ", "\n").replace(" + ", "\n+ ").replace(" (", "\n(") for k in keys],
        [res[k]["samples_per_s"] for k in keys],
        color="tab:green",
    )
    ax1.set_ylabel("samples/s (global batch)")
    ax1.set_title("throughput, every role on this machine")
    dp = [k for k in keys if res[k]["replicated_sync_bytes_per_step_counterfactual"]]
    ax2.bar(
        [CONFIGS[k][0].split(", ")[-1] for k in dp],
        [res[k]["sync_bytes_per_step"] / 2**20 for k in dp],
        color="tab:blue",
    )
    ax2.set_ylabel("MiB all-reduced per iteration per trainer")
    ax2.set_title("embedding synchronisation, N = 2")
    save_png(fig, out / "distributed.png")
