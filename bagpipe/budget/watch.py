"""What a run's memory did over its steps: the process's anonymous memory and its memory
cgroup's figures, recorded every few steps (the summary's ``memory.by_step``), so a run
shows whether its memory stays flat however long it runs."""

from __future__ import annotations

import threading

from bagpipe.budget.cgroup import own_group

#: Points kept at most; past it every other point is dropped and the stride doubles.
MAX_POINTS = 128


def anon_mb() -> float:
    """This process's anonymous resident memory now (RssAnon), MiB."""
    return rss_breakdown_mb()["anon"]


def rss_breakdown_mb() -> dict:
    """Current anonymous (private heap) and file-backed resident memory, from /proc (Linux)."""
    out = {"anon": 0.0, "file": 0.0}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    out["anon"] = int(line.split()[1]) / 1024.0
                elif line.startswith("RssFile:"):
                    out["file"] = int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return out


class RssSampler:
    """Samples anonymous RSS in a background thread and keeps its peak (MiB).

    ``peak_rss_mb`` (ru_maxrss) also counts file pages a memory map touched, which the
    kernel can drop at will; the anonymous peak is the memory the process owns.
    """

    def __init__(self, interval_s: float = 0.05):
        self.peak_anon_mb = rss_breakdown_mb()["anon"]
        self._stop = threading.Event()
        self._interval = interval_s
        self._t = threading.Thread(target=self._run, daemon=True, name="bagpipe-rss")
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak_anon_mb = max(self.peak_anon_mb, rss_breakdown_mb()["anon"])

    def stop(self) -> float:
        self._stop.set()
        self._t.join(timeout=1)
        self.peak_anon_mb = max(self.peak_anon_mb, rss_breakdown_mb()["anon"])
        return self.peak_anon_mb


class MemoryWatch:
    """Records ``[step, anon, usage, file, dirty, writeback]`` MiB (the last four of this
    process's memory cgroup, None without one) at the steps :meth:`mark` is called, and
    samples the anonymous memory every 50 ms in the background (:meth:`peak`) until
    :meth:`stop`: training, evaluation and the digest."""

    KEYS = ("step", "anon_mb", "group_mb", "group_file_mb", "group_dirty_mb", "group_writeback_mb")

    def __init__(self) -> None:
        self._rss = RssSampler()
        self.group = own_group()
        self.points: list[list[float | None]] = []
        self.stride = 1
        self._calls = 0
        self.maxima: dict[str, float] = {}

    def mark(self, step: int) -> None:
        g = self.group.figures() if self.group is not None else None
        if g is not None:  # the largest of every sample, kept even when the point is thinned out
            for k in ("usage", "anon", "file", "dirty", "writeback", "mapped"):
                self.maxima[k] = max(self.maxima.get(k, 0.0), g[k])
        self._calls += 1
        if (self._calls - 1) % self.stride:
            return
        point: list[float | None] = [step, round(anon_mb(), 1)]
        point += [round(g[k], 1) for k in ("usage", "file", "dirty", "writeback")] if g else [None] * 4
        self.points.append(point)
        if len(self.points) >= MAX_POINTS:
            self.points = self.points[::2]
            self.stride *= 2

    def peak(self) -> float:
        """The peak anonymous MiB sampled so far."""
        return max(self._rss.peak_anon_mb, anon_mb())

    def stop(self) -> float:
        """Stop sampling; the peak anonymous MiB."""
        return self._rss.stop()

    def at(self, step: int) -> float | None:
        """The anonymous MiB recorded at the point nearest ``step``."""
        if not self.points:
            return None
        return min(self.points, key=lambda p: abs((p[0] or 0) - step))[1]
