"""What the lookahead pipeline costs, and the pieces that keep it off the trainer's path.

* :class:`ThreadClock` names every thread and reports the CPU it used between two moments:
  a thread that spins for a while shows that CPU under its name, a sleeping one none, the
  caller's thread is ``trainer``; ``pipeline_share`` divides the pipeline's groups by the
  compute's.
* A training run's summary reports the CPU of the pipeline's threads (planner, fetch,
  write-back), which stay until the executor closes so their CPU is counted, and the
  one-line advice.
* :class:`Advisor` hints pages through ``process_madvise`` (one system call for many
  ranges, without the interpreter lock) and, where that call is refused, through
  ``mmap.madvise``: either way the hinted pages of a cold file become resident.
* :func:`committed_zeros` makes a memory store's large arrays resident at once (no first
  write pays a page fault on the pipeline's write-back thread); small ones, and ones the
  machine could not hold, stay lazy.
* :class:`BackgroundLoad` starts CPU-bound processes, stops them, and none outlives a
  benchmark killed with SIGKILL.
* The advice of ``bagpipe plan`` and of a run's summary, message by message.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest

from bagpipe.cache.advice import layout_advice, plan_advice, run_advice
from bagpipe.config.modes import mode_spec
from bagpipe.store import diskio
from bagpipe.store.memory import COMMIT_BYTES, committed_zeros
from bagpipe.testbed.load import BackgroundLoad
from bagpipe.train.threadcpu import ThreadClock, ThreadTime, pipeline_share

linux = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux's /proc")


def _spin(seconds: float, done: threading.Semaphore | None = None, keep: threading.Event | None = None) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    if done is not None:
        done.release()
    if keep is not None:
        keep.wait(30)


@pytest.mark.unit
@linux
def test_thread_clock_reports_each_threads_cpu_under_its_name():
    clock = ThreadClock()
    clock.start()
    keep, done = threading.Event(), threading.Semaphore(0)
    busy = threading.Thread(target=_spin, args=(0.3, done, keep), name="bagpipe-fetch")
    idle = threading.Thread(target=keep.wait, args=(30,), name="bagpipe-writeback")
    pool = [threading.Thread(target=_spin, args=(0.1, done, keep), name=f"diskstore-read_{i}") for i in range(2)]
    threads = [busy, idle, *pool]
    for t in threads:
        t.start()
    _spin(0.1)
    for _ in range(3):  # the threads' work is done; they stay alive (the keep event) until read
        assert done.acquire(timeout=30)
    clock.stop()
    keep.set()
    for t in threads:
        t.join()
    per = clock.per_step(10)  # 10 steps: milliseconds per step
    assert 250 / 10 <= per["bagpipe-fetch"].cpu <= 600 / 10
    assert per["bagpipe-writeback"].cpu < 20 / 10
    assert per["diskstore-read"].threads == 2 and 150 / 10 <= per["diskstore-read"].cpu <= 500 / 10
    assert per["trainer"].cpu >= 80 / 10
    assert all(isinstance(v, ThreadTime) and v.runq >= 0 for v in per.values())


@pytest.mark.unit
def test_pipeline_share_divides_the_pipelines_cpu_by_the_computes():
    threads = {
        "trainer": {"cpu": 40.0},
        "native": {"cpu": 40.0},
        "bagpipe-fetch": {"cpu": 5.0},
        "bagpipe-writeback": {"cpu": 2.0},
        "diskstore-read": {"cpu": 1.0},
        "bagpipe-plans": {"cpu": 0.5},  # a distributed trainer's receiver of the oracle's plans
        "bagpipe-rss": {"cpu": 9.0},  # not the pipeline's
    }
    assert pipeline_share(threads) == pytest.approx(8.5 / 80.0)
    assert pipeline_share({"bagpipe-fetch": {"cpu": 1.0}}) is None


@linux
@pytest.mark.integration
def test_a_lookahead_runs_summary_counts_the_pipeline_threads_cpu(tiny_data, tmp_path, run_cli):
    out = tmp_path / "run"
    rc, _, err = run_cli("train", "--data", tiny_data, "--out", out, "--model", "dlrm", "--steps", 30,
                         "--batch-size", 128, "--mode", "lookahead", "--cache-rows", 1400, "--lookahead", 8,
                         "--warmup-steps", 2, "--no-progress", "--no-final-checkpoint")  # fmt: skip
    assert rc == 0, err
    s = json.loads((out / "summary.json").read_text())
    threads = s["threads_per_step_ms"]
    for name in ("trainer", "bagpipe-planner", "bagpipe-fetch", "bagpipe-writeback"):
        assert name in threads, sorted(threads)
    assert threads["trainer"]["cpu"] > 0
    assert s["pipeline_cpu_share"] is not None and s["pipeline_cpu_share"] >= 0
    assert set(s["cache"]["pipeline_s"]) >= {"fetch_busy", "writeback_busy", "planner_busy"}
    # the memory store is as fast as the cache: the run says lru would do as well
    assert s["advice"] is not None and "--mode lru would train about as fast" in s["advice"]


def _cold_file(path, pages: int) -> int:
    with open(path, "wb") as f:
        f.write(os.urandom(pages * mmap.PAGESIZE))
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return fd


def _resident(m, pages: np.ndarray) -> int:
    arr = np.frombuffer(m, np.uint8)
    base = arr.ctypes.data
    vec = (ctypes.c_ubyte * 1)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    n = sum(1 for p in pages.tolist() if libc.mincore(base + p * mmap.PAGESIZE, mmap.PAGESIZE, vec) == 0 and vec[0] & 1)
    del arr
    return n


@pytest.mark.unit
@linux
@pytest.mark.parametrize("refuse", [False, True], ids=["process_madvise", "refused-then-mmap.madvise"])
def test_advisor_makes_the_hinted_pages_of_a_cold_file_resident(tmp_path, monkeypatch, refuse):
    if refuse:  # a system call the kernel does not know: ENOSYS, as on a kernel before 5.10
        monkeypatch.setattr(diskio, "_SYS_PROCESS_MADVISE", 100_000)
    fd = _cold_file(tmp_path / "f", 256)
    m = mmap.mmap(fd, 256 * mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ)
    m.madvise(mmap.MADV_RANDOM)
    arr = np.frombuffer(m, np.uint8)
    advisor = diskio.Advisor(m, arr.ctypes.data)
    del arr
    pages = np.arange(3, 256, 7, dtype=np.int64)  # scattered single pages
    try:
        if _resident(m, pages) == len(pages):
            pytest.skip("the page cache kept the file (cannot make it cold here)")
        advisor.advise(pages * mmap.PAGESIZE, (pages + 1) * mmap.PAGESIZE, mmap.MADV_WILLNEED)
        if refuse:
            assert not advisor.vectored  # it fell back to the reference, for good
        deadline = time.monotonic() + 5
        while _resident(m, pages) < len(pages) and time.monotonic() < deadline:
            time.sleep(0.01)  # the hinted reads complete in the background
        assert _resident(m, pages) == len(pages)
    finally:
        advisor.close()
        m.close()
        os.close(fd)


@pytest.mark.unit
@linux
def test_a_large_memory_store_array_is_resident_when_made_and_a_small_one_is_not():
    proc = psutil.Process()
    before = proc.memory_info().rss
    big = committed_zeros((COMMIT_BYTES // 4 // 16, 16), np.float32)
    grown = proc.memory_info().rss - before
    assert big.shape == (COMMIT_BYTES // 64, 16) and big.dtype == np.float32 and not big.any()
    assert grown >= 0.9 * COMMIT_BYTES
    big[123] = 7.0  # writable
    assert big[123, 0] == 7.0
    small = committed_zeros((1000, 16), np.float32)
    assert small.shape == (1000, 16) and not small.any()


@pytest.mark.unit
@linux
def test_a_table_larger_than_the_available_memory_stays_lazy(monkeypatch):
    from bagpipe.store import memory

    monkeypatch.setattr(memory, "available_bytes", lambda: COMMIT_BYTES)  # 80% of it is less than the table
    proc = psutil.Process()
    before = proc.memory_info().rss
    lazy = committed_zeros((COMMIT_BYTES // 64, 16), np.float32)
    assert proc.memory_info().rss - before < 0.5 * COMMIT_BYTES
    assert lazy.shape == (COMMIT_BYTES // 64, 16) and lazy[-1, -1] == 0.0


@pytest.mark.unit
@linux
def test_background_load_spins_while_it_runs_and_is_gone_after():
    with BackgroundLoad(2) as load:
        pids = load.pids
        assert len(pids) == 2
        procs = [psutil.Process(p) for p in pids]
        time.sleep(0.6)
        assert all(sum(p.cpu_times()[:2]) > 0.1 for p in procs)
    assert load.pids == []
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


@linux
@pytest.mark.integration
def test_no_background_process_outlives_a_benchmark_killed_with_sigkill():
    code = (
        "import sys, time\n"
        "from bagpipe.testbed.load import BackgroundLoad\n"
        "load = BackgroundLoad(2).start()\n"
        "print(*load.pids, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = [p for p in pids if psutil.pid_exists(p)]
        assert not alive, f"background processes {alive} outlived the benchmark"
    finally:
        parent.kill()
        parent.wait(timeout=10)


@pytest.mark.unit
def test_plan_advice_names_the_faster_or_cheaper_mode():
    la, lru, nocache, full = (mode_spec(m) for m in ("lookahead", "lru", "nocache", "full"))
    fast = plan_advice(la, "memory", remote=False)
    assert fast is not None and "lru would train about as fast" in fast
    assert plan_advice(la, "disk", remote=False) is None
    assert plan_advice(la, "memory", remote=True) is None
    slow = plan_advice(lru, "disk", remote=False)
    assert slow is not None and "--mode lookahead reads them ahead" in slow and "disk store" in slow
    remote = plan_advice(nocache, "memory", remote=True)
    assert remote is not None and "embedding servers" in remote
    assert plan_advice(lru, "memory", remote=False) is None
    assert plan_advice(full, "memory", remote=False) is None


@pytest.mark.unit
def test_plan_advice_names_the_frequency_layout_for_a_disk_store_in_the_identity_layout():
    said = layout_advice("disk", remote=False, layout="identity")
    assert said is not None and "--store-layout frequency packs the rows the train split uses most" in said
    assert layout_advice("disk", remote=False, layout="frequency") is None
    assert layout_advice("memory", remote=False, layout="identity") is None
    assert layout_advice("disk", remote=True, layout="identity") is None  # a server's shard keeps the identity


@pytest.mark.unit
def test_run_advice_from_what_a_run_measured():
    la, lru = mode_spec("lookahead"), mode_spec("lru")
    quiet = {"fetch_busy": 0.05, "writeback_busy": 0.05}  # 2 ms a step over 50 plans
    said = run_advice(la, False, 50.0, {}, quiet, 50)
    assert said is not None and said.startswith(
        "the store is process memory: its reads and writes took 2.0 ms a step (4% of 50 ms)"
    )
    # a disk store whose reads and writes took 2 ms of a 50 ms step: its pages stayed cached, lru is as fast
    cached = run_advice(la, True, 50.0, {}, quiet, 50)
    assert cached is not None and cached.startswith("the disk store's reads and writes took 2.0 ms a step (4% of 50")
    assert "--mode lru would train about as fast here" in cached
    slow = {"fetch_busy": 0.5, "writeback_busy": 0.0}  # 10 ms a step: the pipeline hides it
    assert run_advice(la, True, 50.0, {}, slow, 50) is None
    assert run_advice(la, True, 50.0, {}, quiet, 50, remote=True) is None  # servers: latency, not only busy time
    waited = run_advice(lru, True, 50.0, {"wait_embeddings": 15.0, "writeback": 0.0}, {}, 50)
    assert waited is not None and waited.startswith("the step waited 15.0 ms (30% of 50 ms) for the store")
    assert run_advice(lru, True, 50.0, {"wait_embeddings": 2.0}, {}, 50) is None
    assert run_advice(lru, True, 0.0, {"wait_embeddings": 2.0}, {}, 50) is None
