"""Linux memory control groups for benchmarks that must not fit in memory.

A :class:`MemoryGroup` is a fresh child cgroup with a memory limit that counts the page
cache as well as the process's own memory (both cgroup versions charge a page of the
page cache to the group that first brought it in). ``bagpipe bench scale`` starts each
trainer process inside one (:meth:`MemoryGroup.enter` as the child's ``preexec_fn``),
reads the group's peak usage, limit hits and OOM kills when it ends, and removes it. A
benchmark killed before it could remove its group leaves it; the next :class:`MemoryGroup`
removes every such group whose owner (the pid at the end of its name) is gone and which
holds no process (:func:`remove_stale_groups`).

Detection (:func:`find_memory_controller`): cgroup v1 when the memory controller is
mounted at ``/sys/fs/cgroup/memory`` (the group is made inside this process's own
memory group, so an enclosing limit still applies), else cgroup v2 when the unified
hierarchy at ``/sys/fs/cgroup`` offers the ``memory`` controller. Making a group needs
write access to that hierarchy (root, or a delegated subtree); where neither works
the reason is returned as one line and the caller skips.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bagpipe.budget.cgroup import Group

V1_ROOT = Path("/sys/fs/cgroup/memory")
V2_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Controller:
    """Where new memory groups are made: ``version`` 1 or 2 and the parent directory."""

    version: int
    parent: Path


def _own_group(controller_line: str) -> str | None:
    """This process's group path in /proc/self/cgroup for the v1 controller named (or "" for v2)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and (parts[1] == controller_line or (controller_line == "" and parts[0] == "0")):
            return parts[2]
    return None


def _try_make(parent: Path) -> str | None:
    """None when a child group can be made (and removed) under ``parent``, else why not."""
    probe = parent / f"bagpipe-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError as e:
        return f"cannot create a group under {parent} ({e.strerror})"
    try:
        probe.rmdir()
    except OSError:
        pass
    return None


def find_memory_controller() -> tuple[Controller | None, str]:
    """The memory controller new groups can be made under, or None and the reason."""
    reasons = []
    if (V1_ROOT / "memory.limit_in_bytes").exists():
        own = _own_group("memory") or "/"
        for parent in dict.fromkeys([V1_ROOT / own.lstrip("/"), V1_ROOT]):
            why = _try_make(parent)
            if why is None:
                return Controller(1, parent), f"cgroup v1 memory controller at {parent}"
            reasons.append(why)
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        own = _own_group("") or "/"
        parent = V2_ROOT / own.lstrip("/")
        try:
            subtree = (parent / "cgroup.subtree_control").read_text().split()
            if "memory" not in subtree:
                (parent / "cgroup.subtree_control").write_text("+memory")
        except OSError as e:
            reasons.append(f"cannot enable the memory controller under {parent} ({e.strerror})")
        else:
            why = _try_make(parent)
            if why is None:
                return Controller(2, parent), f"cgroup v2 memory controller at {parent}"
            reasons.append(why)
    if not reasons:
        reasons.append(
            "no cgroup memory controller mounted (neither /sys/fs/cgroup/memory nor a unified "
            "/sys/fs/cgroup offering 'memory')"
        )
    return None, "; ".join(reasons)


_OWNED = re.compile(r"^bagpipe-[a-z-]+-(\d+)$")  # the groups MemoryGroup names: bagpipe-<what>-<owner pid>


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def remove_stale_groups(parent: Path) -> list[str]:
    """Remove the groups under ``parent`` that a bagpipe benchmark made and left when it was
    killed: named ``bagpipe-<what>-<pid>`` after an owner that is gone, with no process left
    inside. Returns the names removed (a group that still holds a process is left alone)."""
    removed: list[str] = []
    try:
        children = sorted(parent.iterdir())
    except OSError:
        return removed
    for child in children:
        m = _OWNED.match(child.name)
        if m is None or not child.is_dir() or _alive(int(m.group(1))):
            continue
        try:
            if (child / "cgroup.procs").read_text().strip():
                continue
            child.rmdir()
        except OSError:
            continue
        removed.append(child.name)
    return removed


class MemoryGroup:
    """One child memory group with a limit of ``limit_bytes`` (page cache included; 0:
    no limit of its own, a group only to measure what its processes use).

    Use as a context manager; put a child process in it with ``preexec_fn=group.enter``.
    """

    def __init__(self, controller: Controller, limit_bytes: int, name: str):
        self.controller = controller
        self.limit_bytes = int(limit_bytes)
        self.path = controller.parent / f"{name}-{os.getpid()}"
        self.removed_stale = remove_stale_groups(controller.parent)  # of benchmarks killed before they could
        self.path.mkdir()
        try:
            limit = self.limit_bytes if self.limit_bytes > 0 else ("-1" if controller.version == 1 else "max")
            if controller.version == 1:
                self._write("memory.limit_in_bytes", limit)
                self._write("memory.swappiness", 0)  # no swap here; never trade the limit for swap
            else:
                self._write("memory.max", limit)
                self._write("memory.swap.max", 0)
        except OSError:
            self.remove()
            raise
        self._procs = str(self.path / "cgroup.procs")

    def _write(self, name: str, value) -> None:
        try:
            (self.path / name).write_text(str(value))
        except FileNotFoundError:  # an optional knob (swappiness, swap.max) this kernel lacks
            if name in ("memory.swappiness", "memory.swap.max"):
                return
            raise

    def _read(self, name: str) -> str:
        try:
            return (self.path / name).read_text()
        except OSError:
            return ""

    def enter(self) -> None:
        """Move the calling process into the group (a child's ``preexec_fn``: before exec)."""
        with open(self._procs, "w") as f:
            f.write(str(os.getpid()))

    def peak_bytes(self) -> int | None:
        """The group's peak memory (page cache included) since it was made; None if unknown."""
        raw = self._read("memory.max_usage_in_bytes" if self.controller.version == 1 else "memory.peak").strip()
        return int(raw) if raw.isdigit() else None

    def stat(self) -> dict[str, int]:
        """memory.stat as numbers."""
        return Group(self.controller.version, self.path).stat()

    def figures(self) -> dict[str, float]:
        """MiB now: usage, anon, file, dirty, writeback, mapped (:meth:`Group.figures`)."""
        return Group(self.controller.version, self.path).figures()

    def sample(self, interval_s: float = 1.0) -> GroupSampler:
        """Start sampling :meth:`figures` every ``interval_s`` seconds (``stop()`` it)."""
        return GroupSampler(self, interval_s)

    def oom_kills(self) -> int:
        """Processes the kernel killed for going over the limit."""
        name = "memory.oom_control" if self.controller.version == 1 else "memory.events"
        for line in self._read(name).splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill" and v.strip().isdigit():
                return int(v)
        return 0

    def limit_hits(self) -> int:
        """How often usage reached the limit (v1 failcnt; v2 the ``max`` events)."""
        if self.controller.version == 1:
            raw = self._read("memory.failcnt").strip()
            return int(raw) if raw.isdigit() else 0
        for line in self._read("memory.events").splitlines():
            k, _, v = line.partition(" ")
            if k == "max" and v.strip().isdigit():
                return int(v)
        return 0

    def report(self) -> dict:
        """What a benchmark records about the group after its process ended."""
        st = self.stat()
        return {
            "cgroup_version": self.controller.version,
            "limit_mb": self.limit_bytes / 2**20 if self.limit_bytes > 0 else None,
            "peak_mb": (self.peak_bytes() or 0) / 2**20,
            "limit_hits": self.limit_hits(),
            "oom_kills": self.oom_kills(),
            "major_faults": st.get("pgmajfault", st.get("total_pgmajfault", 0)),
        }

    def remove(self) -> None:
        """Remove the group (its processes have ended; page cache it holds moves to the parent)."""
        if self.controller.version == 1:
            try:
                (self.path / "memory.force_empty").write_text("0")
            except OSError:
                pass
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # a dying process still listed for a moment
                time.sleep(0.1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class GroupSampler:
    """A thread recording a group's figures over time: ``series`` is a list of
    ``{"t": seconds since the start, "usage": MiB, "anon": ..., "file", "dirty",
    "writeback", "mapped"}`` (:meth:`MemoryGroup.figures`), one per ``interval_s``."""

    def __init__(self, group: MemoryGroup, interval_s: float = 1.0):
        self.group = group
        self.interval = interval_s
        self.series: list[dict[str, float]] = []
        self._t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bagpipe-group-sampler")
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.series.append({"t": round(time.monotonic() - self._t0, 2)} | self.group.figures())
            if self._stop.wait(self.interval):
                return

    def stop(self) -> list[dict[str, float]]:
        """Stop sampling; the series."""
        self._stop.set()
        self._thread.join(timeout=5)
        return self.series

    def maxima(self) -> dict[str, float]:
        """The largest value of each figure over the series."""
        keys = [k for k in (self.series[0] if self.series else {}) if k != "t"]
        return {k: max(s[k] for s in self.series) for k in keys}
