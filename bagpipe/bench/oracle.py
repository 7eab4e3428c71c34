"""``bagpipe bench oracle``: planning throughput of the lookahead oracle alone.

Batches are generated and read into memory first; then the oracle plans them on one
thread (torch/numpy intra-op threads pinned to 1). Reports lookups planned per
second, per-batch planning time, the oracle's own state in MiB and the hit rate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from bagpipe.bench.config import BenchConfig, Repeated
from bagpipe.bench.report import (
    header,
    markdown_table,
    median_spread,
    pyplot,
    save_png,
    write_results,
)


@dataclass(kw_only=True)
class OracleBench(Repeated, BenchConfig):
    """The oracle's planning throughput alone (one thread) vs batch size and lookahead L."""

    name = "oracle"
    QUICK = dict(scale=0.01, batch_sizes=(512,), lookaheads=(1, 8), batches=30, reps=1)

    reps: int = 3
    batch_sizes: tuple[int, ...] = (1024, 2048, 4096)
    """Batch sizes to plan."""
    lookaheads: tuple[int, ...] = (1, 10, 50, 200)
    """Lookahead windows L to plan with."""
    batches: int = 120
    """Batches planned per measurement."""
    cache_fraction: float = 0.05
    """The oracle's cache as a fraction of all rows (at least one batch's lookups)."""

    def validate(self) -> None:
        super().validate()
        self.check("batch_sizes", bool(self.batch_sizes) and all(B >= 1 for B in self.batch_sizes), "must be >= 1")
        self.check("lookaheads", bool(self.lookaheads) and all(L >= 1 for L in self.lookaheads), "must be >= 1")
        self.check("batches", self.batches >= 1, "must be >= 1")
        self.check("cache_fraction", 0 < self.cache_fraction <= 1, "must be in (0, 1]")


def oracle_state_mb(o) -> float:
    arrays = [o.latest, o.ent_row, o.ent_prev, o.ent_next, o.ent_slot, o.ent_evict, o.free, o.slot_seq]
    return sum(a.nbytes for a in arrays) / 2**20


def run(b: OracleBench) -> dict:
    import torch

    from bagpipe.data.shards import Dataset
    from bagpipe.data.stream import BatchStream
    from bagpipe.data.synthetic import SynthConfig, generate
    from bagpipe.oracle import LookaheadOracle

    torch.set_num_threads(1)
    out = Path(b.out)
    data = out / "data"
    need = max(b.batch_sizes) * (b.batches + 1)
    generate(SynthConfig(profile=b.profile, samples=int(need / 0.9) + 1, scale=b.scale, seed=2), str(data), overwrite=True, progress=False)
    ds = Dataset(data)
    total = ds.meta.total_rows
    rows, res = [], {}
    for B in b.batch_sizes:
        stream = BatchStream(ds, "train", B, seed=0)
        batches = [(i, stream.batch(i)) for i in range(b.batches)]
        lookups = sum(int(x.rows.shape[0]) for _, x in batches)
        cache = max(int(b.cache_fraction * total), B * ds.meta.num_features)
        for L in b.lookaheads:
            rates, state = [], 0.0
            for _ in range(b.reps):
                o = LookaheadOracle(total, cache, L)
                t0 = time.perf_counter()
                for _p in o.plans(batches):
                    pass
                dt = time.perf_counter() - t0
                rates.append(lookups / dt)
                state = oracle_state_mb(o)
            med, spread = median_spread(rates)
            key = f"B={B},L={L}"
            res[key] = {"batch_size": B, "lookahead": L, "lookups_per_s": med, "spread": spread,
                        "ms_per_batch": 1000 * lookups / med / len(batches), "state_mb": state,
                        "hit_rate": o.stats.as_dict()["hit_rate"], "forced_evictions": o.stats.forced_evictions}
            rows.append([B, L, med / 1e6, f"{spread:.0%}", res[key]["ms_per_batch"], state, f"{res[key]['hit_rate']:.1%}"])
            print(f"B={B} L={L}: {med / 1e6:.1f}M lookups/s", flush=True)
    table = markdown_table(["batch", "L", "M lookups/s", "spread", "ms/batch", "oracle state MiB", "hit rate"], rows)
    payload = {**header(b), "total_rows": total, "results": res, "table": table}
    _plot(out, res, b)
    write_results(out, "oracle", payload, table)
    return payload


def _plot(out: Path, res: dict, b: OracleBench) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for B in b.batch_sizes:
        pts = [(v["lookahead"], v["lookups_per_s"] / 1e6) for v in res.values() if v["batch_size"] == B]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"batch {B}")
    ax.set_xscale("log")
    ax.set_xlabel("lookahead L (batches)")
    ax.set_ylabel("million lookups planned / s (1 thread)")
    ax.legend()
    save_png(fig, out / "oracle.png")
