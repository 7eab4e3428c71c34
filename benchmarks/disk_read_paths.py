"""Which way of reading random rows from a disk store's table file is fastest when the
file does not fit in memory, and how close does it come to the raw device?

Runs inside a fresh memory cgroup (``--memory-limit-mb``, page cache included; see
``bagpipe/testbed/memlimit.py``) on an existing DiskStore directory much larger than the
limit (``bagpipe bench scale`` leaves one at bench-out/scale/store). For each of
``--batches`` batches of ``--batch-rows`` unique uniform random rows (the same batches
for every path, the page cache of the file dropped before each path), it times:

  faults-T     rows sorted by offset, np.take gathers from the MADV_RANDOM memory map
               split over T threads: page faults overlap across the T threads only
               (DiskStore's read path before issue 15, with T = 32)
  store-T      DiskStore.read with T threads: the same gather after the calling thread
               hinted every page of the batch (madvise(MADV_WILLNEED) per run of
               adjacent pages): the kernel queues every read at once, then the gather
               faults on pages already read or in flight (the path since issue 15, T = 8)
  pread-T      rows sorted, rows in the same or adjacent 4 KiB pages coalesced into one
               os.preadv each, the groups spread over T threads (no page faults)
  device-T     the raw-device probe (fio-like randread, bs = 4 KiB, iodepth T): O_DIRECT
               4 KiB reads of exactly the pages those rows lie in, T threads; what the
               device gives for that access pattern with no page cache in the way
  fio-QD       when ``fio`` is installed: fio randread of the same file, bs = 4 KiB,
               O_DIRECT, libaio at iodepth QD for --fio-seconds; rows/s = IOPS divided by
               the pages per row of that batch pattern (a straddling row needs two)

Prints rows/s per path (median over batches, first batch after the drop included) and
each path's ratio to the best raw-device figure (device-T or fio-QD), and writes --out JSON.

    python benchmarks/disk_read_paths.py --store bench-out/scale/store --out runs/read_paths.json
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bagpipe.store.disk import ROWS, DiskStore  # noqa: E402
from bagpipe.store.init import RowInitializer  # noqa: E402
from bagpipe.testbed.memlimit import MemoryGroup, find_memory_controller  # noqa: E402

PAGE = 4096


def open_store(path: Path, threads: int) -> DiskStore:
    h = json.loads((path / "header.json").read_text())
    init = RowInitializer(h["table_sizes"], h["dim"], h["seed"])
    return DiskStore(init, h["state_dim"], path, create=False, threads=threads)


def drop(path: Path) -> None:
    for f in path.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def pages_of(rows: np.ndarray, row_bytes: int) -> np.ndarray:
    first = rows * row_bytes // PAGE
    last = (rows * row_bytes + row_bytes - 1) // PAGE
    return np.unique(np.concatenate([first, last]))


def time_batches(fn, batches) -> list[float]:
    out = []
    for rows in batches:
        t = time.perf_counter()
        fn(rows)
        out.append(len(rows) / (time.perf_counter() - t))
    return out


def path_store(store: DiskStore):
    return store.read


def path_faults(store: DiskStore, pool: ThreadPoolExecutor, threads: int):
    R = store._r

    def read(rows):
        s = np.sort(rows)
        out = np.empty((len(s), R.shape[1]), np.float32)
        bounds = np.linspace(0, len(s), threads + 1).astype(int)

        def work(k):
            a, b = bounds[k], bounds[k + 1]
            if b > a:
                np.take(R, s[a:b], axis=0, out=out[a:b])

        list(pool.map(work, range(threads)))
        return out

    return read


def fio_rows_per_s(path: Path, qd: int, seconds: int, pages_per_row: float) -> float | None:
    import shutil
    import subprocess

    if shutil.which("fio") is None:
        return None
    cmd = [
        "fio",
        "--name=probe",
        f"--filename={path / ROWS}",
        "--rw=randread",
        "--bs=4k",
        "--direct=1",
        "--ioengine=libaio",
        f"--iodepth={qd}",
        f"--runtime={seconds}",
        "--time_based",
        "--readonly",
        "--output-format=json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  fio failed: {proc.stderr.strip()[-200:]}")
        return None
    iops = json.loads(proc.stdout)["jobs"][0]["read"]["iops"]
    return iops / pages_per_row


def path_pread(fd: int, row_bytes: int, pool: ThreadPoolExecutor, threads: int):
    def read(rows):
        s = np.sort(rows)
        first = s * row_bytes // PAGE
        last = (s * row_bytes + row_bytes - 1) // PAGE
        cut = np.flatnonzero(first[1:] > last[:-1] + 1) + 1  # a new group where pages are not adjacent
        starts = np.concatenate([[0], cut])
        stops = np.concatenate([cut, [len(s)]])
        offs = (s[starts] * row_bytes).tolist()
        ends = (s[stops - 1] * row_bytes + row_bytes).tolist()
        out = np.empty((len(s), row_bytes), np.uint8)
        groups = list(zip(offs, ends))
        parts = np.array_split(np.arange(len(groups)), threads)

        def work(ix):
            for i in ix.tolist():
                a, b = groups[i]
                os.pread(fd, b - a, a)

        list(pool.map(work, parts))
        return out

    return read


def path_device(path: Path, row_bytes: int, pool: ThreadPoolExecutor, threads: int):
    fd = os.open(path / ROWS, os.O_RDONLY | os.O_DIRECT)
    bufs = [mmap.mmap(-1, PAGE) for _ in range(threads)]  # page-aligned buffers, one per thread

    def read(rows):
        pages = pages_of(np.sort(rows), row_bytes)
        parts = np.array_split(pages, threads)

        def work(k):
            buf = bufs[k]
            for p in parts[k].tolist():
                os.preadv(fd, [buf], p * PAGE)

        list(pool.map(work, range(threads)))

    return read, fd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, default=Path("bench-out/scale/store"))
    ap.add_argument("--memory-limit-mb", type=float, default=2048)
    ap.add_argument("--batch-rows", type=int, default=40_000)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--threads", default="1,4,8,16,32")
    ap.add_argument("--paths", default="faults,store,pread,device,fio")
    ap.add_argument("--fio-seconds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    controller, where = find_memory_controller()
    if controller is None:
        print(f"disk_read_paths: skipped: no memory cgroup can be used here ({where})")
        return 0
    if os.environ.get("BAGPIPE_READ_PATHS_IN_GROUP") != "1":  # run this script again inside the group
        import subprocess

        with MemoryGroup(controller, int(a.memory_limit_mb * 2**20), "bagpipe-read-paths") as group:
            rc = subprocess.run(
                [sys.executable, *sys.argv],
                preexec_fn=group.enter,
                env={**os.environ, "BAGPIPE_READ_PATHS_IN_GROUP": "1"},
            ).returncode
            rep = group.report()
        print(
            f"group peak {rep['peak_mb']:.0f} MiB of {rep['limit_mb']:.0f}, limit hits {rep['limit_hits']}, "
            f"OOM kills {rep['oom_kills']}"
        )
        if a.out and a.out.exists():
            a.out.write_text(json.dumps(json.loads(a.out.read_text()) | {"group": rep}, indent=1))
        return rc
    rng = np.random.default_rng(0)
    probe_store = open_store(a.store, 1)
    n, rb = probe_store.num_rows, probe_store.row_bytes
    file_gib = n * rb / 2**30
    batches = [np.sort(rng.choice(n, a.batch_rows, replace=False)) for _ in range(a.batches)]
    batches = [rng.permutation(b) for b in batches]
    probe_store.close()
    threads = [int(t) for t in a.threads.split(",")]
    print(
        f"{a.store}: {n:,} rows x {rb} B = {file_gib:.2f} GiB; limit {a.memory_limit_mb:g} MiB ({where}); "
        f"{a.batches} batches of {a.batch_rows:,} uniform random rows",
        flush=True,
    )
    results: dict[str, dict[str, Any]] = {}  # by path: rows_per_s, batches, ratio_to_device
    for kind in a.paths.split(","):
        for t in threads:
            key = f"{kind}-{t}"
            drop(a.store)
            if kind == "fio":
                ppr = float(np.mean([len(pages_of(np.sort(b), rb)) / len(b) for b in batches]))
                r = fio_rows_per_s(a.store, t, a.fio_seconds, ppr)
                if r is None:
                    continue
                rates = [r]
            elif kind in ("faults", "store"):
                store = open_store(a.store, t)
                pool = ThreadPoolExecutor(t)
                try:
                    drop(a.store)
                    rates = time_batches(path_store(store) if kind == "store" else path_faults(store, pool, t), batches)
                finally:
                    store.close()
                    pool.shutdown()
            else:
                pool = ThreadPoolExecutor(t)
                if kind == "pread":
                    fd = os.open(a.store / ROWS, os.O_RDONLY)
                    rates = time_batches(path_pread(fd, rb, pool, t), batches)
                else:
                    fn, fd = path_device(a.store, rb, pool, t)
                    rates = time_batches(fn, batches)
                os.close(fd)
                pool.shutdown()
            results[key] = {"rows_per_s": statistics.median(rates), "batches": rates}
            print(
                f"  {key:12s} {statistics.median(rates):>10,.0f} rows/s  (batches: "
                + ", ".join(f"{r:,.0f}" for r in rates)
                + ")",
                flush=True,
            )
    dev = max((v["rows_per_s"] for k, v in results.items() if k.startswith(("device", "fio"))), default=float("nan"))
    for v in results.values():
        v["ratio_to_device"] = v["rows_per_s"] / dev
    print(f"best raw-device rows/s (device-T, fio-QD) {dev:,.0f}")
    for k, v in sorted(results.items(), key=lambda kv: -kv[1]["rows_per_s"]):
        print(f"  {k:12s} {v['ratio_to_device']:.2f}x of the device")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(
            json.dumps(
                {
                    "store": str(a.store),
                    "rows": n,
                    "row_bytes": rb,
                    "file_gib": file_gib,
                    "limit_mb": a.memory_limit_mb,
                    "batch_rows": a.batch_rows,
                    "results": results,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
