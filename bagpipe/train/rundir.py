"""The run directory: the one place that writes a run's files.

Layout of ``RUN/``::

    config.json     the run's settings (by section) and model architecture; what
                    `bagpipe eval` rebuilds the model from
    metrics.jsonl   one JSON object per line: {"step", "loss", "samples_per_s", "lr",
                    "embedding_lr"} every few steps (the rates of the step just done),
                    {"step", "eval_logloss", "eval_auc", "eval_ne", "eval_calibration",
                    "eval_accuracy", "eval_samples"} at each evaluation
    summary.json    the finished run (:class:`bagpipe.train.summary.Summary`)
    checkpoints/    :mod:`bagpipe.checkpoint`
    .lock           who holds the run (pid, host, start time); see :class:`RunLock`

Every topology writes these through :class:`RunDir` (in a distributed run, trainer 0
does), so their schema is the same everywhere. The digest (``params_sha256``) is
computed here too: one sha256 over every dense parameter by name, then every embedding
row's weights and optimizer state in global row order.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from bagpipe.errors import ConfigError
from bagpipe.files import atomic_write_text

#: Set by the local launcher in its roles' environment: the launcher holds the run's lock.
LOCK_HELD_ENV = "BAGPIPE_RUN_LOCK_HELD"

Rows = Iterator[tuple[int, np.ndarray, np.ndarray]]


class MetricsLog:
    """Appends one JSON object per line to RUN/metrics.jsonl (flushed per record)."""

    def __init__(self, path: Path):
        self.f = open(path, "a")

    def write(self, **record) -> None:
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


class RunLock:
    """One run per run folder: an exclusive ``flock`` on RUN/.lock for the life of the run.

    The kernel drops a ``flock`` when its holder dies however it dies (even SIGKILL), so
    a lock left by a dead process never blocks the next run; the file keeps the last
    holder's pid, host and start time, which a refused run names.
    """

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise ConfigError(
                f"{self.path.parent} is in use by another run ({holder}); wait for it to end or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv[:3]),
        }
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (ValueError, KeyError, OSError):
        return "holder unknown"


class RunDir:
    """The files of one run under ``path``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.created = False  # whether this process made the folder (it removes it if start-up fails)
        self._lock: RunLock | None = None

    @contextmanager
    def claim(self, *, lock: bool = True):
        """Create the folder if needed and hold its lock for the ``with`` block.

        If the block fails before :meth:`started` was called and this process created
        the folder, the folder is removed: a run that fails at start-up leaves nothing
        half-made behind. ``lock=False`` when another process (the launcher) holds it.
        """
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"--out {self.path}: exists and is not a directory")
        try:
            self.created = not self.path.exists()
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--out {self.path}: cannot create the run directory ({e.strerror})") from None
        self._started = False
        try:
            if lock and os.environ.get(LOCK_HELD_ENV) != str(self.path.resolve()):
                self._lock = RunLock(self.path / ".lock")
                self._lock.acquire()
            yield self
        except BaseException:
            if self.created and not self._started:
                self._release()
                shutil.rmtree(self.path, ignore_errors=True)
            raise
        finally:
            self._release()

    def started(self) -> None:
        """Start-up is over: from here on a failure keeps the folder (metrics, checkpoints)."""
        self._started = True

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def config_file(self) -> Path:
        return self.path / "config.json"

    @property
    def summary_file(self) -> Path:
        return self.path / "summary.json"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    def write_config(self, train: dict, model, dataset: dict) -> None:
        """RUN/config.json: ``{"train": settings by section, "model": the architecture,
        "dataset": {"dir", "fingerprint", "table_sizes", "num_dense"}}``."""
        self.create()
        text = json.dumps({"train": train, "model": dataclasses.asdict(model), "dataset": dataset}, indent=2)
        atomic_write_text(self.config_file, text)

    def read_config(self) -> dict:
        from bagpipe.data.schema import read_json

        return read_json(self.config_file)

    def metrics(self, since: int = 0) -> MetricsLog:
        """The metrics log, keeping only the records of steps <= ``since`` from before
        (a run resumed at ``since`` replays the steps after it; a fresh one starts empty)."""
        self.create()
        if self.metrics_file.exists():
            kept = [
                line
                for line in self.metrics_file.read_text().splitlines()
                if line.strip() and since and json.loads(line).get("step", 0) <= since
            ]
            atomic_write_text(self.metrics_file, "".join(line + "\n" for line in kept))
        return MetricsLog(self.metrics_file)

    @property
    def heartbeat_file(self) -> Path:
        return self.path / ".step"

    def heartbeat(self, step: int) -> None:
        """Record the steps done so far (8 bytes rewritten in place; the launcher reads
        it to say at which step a role died)."""
        if getattr(self, "_beat", None) is None:
            self._beat = os.open(self.heartbeat_file, os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(self._beat, int(step).to_bytes(8, "little"), 0)

    def last_heartbeat(self) -> int | None:
        try:
            return int.from_bytes(self.heartbeat_file.read_bytes()[:8], "little")
        except (OSError, ValueError):
            return None

    def write_summary(self, summary: dict, also: str | None = None) -> None:
        """RUN/summary.json, and ``also`` (--summary-json) if given."""
        text = json.dumps(summary, indent=2)
        atomic_write_text(self.summary_file, text)
        if also:
            Path(also).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(also, text)


def dense_digest(model: torch.nn.Module):
    """A sha256 started over every dense parameter (by name); feed it the rows with :func:`hashed`."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h


def hashed(rows: Rows, h) -> Rows:
    """Pass (start, weights, state) chunks through while adding them to digest ``h``: each
    row's D weights then its S state values, row after row, so the digest does not depend
    on how the rows are chunked (a store's chunks follow its memory budget)."""
    for a, w, s in rows:
        row = np.concatenate([np.asarray(w, dtype=np.float32), np.asarray(s, dtype=np.float32)], axis=1)  # (n, D + S)
        h.update(row.data.cast("B"))
        yield a, w, s


def digest_of(model: torch.nn.Module, rows: Rows) -> str:
    """params_sha256: every dense parameter, then every row's weights and state in
    global row order, row by row (``rows``: (start, weights, state) chunks of any size)."""
    h = dense_digest(model)
    for _ in hashed(rows, h):
        pass
    return h.hexdigest()
