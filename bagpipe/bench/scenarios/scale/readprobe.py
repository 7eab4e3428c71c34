"""The reads-only probe of ``bagpipe bench scale``: how long the store alone takes to read
each step's misses, under the same memory limit as the training runs.

``python -m bagpipe.bench.scenarios.scale.readprobe SETTINGS.json RESULT.json`` (started by the scale
scenario inside a fresh memory group) plans the run the way ``bagpipe train --mode
lookahead`` does (the lookahead oracle over the same batch stream, cache size and L),
keeps each step's ``fetch_rows``, drops the table file from the page cache, then reads
those rows step after step with :meth:`DiskStore.read` and nothing else running: no
training, no write-backs. The median milliseconds per step over the steps after the
warm-up is the "reads" side of the issue's bound ``lookahead <= 1.15 x max(compute,
reads)``; the fetched rows per step and the probe's own bytes read are recorded beside it.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from pathlib import Path

from bagpipe.jsonout import json_text


def probe(settings: dict) -> dict:
    """Run the probe described by ``settings`` (see :func:`bagpipe.bench.scenarios.scale.scenario.probe_settings`)."""
    import numpy as np

    from bagpipe.data.shards import Dataset
    from bagpipe.data.stream import BatchStream
    from bagpipe.oracle.lookahead import LookaheadOracle
    from bagpipe.store.disk import DiskStore
    from bagpipe.store.init import RowInitializer

    ds = Dataset(settings["data"])
    meta = ds.meta
    stream = BatchStream(ds, "train", settings["batch_size"], seed=settings["seed"])
    steps, warmup = settings["steps"], settings["warmup"]
    t0 = time.perf_counter()
    # as the lookahead run (one trainer) plans: rows retained past their window
    oracle = LookaheadOracle(meta.total_rows, settings["cache_rows"], settings["lookahead"], retain=True)
    fetches = [plan.fetch_rows.copy() for plan in oracle.plans(stream.numbered(0, steps))]
    plan_s = time.perf_counter() - t0
    init = RowInitializer(meta.table_sizes, settings["dim"], settings["seed"])
    store = DiskStore(
        init, settings["state_dim"], settings["store_dir"], create=False, threads=settings.get("threads", 32)
    )
    try:
        store.drop_page_cache()
        before = resource.getrusage(resource.RUSAGE_SELF)
        ms = []
        for rows in fetches:
            t = time.perf_counter()
            store.read(rows)
            ms.append(1000 * (time.perf_counter() - t))
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        store.close()
    timed = ms[warmup:] or ms
    rows_timed = [len(r) for r in fetches[warmup:]] or [len(r) for r in fetches]
    return {
        "ms_per_step": statistics.median(timed),
        "ms_per_step_mean": float(np.mean(timed)),
        "fetched_rows_per_step": float(np.mean(rows_timed)),
        "rows_per_s": sum(rows_timed) / (sum(timed) / 1000) if sum(timed) else float("nan"),
        "read_bytes": (after.ru_inblock - before.ru_inblock) * 512,
        "major_faults": after.ru_majflt - before.ru_majflt,
        "planning_s": plan_s,
        "steps": len(ms),
    }


def main(argv: list[str]) -> int:
    settings = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json_text(probe(settings), indent=1))
    return 0


if __name__ == "__main__":
    from bagpipe import lifeline

    lifeline.watch("bench read probe")  # started by bench: ends with it
    raise SystemExit(main(sys.argv[1:]))
