"""The one-process topology of the training loop (the distributed one is
:class:`bagpipe.distributed.trainer.DataParallel`).

A topology answers what the loop (:func:`bagpipe.train.loop.train`) leaves open: which
backend holds the rows, the row strategy of a step, the model wrapper, how a figure
is averaged over trainers, and whether this process writes the run's files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch

from bagpipe.accel.hot import HotSplit, hot_set_for
from bagpipe.checkpoint import Checkpoint, CheckpointFolder, Manifest, write_part
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.faults import pause_at
from bagpipe.optim.sparse import SparseOptimizer
from bagpipe.oracle.sizing import lookups_per_batch, size_cache
from bagpipe.store import open_store
from bagpipe.store.init import RowInitializer
from bagpipe.train.backends import CachedBackend, FullBackend, LocalPlanner
from bagpipe.train.config import TrainConfig
from bagpipe.train.progress import ProgressKind
from bagpipe.train.step import LocalRowUpdate, RowUpdate


class Topology(Protocol):
    reports: bool
    """Whether this process writes the run's files (config, metrics, checkpoints, summary)."""

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module: ...

    def backend(self, cfg: TrainConfig, init: RowInitializer, state_dim: int, dataset: Dataset,
                stream: BatchStream, announce: Callable[[str], None] | None, ckpt: Checkpoint | None): ...

    def restore_rows(self, ckpt: Checkpoint, backend) -> None:
        """Load every row of ``ckpt`` where this topology keeps its rows."""

    def checkpoint(self, run_dir: Path, step: int, dense: dict, backend, compact_every: int) -> Manifest | None:
        """Write a checkpoint of ``step`` (every trainer calls it; the store holds every
        row); returns its manifest on the process that committed it, else None."""

    def row_update(self, opt: SparseOptimizer, backend) -> RowUpdate: ...

    def mean(self, values: list[float]) -> float:
        """The mean over every trainer of each trainer's mean of ``values`` (a collective)."""

    def progress_kind(self, progress: bool) -> ProgressKind: ...

    def say(self, line: str) -> None: ...

    def section(self, backend, rows: RowUpdate) -> dict | None:
        """The summary's ``distributed`` section (None on one process)."""


class SingleProcess:
    """One trainer with its store (memory or disk) in the same process."""

    reports = True

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def backend(self, cfg: TrainConfig, init: RowInitializer, state_dim: int, dataset: Dataset,
                stream: BatchStream, announce: Callable[[str], None] | None, ckpt: Checkpoint | None = None):
        c = cfg.cache
        if c.mode == "full":
            return FullBackend(init, state_dim)
        lookups = lookups_per_batch(dataset.meta, stream, cfg.run.steps)
        size = size_cache(
            c.planner, cache_rows=c.cache_rows, lookahead=c.lookahead, budget_mb=c.cache_budget_mb,
            total_rows=init.num_rows, dim=init.dim, state_dim=state_dim, stream=stream, steps=cfg.run.steps,
            lookups=lookups,
        )
        if size.tuned is not None and announce is not None:
            announce(size.tuned.line())
        hot = hot_set_for(cfg, dataset, init.dim, state_dim, announce)
        split = HotSplit(hot, size.rows, cfg.hot.fae_schedule) if hot is not None else None
        store_dir = Path(c.store_dir) if c.store_dir else Path(cfg.run.out) / "store"
        # a resumed run overwrites every row with its checkpoint's: its own old store may stay
        store = open_store(c.store, init, state_dim, store_dir, owned=not c.store_dir,
                           reuse=c.init_from_store or ckpt is not None)
        enough = min(lookups, init.num_rows)
        backend = CachedBackend(store, size.rows, LocalPlanner(c.planner, init.num_rows, size.rows, size.lookahead, split, enough),
                                hot=hot, defer_install=c.mode == "hotline")
        if size.tuned is not None:
            backend.extra_stats["autotune"] = size.tuned.as_dict()
        return backend

    def restore_rows(self, ckpt: Checkpoint, backend) -> None:
        for a, w, s in ckpt.reader().chunks():
            backend.load_rows(a, w, s)

    def checkpoint(self, run_dir: Path, step: int, dense: dict, backend, compact_every: int) -> Manifest:
        """This process is shard 0 of 1: it writes the one part itself."""
        folder = CheckpointFolder(run_dir)
        staging = folder.begin(step)
        kind, base, chain = folder.next_kind(compact_every)
        src = backend.row_source()
        part = write_part(staging, src, 0, 1, kind)
        folder.write_dense(staging, dense)
        pause_at("checkpoint", step)  # a test kills us here: parts written, nothing committed
        m = Manifest(step=step, num_rows=src.num_rows, dim=src.dim, state_dim=src.state_dim, kind=kind, base=base,
                     parts=[part], chain=chain)
        folder.commit(staging, m)
        return m

    def row_update(self, opt: SparseOptimizer, backend) -> RowUpdate:
        return LocalRowUpdate(opt)

    def mean(self, values: list[float]) -> float:
        return float(np.mean(values))

    def progress_kind(self, progress: bool) -> ProgressKind:
        return "bar" if progress else "off"

    def say(self, line: str) -> None:
        print(line, flush=True)

    def section(self, backend, rows: RowUpdate) -> dict | None:
        return None
