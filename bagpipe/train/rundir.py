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
computed here too (:func:`digest_of`): a function of the parameters alone, which reads
only the rows written since initialisation. A figure that is not finite (the AUC of an
eval split of one class) is written as ``null`` in every JSON file: :mod:`bagpipe.jsonout`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from bagpipe.errors import ConfigError
from bagpipe.files import FULL_ERRNOS, RunLock, atomic_write_text, refuse_unnamable, through_link, written_directly
from bagpipe.jsonout import json_text
from bagpipe.store.init import RowValues

__all__ = ["LOCK_HELD_ENV", "MetricsLog", "RunDir", "RunLock", "dense_copy", "dense_digest", "digest_of", "every_row"]

#: Set by the local launcher in its roles' environment: the launcher holds the run's lock.
LOCK_HELD_ENV = "BAGPIPE_RUN_LOCK_HELD"

Rows = Iterator[tuple[int, np.ndarray, np.ndarray]]
IdRows = Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]

log = logging.getLogger(__name__)


class MetricsLog:
    """Appends one JSON object per line to RUN/metrics.jsonl.

    The file is touched only at the first record: then the records of steps after
    ``since`` are dropped (a run resumed at ``since`` replays those steps; a fresh one,
    ``since`` 0, starts empty), and so is a line that is not a record (a write cut short
    by a crash or a full disk, NUL bytes), said in one line naming ``metrics.jsonl:N``
    (:func:`kept_records`); the file is rewritten atomically. A run refused before its
    first step changes nothing.

    Each record is written whole or not at all (a write the disk cuts short is truncated
    away), straight to the file. A record that meets a full disk (ENOSPC, EDQUOT) is left
    out and the run goes on -- the checkpoints, not the metrics, are what ``--resume``
    needs: the first one is said in one line, and at :meth:`close` how many were left out
    when more were. Any other write error stops the run, naming the file.
    """

    def __init__(self, path: Path, since: int = 0):
        self.path, self.since = path, since
        self.fd: int | None = None
        self.size = 0  # bytes of whole records in the file
        self.left_out: list[int] = []  # the steps of the records the disk could not take

    def _open(self) -> tuple[int, int]:
        if self.path.exists():
            raw = self.path.read_bytes()
            kept = kept_records(self.path, raw, self.since)
            text = "".join(line + "\n" for line in kept)
            if text.encode() != raw:
                atomic_write_text(self.path, text)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return fd, os.fstat(fd).st_size

    def write(self, **record) -> None:
        data = (json_text(record) + "\n").encode()
        try:
            if self.fd is None:
                self.fd, self.size = self._open()
            self._append(self.fd, data)
        except OSError as e:
            if e.errno not in FULL_ERRNOS:
                if e.filename is None:  # a write() names no file: the command line's line names it
                    e.filename = str(self.path)
                raise
            self._leave_out(record.get("step"), e)

    def _append(self, fd: int, data: bytes) -> None:
        done = 0
        try:
            while done < len(data):
                done += os.write(fd, data[done:])
        except OSError:
            if done:  # the part written is removed: the file holds whole records only
                os.ftruncate(fd, self.size)
            raise
        self.size += len(data)

    def _leave_out(self, step: object, e: OSError) -> None:
        self.left_out.append(step if isinstance(step, int) else -1)
        if len(self.left_out) == 1:
            log.warning(
                f"{self.path}: the record of step {step} was not written ({e.strerror or e}); the run goes on, "
                "leaving out each record the disk cannot take (--resume needs the checkpoints, not the metrics)"
            )

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        n = len(self.left_out)
        if n > 1:
            log.warning(
                f"{self.path}: {n} records (steps {self.left_out[0]}..{self.left_out[-1]}) were not written "
                "for lack of space"
            )


#: The lines of metrics.jsonl named in the warning about unreadable ones; the rest are counted.
NAMED_LINES = 5


def kept_records(path: Path, raw: bytes, since: int) -> list[str]:
    """The lines of metrics.jsonl (``raw``) a run resumed at ``since`` keeps: the records of
    steps up to ``since`` (none for a fresh run, ``since`` 0). A line that is not a record
    -- cut short, NUL bytes, not JSON, not an object, a step that is not a number -- is
    dropped and said in one line naming ``path:N`` (the records after it are kept)."""
    if not since:
        return []
    kept, bad = [], []
    for n, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        why, record = unreadable(line)
        if why is not None:
            bad.append((n, why))
        elif record.get("step", 0) <= since:
            kept.append(line.decode())
    if bad:
        (first, why), more = bad[0], [n for n, _ in bad[1:]]
        also = ", ".join(map(str, more[:NAMED_LINES]))
        also += f" and {len(more) - NAMED_LINES} more" if len(more) > NAMED_LINES else ""
        log.warning(
            f"{path}:{first}: dropped an unreadable line ({why})"
            + (f"; also line{'s' if len(more) > 1 else ''} {also}" if more else "")
            + f"; the readable records up to step {since} are kept"
        )
    return kept


JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "true/false", type(None): "null"}


def unreadable(line: bytes) -> tuple[str | None, dict]:
    """(why ``line`` is not a metrics record, or None; the record)."""
    if b"\0" in line:
        return "NUL bytes: a write lost in a crash", {}
    try:
        text = line.decode()
        record = json.loads(text)
    except UnicodeDecodeError:
        return "not text", {}
    except json.JSONDecodeError as e:
        cut = e.pos >= len(text.rstrip())
        return ("cut short: a write that did not finish" if cut else "not JSON"), {}
    if not isinstance(record, dict):
        kind = JSON_KINDS.get(type(record), type(record).__name__)
        return f"a JSON {kind}, not an object", {}
    step = record.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, (int, float)):
        return "its step is not a number", {}
    return None, record


class RunDir:
    """The files of one run under ``path``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.created = False  # whether this process made the folder (it removes it if start-up fails)
        self._lock: RunLock | None = None
        self._started = True  # claim() makes it False until the first step is done
        self._pending_config: tuple | None = None

    @contextmanager
    def claim(self, *, lock: bool = True):
        """Create the folder if needed and hold its lock for the ``with`` block.

        If the block fails before :meth:`started` was called (by the first step's
        :meth:`heartbeat`) and this process created the folder, the folder is removed:
        a run that fails at start-up -- a refusal, a cache too small for the first
        batch, a missing optional package -- leaves nothing half-made behind.
        ``lock=False`` when another process (the launcher) holds it.
        """
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"--out {self.path}: exists and is not a directory")
        # a dangling symbolic link: the folder it names is made, as `mkdir -p` through it would
        # (mkdir on the link itself said "File exists"; newcomer round 18); the link stays
        refuse_unnamable(self.path, "--out")  # a loop of links names no folder to make
        real = through_link(self.path)
        made = [q for q in (real.parent, *real.parent.parents) if not q.exists()]  # deepest first
        try:
            self.created = not self.path.exists()
            real.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--out {self.path}: cannot create the run directory ({e.strerror})") from None
        self._started = False
        try:
            if lock and os.environ.get(LOCK_HELD_ENV) != str(self.path.resolve()):
                held = RunLock(self.path / ".lock")
                try:
                    held.acquire()
                except OSError as e:  # a full disk: said naming the file (the lock's write names none)
                    raise OSError(e.errno, e.strerror, str(held.path)) from None
                self._lock = held
            yield self
        except BaseException:
            if self.created and not self._started:
                self._release()
                shutil.rmtree(real, ignore_errors=True)  # a link's target it made: the link stays
                for q in made:  # and the folders above it that it made (round 23: left empty)
                    try:
                        q.rmdir()
                    except OSError:
                        break
            raise
        finally:
            self._release()

    def started(self) -> None:
        """Start-up is over: from here on a failure keeps the folder (metrics,
        checkpoints). Writes the config that :meth:`write_config_later` holds back."""
        if self._pending_config is not None:
            self.write_config(*self._pending_config)
            self._pending_config = None
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

    def write_config(self, train: dict, model, dataset: dict, not_exact: list[str] | None = None) -> None:
        """RUN/config.json: ``{"train": settings by section, "model": the architecture,
        "dataset": {"dir", "fingerprint", "table_sizes", "num_dense"}, "not_exact": why the
        run is not exact, its earlier runs' reasons included (the summary's field)}``."""
        self.create()
        conf = {"train": train, "model": dataclasses.asdict(model), "dataset": dataset, "not_exact": not_exact or []}
        atomic_write_text(self.config_file, json_text(conf, indent=2))

    def write_config_later(self, train: dict, model, dataset: dict, not_exact: list[str] | None = None) -> None:
        """The config to write once start-up is over (:meth:`started`): a run refused
        before its first step leaves the folder's config.json as it was."""
        self._pending_config = (train, model, dataset, not_exact)

    def read_config(self) -> dict:
        from bagpipe.data.schema import read_json

        return read_json(self.config_file)

    def metrics(self, since: int = 0) -> MetricsLog:
        """The metrics log, keeping only the records of steps <= ``since`` from before
        (a run resumed at ``since`` replays the steps after it; a fresh one starts empty)."""
        return MetricsLog(self.metrics_file, since)

    @property
    def heartbeat_file(self) -> Path:
        return self.path / ".step"

    def heartbeat(self, step: int) -> None:
        """Record the steps done so far (8 bytes rewritten in place; the launcher reads
        it to say at which step a role died). The first step done ends start-up."""
        if not self._started:
            self.started()
        try:
            if getattr(self, "_beat", None) is None:
                self._beat = os.open(self.heartbeat_file, os.O_WRONLY | os.O_CREAT, 0o644)
            os.pwrite(self._beat, int(step).to_bytes(8, "little"), 0)
        except OSError as e:  # a full disk at its first write: said naming the file
            raise OSError(e.errno, e.strerror, str(self.heartbeat_file)) from None

    def last_heartbeat(self) -> int | None:
        try:
            return int.from_bytes(self.heartbeat_file.read_bytes()[:8], "little")
        except (OSError, ValueError):
            return None

    def write_summary(self, summary: dict, also: str | None = None) -> None:
        """RUN/summary.json, and ``also`` (--summary-json) if given."""
        atomic_write_text(self.summary_file, json_text(summary, indent=2))
        if also:
            self.copy_summary(summary, also)

    def copy_summary(self, summary: dict, also: str) -> None:
        """The summary at ``also`` (--summary-json): a file, or a device (/dev/stdout)."""
        text = json_text(summary, indent=2)
        target = Path(also)
        direct = written_directly(target, "w")  # a device, /dev/stdout: the writers' one rule
        if direct is not None:
            with direct as f:
                f.write(text + "\n")
            return
        through_link(target).parent.mkdir(parents=True, exist_ok=True)  # a link's target is written
        atomic_write_text(target, text)


def dense_digest(model: torch.nn.Module):
    """A sha256 started over every dense parameter (by name); feed it the rows with :func:`hash_rows`."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h


def changed(init: RowValues, rows: np.ndarray, weights: np.ndarray, state: np.ndarray) -> np.ndarray:
    """(n,) bool: which of global ``rows`` differ, bit for bit, from their initial value
    (the initialiser's weights and zero optimizer state)."""
    differ = np.zeros(len(rows), dtype=bool)
    if state.shape[1]:  # a row whose optimizer state moved differs: its initial value need not be computed
        differ = (np.ascontiguousarray(state, dtype=np.float32).view(np.int32) != 0).any(axis=1)
    same = np.flatnonzero(~differ)
    if len(same):
        w = np.ascontiguousarray(np.asarray(weights)[same], dtype=np.float32).view(np.int32)
        differ[same] = (w != init.rows(np.asarray(rows)[same]).view(np.int32)).any(axis=1)
    return differ


def hash_rows(h, init: RowValues, rows: IdRows) -> None:
    """Add to digest ``h`` every row of ``rows`` (ascending global rows, in chunks) that
    differs from its initial value, as its row number (int64), D weights and S state
    values, row after row: the bytes do not depend on how the rows are chunked, and a row
    equal to its initial value -- written or not -- adds nothing."""
    for ids, w, s in rows:
        keep = changed(init, ids, w, s)
        if not keep.any():
            continue
        ids = np.asarray(ids, dtype=np.int64)[keep]
        w = np.ascontiguousarray(np.asarray(w, dtype=np.float32)[keep])
        s = np.ascontiguousarray(np.asarray(s, dtype=np.float32)[keep])
        record = np.concatenate([ids.view(np.uint8).reshape(len(ids), 8), w.view(np.uint8), s.view(np.uint8)], axis=1)
        h.update(record.tobytes())


def digest_of(model: torch.nn.Module, init: RowValues, state_dim: int, rows: IdRows) -> str:
    """params_sha256: a function of the parameters alone, equal for equal parameters in
    every mode and topology. It covers every dense parameter (by name), the initial
    tables' identity (seed, table sizes, D, S), then every embedding row whose weights or
    optimizer state differ from their initial values (:func:`hash_rows`). ``rows`` needs
    to hold only the rows written since initialisation (any others are equal to their
    initial value and add nothing), so the digest costs what was trained, not the tables."""
    h = dense_digest(model)
    identity = {"seed": init.seed, "table_sizes": list(init.table_sizes), "dim": init.dim, "state_dim": int(state_dim)}
    h.update(json.dumps(identity, sort_keys=True, allow_nan=False).encode())
    hash_rows(h, init, rows)
    return h.hexdigest()


def every_row(rows: Rows) -> IdRows:
    """Every row of (start, weights, state) chunks with its row numbers: what the digest of
    a backend's :meth:`export` (the plain reference of its ``touched``) is computed from."""
    for a, w, s in rows:
        yield np.arange(a, a + len(w), dtype=np.int64), w, s


def dense_copy(**state) -> dict:
    """A copy of a checkpoint's dense state (model and optimizer state_dicts hold the live
    tensors) that training may go on changing while it is written."""
    return copy.deepcopy(state)
