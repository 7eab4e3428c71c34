"""How the disk store uses memory: its I/O settings and the two bounds it keeps.

A memory cgroup counts the page cache a process brings in, dirty pages included, and a
dirty page cannot be reclaimed until it has reached the device. Left to the kernel, the
rows a run writes back pile up as dirty pages (the kernel starts writing them after
``dirty_expire_centisecs``, 30 s by default, or when the machine's dirty share is
reached): 1.3 GiB of them in a 100-step run, and an OOM kill under a memory limit. So
the store keeps its own bounds (:class:`DiskIO`):

* **dirty pages** (:class:`WriteBehind`): after each write the store counts the pages it
  dirtied; once half of ``dirty_bytes`` has accumulated it waits for the writeback it
  started last time and starts writing the new ones (``sync_file_range(WAIT_BEFORE |
  WRITE)`` over the file), so at most ~``dirty_bytes`` of the file is dirty or under
  writeback at any moment, and written rows reach the device steadily. This is not a
  durability point (``flush`` still fsyncs before the presence flags are written);
* **pages in flight** (``hint_bytes``): a read or a write hints at most this many bytes
  of pages at once (``MADV_WILLNEED``), and gathers that round into a reused buffer. A
  hint is one system call per run of adjacent pages -- 10k calls for 10k scattered rows
  even when every page is cached -- so a round is hinted only when a sample of its
  pages (:class:`Residency`, ``mincore`` on 32 of them) shows more than 1 in 10 missing;
* **the page cache** (``page_cache_bytes``, off by default): where no memory cgroup
  bounds the page cache (a budget given on the command line on a machine without one),
  once the store has touched that many bytes of pages since the last trim it writes
  its dirty pages, unmaps its files and drops their clean pages (``MADV_DONTNEED``,
  ``POSIX_FADV_DONTNEED``). Under a cgroup limit the kernel's own reclaim does this
  better (it keeps the pages used most), so the budget leaves it off there.

The choice of these paths was measured (``benchmarks/disk_write_paths.py``; figures in
docs/beyond-memory.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import threading
from dataclasses import dataclass

import numpy as np

_MIB = 1 << 20
_MAX_IO = 1 << 30  # bytes per pread call (Linux caps a single read near 2 GiB)
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

# sync_file_range(2) flags
WAIT_BEFORE, WRITE, WAIT_AFTER = 1, 2, 4


@dataclass(frozen=True)
class DiskIO:
    """The disk store's memory settings (what a memory budget chooses; defaults without one).

    Attributes:
        threads: threads that gather (and scatter) rows, per pool.
        hint_bytes: pages hinted and gathered per round of a read or write (bytes of
            pages; each scattered row is about one 4 KiB page).
        dirty_bytes: bound of the store file's dirty + under-writeback pages; None
            leaves writeback to the kernel (the behaviour before memory budgets).
        page_cache_bytes: trim the store's page cache after touching this many bytes of
            pages (None: leave the page cache to the kernel and the cgroup's limit).
        chunk_rows: rows per chunk of a sequential read (digest, export, checkpoints).
    """

    threads: int = 1
    hint_bytes: int = 64 * _MIB
    dirty_bytes: int | None = 64 * _MIB
    page_cache_bytes: int | None = None
    chunk_rows: int = 1 << 16

    def __post_init__(self) -> None:
        for name in ("threads", "hint_bytes", "chunk_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"DiskIO.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("dirty_bytes", "page_cache_bytes"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"DiskIO.{name} must be None or >= 1, got {getattr(self, name)}")

    def round_rows(self) -> int:
        """Rows per round of hints and gathers (a scattered row is about one page)."""
        return max(16, self.hint_bytes // PAGE)

    def scratch_bytes(self, row_bytes: int) -> int:
        """Memory of the reused buffers of one reading or writing thread."""
        return max(self.round_rows(), self.chunk_rows) * row_bytes


def _libc_sync_file_range():
    """``sync_file_range`` from the C library, or None where it has none (not Linux)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _libc_sync_file_range()


def _libc_fallocate():
    """``fallocate`` from the C library, or None where it has none. Through PyDLL, keeping the
    interpreter lock: a reservation is one call per page of new rows, each a few µs, and
    handing the lock over for every call costs far more beside a busy thread -- 4,000 calls
    beside a spinning Python thread took 6.8-7.0 s through CDLL, 50 ms through PyDLL."""
    try:  # PyDLL, as mincore's: no hand-over of the interpreter lock per call
        fn = ctypes.PyDLL(ctypes.util.find_library("c"), use_errno=True).fallocate
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


_FALLOCATE = _libc_fallocate()
FALLOC_FL_KEEP_SIZE = 1


class Reserver:
    """Gives the pages about to be written through a shared map their blocks first.

    A store's files are sparse, and a write through a map into a hole on a full file
    system cannot fail with an error: the kernel kills the process with SIGBUS. So before
    rows that were never written are stored through the map, their byte ranges are
    allocated with ``fallocate(KEEP_SIZE)`` (mode 0: never changes what the file holds),
    which answers ENOSPC as an :class:`OSError` instead. Rows written before already own
    their blocks, so a run pays one call per run of new rows, once per row. Where the
    file system cannot ``fallocate`` (EOPNOTSUPP), nothing is reserved from then on.
    """

    def __init__(self, fd: int):
        self.fd = fd
        self.works = _FALLOCATE is not None

    def reserve(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Allocate the byte ranges [starts[i], ends[i]) of the file."""
        if not self.works:
            return
        assert _FALLOCATE is not None
        for a, b in zip(np.asarray(starts).tolist(), np.asarray(ends).tolist()):
            if _FALLOCATE(self.fd, FALLOC_FL_KEEP_SIZE, a, b - a) != 0:
                e = ctypes.get_errno()
                if e in (errno.EOPNOTSUPP, errno.ENOSYS):
                    self.works = False
                    return
                if e == errno.EINTR:
                    self.reserve(np.array([a]), np.array([b]))
                    continue
                raise OSError(e, os.strerror(e))


def page_runs(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The byte ranges [starts[i], ends[i]) (sorted by start, nondecreasing ends) widened
    to whole pages and merged where they touch: (run starts, run ends)."""
    first = np.asarray(starts, np.int64) // PAGE
    last = (np.asarray(ends, np.int64) - 1) // PAGE
    cut = np.flatnonzero(first[1:] > last[:-1] + 1) + 1
    return first[np.concatenate([[0], cut])] * PAGE, (last[np.concatenate([cut - 1, [len(first) - 1]])] + 1) * PAGE


def _libc_mincore():
    try:  # PyDLL: mincore never blocks, so the call keeps the interpreter lock (no hand-over per page)
        fn = ctypes.PyDLL(ctypes.util.find_library("c"), use_errno=True).mincore
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_MINCORE = _libc_mincore()


#: process_madvise(2): one system call advises up to IOV_MAX ranges (Linux 5.10+).
_SYS_PROCESS_MADVISE = 440 if os.uname().machine in ("x86_64", "aarch64") else None
_IOV_MAX = 1024


class Advisor:
    """``madvise`` over many byte ranges of one map, without holding the interpreter lock.

    ``mmap.madvise`` holds the interpreter lock during the system call, and a WILLNEED hint
    on cold pages blocks in the block layer while it queues their reads: measured, the
    trainer's forward pass waited ~20 ms a step for a fetch thread's hints
    (docs/pipeline.md). :meth:`advise` gives the kernel up to 1,024 ranges per call of
    ``process_madvise(2)`` on this process's pidfd, through ctypes, which releases the lock
    for the call: a round of thousands of scattered pages costs a handful of calls, during
    which the trainer's thread runs. Where the call is missing or refused (kernels before
    5.10, other architectures) it falls back to ``mmap.madvise`` range by range
    (:attr:`vectored` False), the reference.
    """

    def __init__(self, m, base: int | None):
        self.m = m
        self.base = base
        self.vectored = False
        self._pidfd: int | None = None
        if base is None or _SYS_PROCESS_MADVISE is None or not hasattr(os, "pidfd_open"):
            return
        try:
            self._syscall = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).syscall
            self._syscall.restype = ctypes.c_long
            self._pid = os.getpid()
            self._pidfd = os.pidfd_open(self._pid)
        except (OSError, AttributeError):
            return
        self.vectored = True

    def advise(self, starts: np.ndarray, ends: np.ndarray, advice: int) -> None:
        """``madvise(advice)`` over the map's byte ranges [starts[i], ends[i])."""
        base, pidfd, call = self.base, self._pidfd, _SYS_PROCESS_MADVISE
        vectored = self.vectored and base is not None and pidfd is not None and call is not None
        if vectored and len(starts) and os.getpid() == self._pid:  # (a forked child: not its pidfd)
            assert base is not None and pidfd is not None and call is not None
            iov = np.empty((len(starts), 2), dtype=np.uint64)  # struct iovec {base, len}
            iov[:, 0] = np.asarray(starts, np.uint64) + np.uint64(base)
            iov[:, 1] = np.asarray(ends, np.uint64) - np.asarray(starts, np.uint64)
            for a in range(0, len(iov), _IOV_MAX):
                k = min(_IOV_MAX, len(iov) - a)
                got = self._syscall(
                    ctypes.c_long(call),
                    ctypes.c_int(pidfd),
                    ctypes.c_void_p(iov[a:].ctypes.data),
                    ctypes.c_size_t(k),
                    ctypes.c_int(advice),
                    ctypes.c_uint(0),
                )
                if got < 0:  # refused (an older kernel, a seccomp filter): the reference from here on
                    self.vectored = False
                    self.advise(starts[a:], ends[a:], advice)
                    return
            return
        for a, b in zip(np.asarray(starts).tolist(), np.asarray(ends).tolist()):
            self.m.madvise(advice, a, b - a)

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


#: Pages of a round sampled to decide whether to hint it, and the share missing that does.
SAMPLE_PAGES = 32
COLD_SHARE = 0.1


class Residency:
    """Which pages of a shared file map are in the page cache, by sampling (``mincore``).

    ``cold(pages)`` is True when more than :data:`COLD_SHARE` of up to
    :data:`SAMPLE_PAGES` of ``pages`` (evenly spread) are not resident -- or when it
    cannot tell (no ``mincore``): then hinting is the safe side.
    """

    def __init__(self, m):
        self.base = None
        if _MINCORE is not None:
            c = ctypes.c_char.from_buffer(m)  # only for its address: the export ends with ``c``
            self.base = ctypes.addressof(c)
            del c
        self._vec = (ctypes.c_ubyte * 1)()

    def cold(self, pages: np.ndarray) -> bool:
        if self.base is None or _MINCORE is None or len(pages) == 0:
            return True
        pick = pages[np.linspace(0, len(pages) - 1, min(SAMPLE_PAGES, len(pages))).astype(np.int64)]
        missing = 0
        for p in pick.tolist():
            if _MINCORE(self.base + p * PAGE, PAGE, self._vec) != 0:
                return True
            missing += not (self._vec[0] & 1)
        return missing > COLD_SHARE * len(pick)


def sync_file_range(fd: int, flags: int) -> None:
    """``sync_file_range(fd, 0, 0, flags)`` over the whole file (ctypes releases the GIL);
    ``fdatasync`` where the call does not exist (slower, same bound)."""
    if _SYNC_FILE_RANGE is None:
        os.fdatasync(fd)
        return
    if _SYNC_FILE_RANGE(fd, 0, 0, flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"sync_file_range: {os.strerror(e)}")


class WriteBehind:
    """Keeps the dirty pages of file ``fd`` under ``bound`` bytes (see the module docstring).

    :meth:`wrote` is called with the bytes of pages each write dirtied; every half bound
    it waits for the previous round's writeback and starts the next. Thread-safe.
    """

    def __init__(self, fd: int, bound: int):
        self.fd = fd
        self.half = max(PAGE, int(bound) // 2)
        self.pending = 0
        self.rounds = 0
        self._lock = threading.Lock()

    def wrote(self, nbytes: int) -> None:
        with self._lock:
            self.pending += int(nbytes)
            if self.pending < self.half:
                return
            self.pending = 0
            self.rounds += 1
            sync_file_range(self.fd, WAIT_BEFORE | WRITE)


def pages_spanned(srows, row_bytes: int) -> int:
    """Distinct pages the rows ``srows`` (sorted, unique) of ``row_bytes`` each lie in."""
    if len(srows) == 0:
        return 0
    first = srows * row_bytes // PAGE
    last = (srows * row_bytes + row_bytes - 1) // PAGE
    return int((last - first + 1).sum() - (first[1:] <= last[:-1]).sum())


def drop_file_pages(fd: int) -> None:
    """Write the file's dirty pages and wait, then drop its clean pages from the page cache."""
    sync_file_range(fd, WAIT_BEFORE | WRITE | WAIT_AFTER)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def pread_into(fd: int, buf: np.ndarray, offset: int) -> None:
    """Fill the contiguous array ``buf`` from ``fd`` at ``offset`` (holes read as zeros)."""
    mv = buf.data.cast("B")
    done = 0
    while done < len(mv):
        n = os.preadv(fd, [mv[done : done + _MAX_IO]], offset + done)
        if n <= 0:  # past the end of a truncated file
            mv[done:] = b"\0" * (len(mv) - done)
            return
        done += n


def pwrite_from(fd: int, buf: np.ndarray, offset: int) -> None:
    """Write the contiguous array ``buf`` to ``fd`` at ``offset``."""
    mv = buf.data.cast("B")
    done = 0
    while done < len(mv):
        done += os.pwritev(fd, [mv[done : done + _MAX_IO]], offset + done)
