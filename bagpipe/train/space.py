"""Before training: will the run's checkpoints, and its disk store, fit on their disks?

A run that will checkpoint (``--checkpoint-every`` or the final checkpoint) estimates the
largest checkpoint it can write and refuses to start, in one line, when the disk that
holds the run folder cannot hold it -- rather than failing after its training is done.

Checkpoints hold the rows written since initialisation (:mod:`bagpipe.checkpoint.format`),
so the largest one holds at most the rows of the checkpoint it resumes from plus, for
every step still to train, the unique rows of a batch -- the most of the first few
batches, with a margin of :data:`MARGIN` for batches that reach further -- and never
more than the tables: rows x (8-byte id + 4 (D + S) bytes), plus the dense state (the
parameters and up to two optimizer values each: Adam's moments).

A disk store (``--store disk``) is sparse: it takes blocks only for the rows written. A run
writes at most its batches' lookups (every step's, a restored checkpoint's rows among
them), each into at most the pages its row spans, never more than the whole table file;
plus a page of present.u8 per row written, never more than the whole file. A store that
does not fit is refused before it is created (:func:`check_store_space`); one that fills
its disk later anyway (another writer) stops the run with one line
(:class:`~bagpipe.store.disk.StoreFullError`), never a bus error.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bagpipe.budget.estimate import RunShape
from bagpipe.checkpoint import CheckpointFolder
from bagpipe.config.train import TrainConfig
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import train_stream
from bagpipe.errors import ConfigError

PROBE_BATCHES = 3  # batches whose unique rows are counted
MARGIN = 1.25
ID_BYTES = 8


@dataclass(frozen=True)
class CheckpointEstimate:
    """The largest checkpoint a run can write."""

    rows: int
    """Rows it holds at most."""
    row_bytes: int
    """Bytes a stored row takes (its id and its D + S values)."""
    dense_bytes: int
    """Bytes of the dense state, at most."""

    @property
    def bytes(self) -> int:
        return self.rows * self.row_bytes + self.dense_bytes


def estimate(
    cfg: TrainConfig, dataset: Dataset, dense_params: int, state_dim: int, resumed_rows: int = 0
) -> CheckpointEstimate:
    """The largest checkpoint of ``cfg``'s run (``dense_params``: the model's parameter count;
    ``resumed_rows``: rows the checkpoint it resumes from holds, at most)."""
    stream = train_stream(dataset, cfg.data, cfg.run.seed)
    start = 0
    ckpt = CheckpointFolder(cfg.run.out).latest_name() if cfg.run.resume else None
    if ckpt is not None:
        from bagpipe.checkpoint import Manifest

        start = Manifest.load(Path(cfg.run.out) / "checkpoints" / ckpt).step
    steps = max(0, cfg.run.steps - start)
    probe = range(start, start + min(PROBE_BATCHES, steps))
    per_batch = max((len(np.unique(stream.batch(i).rows.numpy())) for i in probe), default=0)
    rows = min(dataset.meta.total_rows, resumed_rows + int(np.ceil(steps * per_batch * MARGIN)))
    dim = cfg.arch.model_config().embedding_dim
    return CheckpointEstimate(rows=rows, row_bytes=ID_BYTES + 4 * (dim + state_dim), dense_bytes=dense_params * 4 * 3)


def size(n: int) -> str:
    """Bytes for a person: 712 KiB, 3.4 MiB, 1.25 GiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n / 2**10:,.0f} KiB"


def free_bytes(path: Path) -> tuple[Path, int]:
    """(the nearest existing folder of ``path``, the bytes free on its disk)."""
    where = Path(path).absolute()
    while not where.exists():
        where = where.parent
    return where, shutil.disk_usage(where).free


def check_checkpoint_space(cfg: TrainConfig, dataset: Dataset, shape: RunShape) -> CheckpointEstimate | None:
    """Refuse (ConfigError, one line) a run whose largest checkpoint does not fit on the
    disk of its run folder; None when the run writes no checkpoint. ``shape``: the run's,
    as :func:`bagpipe.train.preflight.preflight` measured it (its dense parameters and
    the rows' optimizer values)."""
    rc = cfg.run
    if not (rc.final_checkpoint or rc.checkpoint_every):
        return None
    resumed = 0
    if rc.resume:
        latest = CheckpointFolder(rc.out).latest()
        if latest is not None:
            resumed = sum(man.rows if man.version >= 3 else man.num_rows for _, man in latest.reader().chain)
    est = estimate(cfg, dataset, shape.dense_params, shape.state_dim, resumed)
    where, free = free_bytes(Path(rc.out) / "checkpoints")
    if est.bytes > free:
        raise ConfigError(
            f"{rc.out}: this run's checkpoints need up to {size(est.bytes)} ({est.rows:,} rows trained "
            f"at most x {est.row_bytes} bytes, and the dense state) but {where} has {size(free)} free; "
            "free some space, choose another --out, or checkpoint less (--checkpoint-every 0 --no-final-checkpoint)"
        )
    return est


def store_bytes(num_rows: int, row_bytes: int, lookups: int, packed: int = 0) -> int:
    """The most bytes of blocks a disk store of ``num_rows`` rows of ``row_bytes`` takes after
    ``lookups`` row writes: the pages they span in rows.f32 (num_rows + ``packed`` slots: a
    frequency layout's packed rows, and its row log's slots, a row each), a page of
    present.u8 each (each never more than its whole file, page-rounded), the row log's
    index and the header."""
    from bagpipe.store.diskio import PAGE

    def pages(n: int) -> int:
        return -(-n // PAGE) * PAGE

    from bagpipe.store.rowlog import log_slots

    spans = (row_bytes + PAGE - 2) // PAGE + 1  # the most pages one row lies in
    slots = log_slots(packed)  # a frequency layout's row log: its rows go there whole pages at a time
    rows_file = pages((num_rows + packed + slots) * row_bytes)
    written = lookups * spans * PAGE + min(slots * row_bytes, lookups * row_bytes + PAGE)
    log_file = pages(4 * packed) if packed else 0
    return min(rows_file, written) + min(pages(num_rows), lookups * PAGE) + log_file + PAGE


def _allocated(directory: Path) -> int:
    """Bytes of blocks the store files in ``directory`` hold now (0: none there)."""
    from bagpipe.store.disk import LOG, PRESENT, ROWS

    total = 0
    for name in (ROWS, PRESENT, LOG):
        try:
            total += os.stat(directory / name).st_blocks * 512
        except OSError:
            pass
    return total


def check_store_space(cfg: TrainConfig, shape: RunShape, checkpoints: CheckpointEstimate | None) -> int | None:
    """Refuse (ConfigError, one line) a run whose disk store can grow past the free space
    of its disk (``checkpoints``: the run's checkpoint estimate, counted too when they share
    the disk); the store's bound in bytes, or None without a disk store."""
    if cfg.cache.store != "disk" or not shape.spec.store:
        return None
    given = cfg.cache.store_dir
    directory = Path(given) if given else Path(cfg.run.out) / "store"
    trainers = cfg.dist.trainers if cfg.dist.distributed else 1
    lookups = cfg.run.steps * shape.lookups * trainers
    from bagpipe.data.frequency import LAYOUT_MAX_ROWS

    frequency = shape.layout is not None and shape.layout.name == "frequency"
    packed = min(LAYOUT_MAX_ROWS, shape.num_rows) if frequency else 0
    need = store_bytes(shape.num_rows, 4 * (shape.dim + shape.state_dim), lookups, packed)
    where, free = free_bytes(directory)
    have = _allocated(directory)
    if given:
        need = max(0, need - have)  # rows a reused store holds have their blocks
    else:
        free += have  # the run's own store is emptied first
    also = ""
    ckpt_where, _ = free_bytes(Path(cfg.run.out) / "checkpoints")
    if checkpoints is not None and os.stat(ckpt_where).st_dev == os.stat(where).st_dev:
        need += checkpoints.bytes
        also = f" with the run's checkpoints ({size(checkpoints.bytes)})"
    if need > free:
        fix = "give a --store-dir on another disk" if not given else "give another --store-dir"
        raise ConfigError(
            f"{'--store-dir ' + given if given else cfg.run.out}: this run's disk store needs up to {size(need)}{also} "
            f"({shape.num_rows:,} rows of {4 * (shape.dim + shape.state_dim)} bytes, at most the pages of "
            f"{lookups:,} row writes) but {where} has {size(free)} free; free some space, {fix}, or train fewer --steps"
        )
    return need
