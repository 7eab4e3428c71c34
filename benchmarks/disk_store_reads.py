"""How fast does DiskStore read a miss-heavy batch of random rows from a cold file?

Creates a DiskStore (in a temp dir under --dir, default the system temp dir; it must
be a real disk, not tmpfs), writes every row once in 1M-row chunks so the file is
fully allocated (33.8M rows x D=16 float32 = 2.16 GB by default; with --state-dim S
each row is D + S floats, weights and state side by side in rows.f32, so a cold row
costs one page fault whatever S is), then for each row distribution (uniform, and
Zipf-like over a scrambled row order) and each strategy:

  diskstore         DiskStore.read: rows sorted, np.take gathers of whole (D + S)-float
                    rows from a MADV_RANDOM memory map of rows.f32, split over a
                    persistent pool of --threads threads
  pread_pool        the alternative: rows sorted, rows whose bytes lie in the same or
                    adjacent 4 KiB pages coalesced into one os.pread/preadv, groups
                    spread over a pool of --threads threads
  mmap_1thread      baseline: one np.take gather from a MADV_RANDOM np.memmap
  mmap_1thread_ra   naive baseline: one gather from a plain np.memmap (default
                    read-around: each page fault reads up to read_ahead_kb)

drops the page cache (fsync + POSIX_FADV_DONTNEED), times --batches batches of
--batch-rows unique rows in random caller order ("cold" pass: the first batches are
all misses; later Zipf batches hit pages earlier batches brought in), then times the
same batches again ("warm" pass: everything cached). Every strategy returns rows in
the caller's order and its first and last batch are checked against the written
values. Major page faults (getrusage) are counted per batch: a cold mmap gather of
rows.f32 costs about one fault per row (1 + (D + S - 1) / 1024 with straddling rows;
pread_pool reads fault nothing, they show up as 0). Prints a table and writes --out JSON.

The first cold batch is the honest miss-only number ("first" rows/s): once
--batches x --batch-rows approaches the number of 4 KiB pages of rows.f32 (a small
--rows), later "cold" batches mostly hit pages earlier batches brought in.

    .venv/bin/python benchmarks/disk_store_reads.py --out runs/bench/disk_store_reads.json
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bagpipe.store.disk import ROWS, DiskStore  # noqa: E402
from bagpipe.store.init import RowInitializer  # noqa: E402

PAGE = 4096
WRITE_CHUNK = 1 << 20


def expected(rows: np.ndarray, dim: int, state_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The values the benchmark writes to each row (a cheap deterministic function)."""
    r = rows.astype(np.int64)[:, None]
    w = ((r * 7919 + np.arange(dim)) % 1_000_003).astype(np.float32)
    s = ((r * 31 + np.arange(state_dim)) % 65_521).astype(np.float32)
    return w, s


# ---------------------------------------------------------------- batches


def uniform_batches(rng, n_rows: int, batch: int, count: int) -> list[np.ndarray]:
    return [rng.choice(n_rows, batch, replace=False) for _ in range(count)]


def zipf_batches(rng, n_rows: int, batch: int, count: int, s: float) -> list[np.ndarray]:
    """Unique rows drawn by a Zipf(s) law over ranks, ranks scattered over the file."""
    mult = 2_654_435_761
    while math.gcd(mult, n_rows) != 1:
        mult += 2
    out = []
    for _ in range(count):
        seen: list[np.ndarray] = []
        have = 0
        draws = batch * 4
        got = np.zeros(0, np.int64)
        while have < batch:
            u = rng.random(draws)
            if abs(s - 1.0) < 1e-9:
                rank = np.floor(np.power(float(n_rows), u))
            else:
                a = 1.0 - s
                rank = np.floor(np.power((n_rows**a - 1.0) * u + 1.0, 1.0 / a))
            seen.append(np.minimum(rank.astype(np.int64), n_rows) - 1)
            cat = np.concatenate(seen)
            uniq, first = np.unique(cat, return_index=True)
            have = len(uniq)
            got = cat[np.sort(first)]  # first-appearance order is already random
            draws *= 2
        ranks = got[:batch]
        out.append((ranks * mult) % n_rows)
    return out


# ---------------------------------------------------------------- strategies


def in_callers_order(res: np.ndarray, order: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Whole rows gathered in sorted order -> weights, state in the caller's order (as DiskStore does it)."""
    inv = np.empty(len(order), np.intp)
    inv[order] = np.arange(len(order), dtype=np.intp)
    return np.take(res[:, :dim], inv, axis=0), np.take(res[:, dim:], inv, axis=0)


class Reader(Protocol):
    """What each strategy is: DiskStore itself, or one of the alternatives below."""

    def read(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def close(self) -> None: ...


class PreadPool:
    """Sorted, page-coalesced preads from a thread pool (the alternative to mmap gathers)."""

    def __init__(self, path: Path, num_rows: int, dim: int, state_dim: int, threads: int):
        self.dim, self.cols, self.threads = dim, dim + state_dim, threads
        self.fd = os.open(path / ROWS, os.O_RDONLY)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)
        self.pool = ThreadPoolExecutor(threads)
        list(self.pool.map(lambda _: None, range(threads * 2)))  # start the threads now

    def _read_file(self, fd: int, cols: int, srows: np.ndarray) -> np.ndarray:
        rb = 4 * cols
        n = len(srows)
        out = np.empty((n, cols), np.float32)
        mv = out.data.cast("B")
        off = srows * rb
        pg0, pg1 = off // PAGE, (off + rb - 1) // PAGE
        brk = np.flatnonzero(pg0[1:] > pg1[:-1] + 1) + 1
        gs = np.concatenate([[0], brk]).tolist()
        ge = np.concatenate([brk, [n]]).tolist()
        offl = off.tolist()
        col = np.arange(cols)

        def task(a: int, b: int) -> None:
            preadv, pread = os.preadv, os.pread
            for g in range(a, b):
                i, j = gs[g], ge[g]
                if j - i == 1 or offl[j - 1] - offl[i] == (j - i - 1) * rb:  # adjacent rows
                    preadv(fd, [mv[i * rb : j * rb]], offl[i])
                else:
                    lo = offl[i]
                    buf = np.frombuffer(pread(fd, offl[j - 1] + rb - lo, lo), np.float32)
                    rel = (off[i:j] - lo) // 4
                    out[i:j] = buf[rel[:, None] + col]

        k = min(self.threads, len(gs))
        bounds = np.linspace(0, len(gs), k + 1).astype(int).tolist()
        futs = [self.pool.submit(task, a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        for f in futs:
            f.result()
        return out

    def read(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(rows)
        srows = rows[order]
        return in_callers_order(self._read_file(self.fd, self.cols, srows), order, self.dim)

    def close(self) -> None:
        self.pool.shutdown()
        os.close(self.fd)


class MmapOneThread:
    """One np.take gather of whole rows from an np.memmap of rows.f32 (optionally MADV_RANDOM)."""

    def __init__(self, path: Path, num_rows: int, dim: int, state_dim: int, random_advice: bool):
        self.dim = dim
        shape = (num_rows, dim + state_dim)
        with open(path / ROWS, "rb") as f:  # what np.memmap(..., "r") does, with the mmap at hand
            self.mm = mmap.mmap(f.fileno(), 4 * shape[0] * shape[1], access=mmap.ACCESS_READ)
        if random_advice:
            self.mm.madvise(mmap.MADV_RANDOM)
        self.map = np.ndarray(shape, np.float32, buffer=self.mm)

    def read(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = np.argsort(rows)
        srows = rows[order]
        return in_callers_order(np.take(np.asarray(self.map), srows, axis=0), order, self.dim)

    def close(self) -> None:
        del self.map  # the array's export of the mmap's buffer first, or close raises BufferError
        self.mm.close()


# ---------------------------------------------------------------- driver


def major_faults() -> int:
    """Major page faults of this process so far (all threads): page-ins of the memory maps."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def summary(times: list[float], rows_per_batch: int, faults: list[int]) -> dict:
    t = np.array(times)
    return {
        "major_faults_first_batch": faults[0],
        "major_faults_per_row_first_batch": faults[0] / rows_per_batch,
        "major_faults": int(sum(faults)),
        "major_faults_each": faults,
        "ms_per_batch_mean": float(t.mean() * 1e3),
        "ms_per_batch_median": float(np.median(t) * 1e3),
        "ms_first_batch": float(t[0] * 1e3),
        "ms_per_batch_max": float(t.max() * 1e3),
        "rows_per_s": float(rows_per_batch * len(t) / t.sum()),
        "first_batch_rows_per_s": float(rows_per_batch / t[0]),
        "ms_each": [round(x * 1e3, 2) for x in times],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=33_800_000, help="rows in the store (33.8M x D16 = 2.16 GB)")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument(
        "--state-dim", type=int, default=0, help="S (1: row-wise Adagrad); stored beside the weights of each row"
    )
    ap.add_argument("--batch-rows", type=int, default=40_000)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--dist", choices=["uniform", "zipf", "both"], default="both")
    ap.add_argument("--zipf-s", type=float, default=1.05)
    ap.add_argument("--strategies", default="diskstore,pread_pool,mmap_1thread,mmap_1thread_ra")
    ap.add_argument("--dir", default=None, help="parent of the temporary store directory (a real disk)")
    ap.add_argument("--keep", action="store_true", help="keep the store directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write results as JSON here")
    args = ap.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="bagpipe-diskbench-", dir=args.dir))
    path = root / "store"
    init = RowInitializer([args.rows], args.dim, seed=args.seed)
    result: dict = {
        "config": vars(args),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "store_dir": str(path),
        },
        "results": {},
    }
    try:
        store = DiskStore(init, args.state_dim, path, threads=args.threads)
        t0 = time.perf_counter()
        for a in range(0, args.rows, WRITE_CHUNK):
            rows = np.arange(a, min(args.rows, a + WRITE_CHUNK), dtype=np.int64)
            store.write(rows, *expected(rows, args.dim, args.state_dim))
        t_write = time.perf_counter() - t0
        store.flush()
        t_flush = time.perf_counter() - t0 - t_write
        nbytes = args.rows * 4 * (args.dim + args.state_dim)
        result["write"] = {
            "seconds": t_write,
            "flush_seconds": t_flush,
            "bytes": nbytes,
            "MB_per_s": nbytes / 1e6 / (t_write + t_flush),
            "rows_per_s": args.rows / (t_write + t_flush),
        }
        print(f"wrote {args.rows:,} rows ({nbytes / 1e9:.2f} GB) in {t_write:.1f}s + flush {t_flush:.1f}s")

        rng = np.random.default_rng(args.seed)
        dists = ["uniform", "zipf"] if args.dist == "both" else [args.dist]
        strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
        for dist in dists:
            if dist == "uniform":
                batches = uniform_batches(rng, args.rows, args.batch_rows, args.batches)
            else:
                batches = zipf_batches(rng, args.rows, args.batch_rows, args.batches, args.zipf_s)
            row_bytes = 4 * (args.dim + args.state_dim)
            off = np.concatenate(batches) * row_bytes
            pages = np.unique(np.concatenate([off // PAGE, (off + row_bytes - 1) // PAGE]))
            straddle = float(np.mean(off // PAGE != (off + row_bytes - 1) // PAGE))
            result["results"][dist] = {
                "distinct_row_pages_over_all_batches": len(pages),
                "row_file_pages": -(-args.rows * row_bytes // PAGE),
                "rows_straddling_a_page": straddle,
            }
            for name in strategies:
                reader: Reader
                if name == "diskstore":
                    reader = store
                elif name == "pread_pool":
                    reader = PreadPool(path, args.rows, args.dim, args.state_dim, args.threads)
                elif name in ("mmap_1thread", "mmap_1thread_ra"):
                    reader = MmapOneThread(path, args.rows, args.dim, args.state_dim, name == "mmap_1thread")
                else:
                    raise SystemExit(f"unknown strategy {name}")
                store.drop_page_cache()  # also evicts pages the other readers cached
                passes = {}
                for pass_name in ("cold", "warm"):
                    times, faults = [], []
                    for i, rows in enumerate(batches):
                        f = major_faults()
                        t = time.perf_counter()
                        w, s = reader.read(rows)
                        times.append(time.perf_counter() - t)
                        faults.append(major_faults() - f)
                        if i in (0, len(batches) - 1):
                            ew, es = expected(rows, args.dim, args.state_dim)
                            assert np.array_equal(w, ew) and np.array_equal(s, es), (name, dist, i)
                    passes[pass_name] = summary(times, args.batch_rows, faults)
                if reader is not store:
                    reader.close()
                result["results"][dist][name] = passes
                c, wm = passes["cold"], passes["warm"]
                print(
                    f"{dist:8s} {name:16s} cold: {c['rows_per_s']:>10,.0f} rows/s  "
                    f"first {c['first_batch_rows_per_s']:>9,.0f} rows/s "
                    f"{c['major_faults_per_row_first_batch']:.2f} faults/row  "
                    f"{c['ms_per_batch_mean']:8.1f} ms/batch (first {c['ms_first_batch']:.0f}, "
                    f"median {c['ms_per_batch_median']:.0f})   warm: {wm['rows_per_s']:>12,.0f} rows/s "
                    f"{wm['ms_per_batch_mean']:7.1f} ms/batch",
                    flush=True,
                )
        store.close()
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
