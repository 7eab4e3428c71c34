"""How should the disk store write rows back, and how should it bound its page cache,
when the run lives inside a memory cgroup that counts the page cache (dirty pages
included)?

Each variant runs a lookahead run's store traffic, without training, in a child process
inside a fresh memory group (``bagpipe/testbed/memlimit.py``): for ``--steps`` steps it
reads ``--read-rows`` rows (drawn from a power law over the table, hot rows scattered
over the file, like the skewed profiles' lookups) and a writer thread writes back, with
new values, the rows read ``--delay`` steps earlier (the lookahead executor's write-back
thread). The file is dropped from the page cache before each variant. A sampler reads
the group's memory.stat every 0.25 s. Variants (``--variants``):

  kernel          DiskIO(dirty_bytes=None): writes through the memory map, writeback left
                  to the kernel (the store before memory budgets)
  behind-M        DiskIO(dirty_bytes=M MiB): the store starts the writeback of what it
                  dirtied every M/2 MiB and waits for the previous round
                  (sync_file_range(WAIT_BEFORE | WRITE)): dirty + writeback <= ~M MiB
  trim-P          behind-64 plus DiskIO(page_cache_bytes=P MiB): after touching P MiB of
                  pages the store unmaps its files and drops their clean pages (for a
                  budget with no cgroup to bound the page cache); run in a group without
                  a limit, to show the bound holds without one
  kernel-nolimit  kernel, in a group without a limit (what the page cache does unbounded)

Prints, per variant: steps/s, rows read and written per second, the largest dirty,
writeback and mapped figures of the group, its peak usage against the limit and its
OOM kills; writes --out JSON with every sample.

    python benchmarks/disk_write_paths.py --store bench-out/exp/store --memory-limit-mb 512 --out runs/write_paths.json
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bagpipe.store.disk import DiskStore  # noqa: E402
from bagpipe.store.diskio import DiskIO  # noqa: E402
from bagpipe.store.init import RowInitializer  # noqa: E402
from bagpipe.testbed.memlimit import MemoryGroup, find_memory_controller  # noqa: E402

MIB = 1 << 20
PRIME = 2_654_435_761  # spreads rank r over the file as r * PRIME % n (a bijection when gcd = 1)


def variant_io(name: str) -> tuple[DiskIO, bool]:
    """The DiskIO of a variant and whether it runs under the limit."""
    if name == "kernel":
        return DiskIO(dirty_bytes=None), True
    if name == "kernel-nolimit":
        return DiskIO(dirty_bytes=None), False
    kind, _, mb = name.partition("-")
    if kind == "behind":
        return DiskIO(dirty_bytes=int(mb) * MIB), True
    if kind == "trim":
        return DiskIO(dirty_bytes=64 * MIB, page_cache_bytes=int(mb) * MIB), False
    raise SystemExit(f"unknown variant {name!r}")


def batches(n: int, steps: int, rows: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ranks = np.unique(np.minimum(rng.zipf(1.05, size=rows * 2), n) - 1)[:rows]
        out.append(np.unique(ranks.astype(np.int64) * PRIME % n))
    return out


def child(a: argparse.Namespace) -> dict:
    h = json.loads((a.store / "header.json").read_text())
    init = RowInitializer(h["table_sizes"], h["dim"], h["seed"])
    io, _ = variant_io(a.child)
    store = DiskStore(init, h["state_dim"], a.store, create=False, io=io)
    plan = batches(store.num_rows, a.steps, a.read_rows)
    q: queue.Queue = queue.Queue(maxsize=a.delay + 1)
    written = [0]

    def writer() -> None:
        while (item := q.get()) is not None:
            rows, w, s = item
            store.write(rows, w, s)
            written[0] += len(rows)

    t = threading.Thread(target=writer)
    t.start()
    read_ms = []
    pending: list = []
    t0 = time.perf_counter()
    for rows in plan:
        r0 = time.perf_counter()
        w, s = store.read(rows)
        read_ms.append(1000 * (time.perf_counter() - r0))
        pending.append((rows, w + 1e-3, s))
        if len(pending) > a.delay:
            q.put(pending.pop(0))
    for item in pending:
        q.put(item)
    q.put(None)
    t.join()
    store.flush()
    seconds = time.perf_counter() - t0
    rounds = store._behind.rounds if store._behind is not None else 0
    store.close()
    read = sum(len(r) for r in plan)
    return {
        "seconds": seconds,
        "steps_per_s": a.steps / seconds,
        "rows_read_per_s": read / seconds,
        "rows_written_per_s": written[0] / seconds,
        "read_ms_median": statistics.median(read_ms),
        "writeback_rounds": rounds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, default=Path("bench-out/scale/store"))
    ap.add_argument("--memory-limit-mb", type=float, default=512)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--read-rows", type=int, default=10_000)
    ap.add_argument("--delay", type=int, default=20)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--variants", default="kernel,behind-64,behind-16,trim-256,kernel-nolimit")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a)))
        return 0
    controller, where = find_memory_controller()
    if controller is None:
        print(f"disk_write_paths: skipped: no memory cgroup can be used here ({where})")
        return 0
    h = json.loads((a.store / "header.json").read_text())
    rows, rb = sum(h["table_sizes"]), 4 * (h["dim"] + h["state_dim"])
    print(
        f"{a.store}: {rows:,} rows x {rb} B = {rows * rb / 2**30:.2f} GiB; limit {a.memory_limit_mb:g} MiB ({where}); "
        f"{a.steps} steps of {a.read_rows:,} rows read, written back {a.delay} steps later; load {os.getloadavg()}",
        flush=True,
    )
    results: dict[str, list[dict]] = {}
    for rep in range(a.reps):
        for name in a.variants.split(","):
            _, limited = variant_io(name)
            for f in a.store.iterdir():  # cold start: the file out of the page cache
                fd = os.open(f, os.O_RDONLY)
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            limit = int(a.memory_limit_mb * MIB) if limited else 0
            with MemoryGroup(controller, limit, "bagpipe-write-paths") as group:
                sampler = group.sample(0.25)
                cmd = [sys.executable, __file__, "--store", str(a.store), "--steps", str(a.steps)]
                cmd += ["--read-rows", str(a.read_rows), "--delay", str(a.delay), "--child", name]
                proc = subprocess.run(cmd, preexec_fn=group.enter, capture_output=True, text=True)
                series = sampler.stop()
                rep_ = group.report()
            res: dict[str, Any] = json.loads(proc.stdout) if proc.returncode == 0 else {"failed": proc.stderr[-500:]}
            res |= {"returncode": proc.returncode, "group": rep_, "max": sampler.maxima(), "series": series}
            results.setdefault(name, []).append(res)
            m = res["max"]
            print(
                f"[{rep + 1}] {name:15s} "
                + (f"{res['steps_per_s']:6.2f} steps/s " if "steps_per_s" in res else f"FAILED rc {proc.returncode} ")
                + f"dirty max {m['dirty']:6.0f} MiB, writeback max {m['writeback']:5.0f}, mapped max {m['mapped']:6.0f}, "
                f"peak {rep_['peak_mb']:6.0f} MiB, OOM kills {rep_['oom_kills']}",
                flush=True,
            )
    print(
        "\n| variant | limit MiB | steps/s (median) | runs | rows read/s | rows written/s | max dirty MiB | "
        "max writeback MiB | max mapped MiB | peak MiB | OOM kills |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        ok = [r for r in runs if "steps_per_s" in r]
        med = lambda k, ok=ok: statistics.median([r[k] for r in ok]) if ok else float("nan")  # noqa: E731
        print(
            f"| {name} | {runs[0]['group']['limit_mb'] or 'none'} | {med('steps_per_s'):.2f} | "
            + ", ".join(f"{r['steps_per_s']:.2f}" if "steps_per_s" in r else "failed" for r in runs)
            + f" | {med('rows_read_per_s'):,.0f} | {med('rows_written_per_s'):,.0f} | "
            f"{max(r['max']['dirty'] for r in runs):.0f} | {max(r['max']['writeback'] for r in runs):.0f} | "
            f"{max(r['max']['mapped'] for r in runs):.0f} | {max(r['group']['peak_mb'] for r in runs):.0f} | "
            f"{sum(r['group']['oom_kills'] for r in runs)} |"
        )
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
