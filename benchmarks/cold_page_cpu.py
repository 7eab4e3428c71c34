"""How much CPU does one row of a disk store cost when its page is not in the page cache,
and does another way of doing the I/O cost less?

Issue 30 measured the lookahead pipeline's fetch and write-back threads spending most of
their CPU in the kernel (docs/pipeline.md): about 2-5 us of system time per cold row read
and ~20 us per row written back under `bench scale`'s memory limit. On two cores that CPU
is taken from forward and backward. This benchmark asks whether the way the store does its
I/O is the lever. It runs inside a fresh memory cgroup (``--memory-limit-mb``, page cache
included) and, with ``--fill-mb``, first fills the group's page cache with other pages of
the file so every new page costs a reclaim, as under ``bench scale``. For each path it
drops the file's pages, then reads (or writes back their own values, so the file does
not change) ``--batches`` batches of ``--rows`` unique random rows, and reports the
process's user and system CPU per batch (``getrusage``: every thread of the process).

Read paths:
  willneed-take  madvise(MADV_WILLNEED) per run of a batch's pages, then np.take from the
                 MADV_RANDOM map (what ``DiskStore.read`` does)
  take           np.take alone: every cold page a synchronous major fault
  populate       WILLNEED, then madvise(MADV_POPULATE_READ) per run (Linux 5.14+): the
                 pages mapped by one call each instead of by a fault each
  fadvise-pread  posix_fadvise(WILLNEED) per row, then one pread per row (no map)
  direct         O_DIRECT preads of each row's pages from 8 threads (no page cache)
Write paths (each ends with sync_file_range(WRITE), as the store's write-behind does):
  willneed-store WILLNEED per run, then stores through the map (``DiskStore.write``)
  store          stores through the map alone (a major fault per cold page)
  fadvise-pwrite posix_fadvise(WILLNEED) per row, then one pwrite per row
  pwrite         pwrite per row alone (the kernel reads the page synchronously)

    python benchmarks/cold_page_cpu.py --file bench-out/pipeline-scale/store/rows.f32 \\
        --cols 17 --memory-limit-mb 1024 --fill-mb 1400 --out runs/cold_page_cpu.json

The file is opened read-write for the write paths; rows are written with the values
they hold, so a store's contents do not change (do not run it beside a job using the
store).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bagpipe.testbed.memlimit import MemoryGroup, find_memory_controller  # noqa: E402

PAGE = 4096
MADV_POPULATE_READ = 22
SYNC_WRITE = 2
READS = ("willneed-take", "take", "populate", "fadvise-pread", "direct")
WRITES = ("willneed-store", "store", "fadvise-pwrite", "pwrite")


class ColdRows:
    """The file ``path`` of rows of ``cols`` float32, mapped, with every I/O path."""

    def __init__(self, path: Path, cols: int):
        self.size = path.stat().st_size
        self.rb = cols * 4
        self.n = self.size // self.rb
        self.fd = os.open(path, os.O_RDWR)
        self.dfd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        self.m = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.m.madvise(mmap.MADV_RANDOM)
        self.rows = np.frombuffer(self.m, dtype=np.float32, count=self.n * cols).reshape(self.n, cols)
        self.addr = self.rows.__array_interface__["data"][0]
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        self.pool = ThreadPoolExecutor(8)
        self.bounce = [mmap.mmap(-1, 2 * PAGE) for _ in range(8)]  # page-aligned, for O_DIRECT

    def drop(self) -> None:
        """Every page of the file out of the page cache (mapped ones unmapped first)."""
        os.fsync(self.fd)
        self.m.madvise(mmap.MADV_DONTNEED)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def fill(self, nbytes: int) -> None:
        """Read ``nbytes`` of the file's second half sequentially into the page cache."""
        buf = bytearray(8 << 20)
        off = self.size // 2
        while off < self.size // 2 + nbytes:
            os.preadv(self.fd, [buf], off)
            off += len(buf)

    def _pages(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return rows * self.rb // PAGE, (rows * self.rb + self.rb - 1) // PAGE

    def _advise(self, rows: np.ndarray, advice: int) -> None:
        for a, b in zip(*self._pages(rows)):
            self.libc.madvise(self.addr + int(a) * PAGE, int(b - a + 1) * PAGE, advice)

    def _fadvise(self, rows: np.ndarray) -> None:
        for r in rows.tolist():
            os.posix_fadvise(self.fd, r * self.rb, self.rb, os.POSIX_FADV_WILLNEED)

    def _sync(self) -> None:
        self.libc.sync_file_range(self.fd, 0, 0, SYNC_WRITE)

    def read(self, path: str, rows: np.ndarray, out: np.ndarray) -> None:
        if path in ("willneed-take", "populate"):
            self._advise(rows, mmap.MADV_WILLNEED)
        if path == "populate":
            self._advise(rows, MADV_POPULATE_READ)
        if path in ("willneed-take", "take", "populate"):
            np.take(self.rows, rows, axis=0, out=out)
        elif path == "fadvise-pread":
            self._fadvise(rows)
            for i, r in enumerate(rows.tolist()):
                out[i] = np.frombuffer(os.pread(self.fd, self.rb, r * self.rb), dtype=np.float32)
        elif path == "direct":
            self._direct(rows, out)

    def _direct(self, rows: np.ndarray, out: np.ndarray) -> None:
        first, last = self._pages(rows)
        parts = np.array_split(np.arange(len(rows)), len(self.bounce))

        def work(k: int) -> None:
            b = self.bounce[k]
            page_bytes = np.frombuffer(b, dtype=np.uint8)
            for i in parts[k].tolist():
                os.preadv(self.dfd, [memoryview(b)[: int(last[i] - first[i] + 1) * PAGE]], int(first[i]) * PAGE)
                off = int(rows[i]) * self.rb - int(first[i]) * PAGE
                out[i] = page_bytes[off : off + self.rb].view(np.float32)

        list(self.pool.map(work, range(len(parts))))

    def write(self, path: str, rows: np.ndarray, vals: np.ndarray) -> None:
        if path == "willneed-store":
            self._advise(rows, mmap.MADV_WILLNEED)
        if path == "fadvise-pwrite":
            self._fadvise(rows)
        if path in ("willneed-store", "store"):
            self.rows[rows] = vals
        else:
            for r, v in zip(rows.tolist(), vals):
                os.pwrite(self.fd, v, r * self.rb)
        self._sync()


def cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def measure(a: argparse.Namespace) -> dict:
    f = ColdRows(Path(a.file), a.cols)
    rng = np.random.default_rng(a.seed)
    paths = [p for p in a.paths.split(",") if p]
    runs: dict[str, list[tuple[float, float, float]]] = {p: [] for p in paths}
    for _ in range(a.reps):  # interleaved: each repetition runs every path once
        for p in paths:
            batches = [np.unique(rng.integers(0, f.n // 2, a.rows)) for _ in range(a.batches)]
            vals = [np.array(f.rows[b]) for b in batches] if p in WRITES else []
            f.drop()
            if a.fill_mb:
                f.fill(a.fill_mb << 20)
            u0, s0 = cpu()
            t0 = time.perf_counter()
            for i, b in enumerate(batches):
                if p in WRITES:
                    f.write(p, b, vals[i])
                else:
                    f.read(p, b, np.empty((len(b), a.cols), np.float32))
            wall = time.perf_counter() - t0
            u1, s1 = cpu()
            runs[p].append(((u1 - u0) / a.batches * 1e3, (s1 - s0) / a.batches * 1e3, wall / a.batches * 1e3))
    out = {}
    for p, v in runs.items():
        user, sys_, wall = (statistics.median(x[k] for x in v) for k in range(3))
        spread = (max(x[1] for x in v) - min(x[1] for x in v)) / sys_ if sys_ else 0.0
        out[p] = {
            "user_ms": user,
            "sys_ms": sys_,
            "wall_ms": wall,
            "sys_us_per_row": sys_ / a.rows * 1e3,
            "sys_spread": spread,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", required=True, help="a store's rows.f32 (or any file of float32 rows)")
    ap.add_argument("--cols", type=int, default=17, help="floats a row (D + S; default 17)")
    ap.add_argument("--paths", default=",".join(READS + WRITES), help="comma-separated paths (default: all)")
    ap.add_argument("--rows", type=int, default=2085, help="rows a batch (default 2085: bench modes' misses a step)")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory-limit-mb", type=int, default=1024, help="the cgroup's limit, page cache included")
    ap.add_argument("--fill-mb", type=int, default=0, help="page cache to fill first (above the limit: reclaim)")
    ap.add_argument("--out", help="JSON of the medians")
    a = ap.parse_args(argv)
    if os.environ.get("BAGPIPE_COLD_PAGE_IN_GROUP"):
        res = measure(a)
        print(json.dumps(res))
        return 0
    controller, why = find_memory_controller()
    if controller is None:
        print(f"cold_page_cpu: needs a memory cgroup: {why}", file=sys.stderr)
        return 2
    with MemoryGroup(controller, a.memory_limit_mb << 20, "bagpipe-cold-page") as group:
        env = {**os.environ, "BAGPIPE_COLD_PAGE_IN_GROUP": "1"}
        run = subprocess.run(
            [sys.executable, *sys.argv], preexec_fn=group.enter, env=env, capture_output=True, text=True
        )
    if run.returncode != 0:
        print(run.stderr, file=sys.stderr)
        return run.returncode
    res = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"{'path':16s} {'user ms':>8s} {'sys ms':>8s} {'wall ms':>8s} {'sys us/row':>11s} {'sys spread':>11s}")
    for p, r in res.items():
        print(
            f"{p:16s} {r['user_ms']:8.2f} {r['sys_ms']:8.2f} {r['wall_ms']:8.2f} "
            f"{r['sys_us_per_row']:11.2f} {r['sys_spread']:10.0%}"
        )
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"args": vars(a), "results": res}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
