"""How many of a run's store reads and write-backs are cold pages, in the identity and the
frequency row layout of a disk store? (issue 30: `lookahead` on a table file larger than its
memory group reads nearly a cold page per row, docs/pipeline.md.)

Runs ``bagpipe train`` once in this process with a memory store whose reads and writes
are recorded (the rows of each call, in order: what a disk store would be asked for), then
replays them against a model of the page cache -- an LRU list of ``--page-cache-mb`` MiB of
4 KiB pages of rows.f32 -- for each layout: a page not in the list is a cold read (a read)
or a read-modify-write (a write). Counts only: no timing, so the machine's load does not
matter; the page cache of a real memory group is not exactly LRU.

    python benchmarks/layout_page_counts.py --data bench-out/pipeline-scale/data --mode lookahead \\
        --cache-rows 168812 --lookahead 20 --embedding-dim 64 --steps 300 --page-cache-mb 200,400
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

PAGE = 4096


def record(args) -> list[tuple[bool, np.ndarray]]:
    """(is_read, rows) of every store read and write of one run."""
    from bagpipe.cli import main
    from bagpipe.store.memory import MemoryStore

    calls: list[tuple[bool, np.ndarray]] = []
    lock = threading.Lock()
    read, write = MemoryStore._read, MemoryStore._write

    def rec_read(self, rows):
        with lock:
            calls.append((True, np.array(rows, dtype=np.int64)))
        return read(self, rows)

    def rec_write(self, rows, w, s):
        with lock:
            calls.append((False, np.array(rows, dtype=np.int64)))
        return write(self, rows, w, s)

    MemoryStore._read, MemoryStore._write = rec_read, rec_write  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            argv = ["train", "--data", str(args.data), "--out", f"{tmp}/run", "--mode", args.mode, "--store", "memory"]
            argv += ["--cache-rows", str(args.cache_rows), "--embedding-dim", str(args.embedding_dim)]
            argv += ["--batch-size", str(args.batch_size), "--steps", str(args.steps), "--recipe", "kaggle"]
            argv += ["--optimizer", "adagrad", "--lr", "0.05", "--no-progress", "--no-final-checkpoint"]
            argv += ["--lookahead", str(args.lookahead)] if args.mode == "lookahead" else []
            if main(argv) != 0:
                raise SystemExit("the recorded run failed")
    finally:
        MemoryStore._read, MemoryStore._write = read, write  # type: ignore[method-assign]
    return calls


def replay(calls, slots, row_bytes: int, capacity_pages: int) -> dict:
    """Cold reads and read-modify-writes of ``calls`` with rows at ``slots(rows)``."""
    cache: OrderedDict[int, None] = OrderedDict()
    cold = {True: 0, False: 0}
    touched = 0
    for is_read, rows in calls:
        s = slots(rows)
        pages = np.unique(np.concatenate([s * row_bytes // PAGE, (s * row_bytes + row_bytes - 1) // PAGE]))
        touched += len(pages)
        for p in pages.tolist():
            if p in cache:
                cache.move_to_end(p)
                continue
            cold[is_read] += 1
            cache[p] = None
            if len(cache) > capacity_pages:
                cache.popitem(last=False)
    return {"cold_reads": cold[True], "cold_writes": cold[False], "pages_touched": touched}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--mode", default="lookahead", choices=("lookahead", "lru", "nocache"))
    p.add_argument("--cache-rows", type=int, required=True)
    p.add_argument("--lookahead", type=int, default=20)
    p.add_argument("--embedding-dim", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--page-cache-mb", default="200,400", help="comma-separated sizes of the modelled page cache")
    p.add_argument("--out", type=Path, help="also write the counts as JSON here")
    args = p.parse_args()

    from bagpipe.data.frequency import frequency_store_layout
    from bagpipe.data.shards import Dataset
    from bagpipe.store.layout import RowLayout

    calls = record(args)
    layouts = {"identity": RowLayout.identity(), "frequency": frequency_store_layout(Dataset(args.data))}
    row_bytes = 4 * (args.embedding_dim + 1)  # Adagrad: one state value a row
    reads = sum(len(r) for is_read, r in calls if is_read)
    writes = sum(len(r) for is_read, r in calls if not is_read)
    out = {"rows_read": reads, "rows_written": writes, "steps": args.steps, "results": []}
    print(f"{reads:,} rows read, {writes:,} written over {args.steps} steps")
    print("| page cache | layout | cold page reads a step | cold pages written a step | pages touched a step |")
    print("|---|---|---|---|---|")
    for mb in (int(x) for x in args.page_cache_mb.split(",")):
        for name, layout in layouts.items():
            r = replay(calls, layout.slots, row_bytes, mb * 2**20 // PAGE)
            out["results"].append({"page_cache_mb": mb, "layout": name, **r})
            per = {k: v / args.steps for k, v in r.items()}
            print(
                f"| {mb} MiB | {name} | {per['cold_reads']:,.0f} | {per['cold_writes']:,.0f} | {per['pages_touched']:,.0f} |"
            )
    if args.out:
        args.out.write_text(json.dumps(out, indent=1, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
