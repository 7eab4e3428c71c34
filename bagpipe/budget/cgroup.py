"""The memory control group this process runs in: its limit and its figures.

Where users run bagpipe (a Kubernetes pod, a Slurm job, a container) the memory it may
use is the limit of a memory cgroup, and that limit counts the process's anonymous
memory **and** the page cache it brings in (dirty pages included). This module finds
that group through ``/proc/self/cgroup`` and reads it:

* cgroup v2 (a ``0::/path`` line): the group's ``memory.max``, and every ancestor's
  (the smallest applies);
* cgroup v1 (a line naming the ``memory`` controller): ``hierarchical_memory_limit``
  of the group's ``memory.stat`` (the smallest ``memory.limit_in_bytes`` on the path),
  else its own ``memory.limit_in_bytes``.

A limit of "max" (v2) or of the v1 sentinel near 2^63 is no limit. Nothing here writes
to the hierarchy (benchmarks that make groups use :mod:`bagpipe.testbed.memlimit`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
#: A limit at or above this is "no limit" (v1 reports 2^63 - 4096 rounded to pages).
NO_LIMIT = 1 << 60


@dataclass(frozen=True)
class Group:
    """A memory cgroup: its version and its directory."""

    version: int
    path: Path

    def read(self, name: str) -> str | None:
        try:
            return (self.path / name).read_text()
        except OSError:
            return None

    def limit_bytes(self) -> int | None:
        """The memory limit that applies to the group (its own or an ancestor's), None if none."""
        if self.version == 1:
            stat = self.stat()
            raw = stat.get("hierarchical_memory_limit")
            if raw is None:
                text = (self.read("memory.limit_in_bytes") or "").strip()
                raw = int(text) if text.isdigit() else None
            return raw if raw is not None and raw < NO_LIMIT else None
        limits = []
        p = self.path
        while True:
            text = ((p / "memory.max").read_text() if (p / "memory.max").exists() else "max").strip()
            if text.isdigit() and int(text) < NO_LIMIT:
                limits.append(int(text))
            if p == ROOT or p.parent == p:
                break
            p = p.parent
        return min(limits) if limits else None

    def stat(self) -> dict[str, int]:
        """``memory.stat`` as numbers."""
        out = {}
        for line in (self.read("memory.stat") or "").splitlines():
            k, _, v = line.partition(" ")
            if v.strip().isdigit():
                out[k] = int(v)
        return out

    def usage_bytes(self) -> int | None:
        """The group's memory now (page cache included)."""
        text = (self.read("memory.usage_in_bytes" if self.version == 1 else "memory.current") or "").strip()
        return int(text) if text.isdigit() else None

    def oom_kills(self) -> int | None:
        """Processes of the group the kernel's OOM killer has killed (v1 ``memory.oom_control``,
        v2 ``memory.events``: ``oom_kill``); None where the kernel does not say."""
        for line in (self.read("memory.oom_control" if self.version == 1 else "memory.events") or "").splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill" and v.strip().isdigit():
                return int(v)
        return None

    def peak_bytes(self) -> int | None:
        """The group's peak memory so far (v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``)."""
        text = (self.read("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak") or "").strip()
        return int(text) if text.isdigit() else None

    def figures(self) -> dict[str, float]:
        """MiB now: ``usage``, ``anon`` (the processes' own memory), ``file`` (page cache),
        ``dirty``, ``writeback`` and ``mapped`` (file pages mapped into a process), both
        versions' names mapped onto these."""
        st = self.stat()
        if self.version == 1:
            names = {"anon": "total_rss", "file": "total_cache", "dirty": "total_dirty"}
            names |= {"writeback": "total_writeback", "mapped": "total_mapped_file"}
        else:
            names = {"anon": "anon", "file": "file", "dirty": "file_dirty"}
            names |= {"writeback": "file_writeback", "mapped": "file_mapped"}
        out = {k: st.get(v, st.get(v.removeprefix("total_"), 0)) / 2**20 for k, v in names.items()}
        return {"usage": (self.usage_bytes() or 0) / 2**20} | out


def own_group(proc_cgroup: str | None = None, root: Path = ROOT) -> Group | None:
    """The memory cgroup this process is in (``proc_cgroup``: the text of /proc/self/cgroup,
    read when None), or None where there is none (no cgroup file system, no memory controller)."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    v2 = None
    for line in proc_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):
            p = root / "memory" / path.lstrip("/")
            if (p / "memory.limit_in_bytes").exists():
                return Group(1, p)
        elif hid == "0" and controllers == "":
            v2 = root / path.lstrip("/")
    if v2 is not None and ((v2 / "memory.max").exists() or (v2 == root and _offers_memory(root))):
        return Group(2, v2)
    return None


def _offers_memory(root: Path) -> bool:
    try:
        return "memory" in (root / "cgroup.controllers").read_text().split()
    except OSError:
        return False


def own_limit() -> tuple[int | None, str]:
    """The memory limit of this process's cgroup in bytes (None: none) and where it was found."""
    g = own_group()
    if g is None:
        return None, "no memory cgroup"
    limit = g.limit_bytes()
    where = f"cgroup v{g.version} {g.path}"
    return limit, (where if limit is not None else f"{where} has no limit")


def machine_memory() -> tuple[int | None, str]:
    """This machine's memory in bytes (``MemTotal`` of /proc/meminfo, else the physical
    pages ``os.sysconf`` counts; None where neither says) and where it was read: what a
    run with no budget is held to (:meth:`bagpipe.budget.sizing.Budget.of`). Tests replace it."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            k, _, v = line.partition(":")
            if k == "MemTotal" and v.split() and v.split()[0].isdigit():
                return int(v.split()[0]) * 1024, "MemTotal of /proc/meminfo"
    except OSError:
        pass
    try:
        import os

        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "os.sysconf's physical pages"
    except (AttributeError, ValueError, OSError):
        return None, "unknown"
