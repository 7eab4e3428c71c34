"""What does writing rows back into a page-cached file cost the kernel, per page, when the
store keeps its dirty pages under a bound (issue 30: under `bench scale`'s memory limit the
lookahead write-back thread spends ~12 ms of kernel CPU a step, docs/pipeline.md)?

A file of ``--hot-rows`` rows of ``--row-bytes`` (bench scale's frequency layout: 486,643
rows of D = 64 weights + Adagrad state, 512 B) is read once into the page cache; then each
of ``--steps`` steps writes ``--rows`` distinct random rows with new values by one method,
and every half ``--dirty-mb`` of pages dirtied starts their writeback and waits for the
previous round's (``sync_file_range(WAIT_BEFORE | WRITE)``, what ``DiskStore`` does under
a budget; ``--dirty-mb 0``: never, the kernel's flusher writes them later). Methods:

  mmap     the rows stored through the file's memory map, one NumPy scatter (DiskStore's path)
  pwrite   one ``pwrite`` a row (no write-protect faults on pages written back; a Python call a row)

Prints the thread's user and kernel CPU a step (getrusage(RUSAGE_THREAD): not the time it
waited for a core, so a busy machine changes little), the kernel CPU spent inside the
writeback calls, and the pages dirtied a step.

    python benchmarks/writeback_kernel_cpu.py --dir /tmp/wb --rows 3000 --steps 60
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bagpipe.store.diskio import WAIT_BEFORE, WRITE, sync_file_range  # noqa: E402

PAGE = 4096


def cpu() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return r.ru_utime, r.ru_stime


def run(path: Path, method: str, args) -> dict:
    fd = os.open(path, os.O_RDWR)
    try:
        m = mmap.mmap(fd, os.fstat(fd).st_size)
        R = np.frombuffer(m, dtype=np.float32).reshape(-1, args.row_bytes // 4)
        float(R[: args.hot_rows].sum())  # every page in the page cache
        rng = np.random.default_rng(0)
        buf = np.ones((args.rows, args.row_bytes // 4), np.float32)
        half = int(args.dirty_mb * 2**20) // 2
        pending, rounds, in_sync, pages = 0, 0, 0.0, 0
        u0, s0 = cpu()
        for _ in range(args.steps):
            rows = np.sort(rng.choice(args.hot_rows, args.rows, replace=False))
            buf += 1
            if method == "mmap":
                R[rows] = buf
            else:
                mv = buf.data.cast("B")
                for i, r in enumerate(rows.tolist()):
                    os.pwrite(fd, mv[i * args.row_bytes : (i + 1) * args.row_bytes], r * args.row_bytes)
            dirtied = len(np.unique(rows * args.row_bytes // PAGE))
            pages += dirtied
            pending += dirtied * PAGE
            if half and pending >= half:
                pending, rounds = 0, rounds + 1
                a = cpu()[1]
                sync_file_range(fd, WAIT_BEFORE | WRITE)
                in_sync += cpu()[1] - a
        u1, s1 = cpu()
        del R
        m.close()
    finally:
        os.close(fd)
    n = args.steps
    return {
        "method": method,
        "dirty_mb": args.dirty_mb,
        "user_ms_per_step": 1e3 * (u1 - u0) / n,
        "kernel_ms_per_step": 1e3 * (s1 - s0) / n,
        "kernel_in_writeback_ms_per_step": 1e3 * in_sync / n,
        "pages_per_step": pages / n,
        "writeback_rounds": rounds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True, help="a folder for the file (removed after)")
    ap.add_argument("--hot-rows", type=int, default=486_643)
    ap.add_argument("--row-bytes", type=int, default=512)
    ap.add_argument("--rows", type=int, default=3000, help="rows written a step")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--dirty-mb", type=float, default=27.0, help="the dirty-page bound (0: none)")
    ap.add_argument("--methods", default="mmap,pwrite")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions; medians printed")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / "rows.f32"
    with open(path, "wb") as f:  # written, not sparse: a store's hot rows have their blocks
        chunk = bytes(args.row_bytes * 8192)
        for _ in range(-(-args.hot_rows // 8192)):
            f.write(chunk)
        os.fsync(f.fileno())
    try:
        out: dict[str, list[dict]] = {}
        for _ in range(args.reps):
            for method in args.methods.split(","):
                out.setdefault(method, []).append(run(path, method, args))
        for method, runs in out.items():
            med = {k: float(np.median([r[k] for r in runs])) for k in runs[0] if k.endswith(("step", "rounds"))}
            per_page = med["kernel_ms_per_step"] * 1e3 / med["pages_per_step"]
            print(
                f"{method:7s} dirty bound {args.dirty_mb:g} MiB: user {med['user_ms_per_step']:.2f} ms, kernel "
                f"{med['kernel_ms_per_step']:.2f} ms a step (of it in the writeback calls "
                f"{med['kernel_in_writeback_ms_per_step']:.2f}), {med['pages_per_step']:.0f} pages dirtied a step: "
                f"{per_page:.2f} us of kernel a page (medians of {len(runs)}; kernel ms/step "
                + ", ".join(f"{r['kernel_ms_per_step']:.2f}" for r in runs)
                + ")"
            )
    finally:
        path.unlink()


if __name__ == "__main__":
    main()
