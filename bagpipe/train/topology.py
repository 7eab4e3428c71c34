"""The one-process topology of the training loop (the distributed one is
:class:`bagpipe.distributed.trainer.DataParallel`); both are
:class:`~bagpipe.train.protocols.Topology` implementations.

A topology answers what the loop (:func:`bagpipe.train.loop.train`) leaves open: which
backend holds the rows, the row strategy of a step, the model wrapper, how a figure
is averaged over trainers, and whether this process writes the run's files.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import torch

from bagpipe.budget.estimate import RunShape
from bagpipe.cache.setup import LocalPlans
from bagpipe.checkpoint import Checkpoint, CutTarget
from bagpipe.config.train import TrainConfig
from bagpipe.data.frequency import frequency_store_layout
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.device import Device, HostDevice
from bagpipe.optim.sparse import SparseOptimizer
from bagpipe.store import drop_unused_store, open_store
from bagpipe.store.init import RowInitializer
from bagpipe.train.backends import FullBackend, cached_backend
from bagpipe.train.cut import local_cut
from bagpipe.train.preflight import MemoryCheck, memory_checks
from bagpipe.train.progress import ProgressKind
from bagpipe.train.protocols import Backend, PartsWriter, RowUpdate
from bagpipe.train.step import LocalRowUpdate

log = logging.getLogger(__name__)


class SingleProcess:
    """One trainer with its store (memory or disk) in the same process, computing on
    ``device`` (default: the host, ``--device cpu``): a ``Topology[Backend]`` (the loop
    needs nothing of its backend beyond the protocol)."""

    reports = True

    def __init__(self, device: Device | None = None):
        self.device = HostDevice() if device is None else device

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def backend(
        self,
        cfg: TrainConfig,
        init: RowInitializer,
        state_dim: int,
        dataset: Dataset,
        stream: BatchStream,
        shape: RunShape,
        ckpt: Checkpoint | None,
        memory: MemoryCheck | None = None,
    ) -> Backend:
        c, spec = cfg.cache, cfg.cache.spec
        if memory is None:  # the pre-flight's checks set up and fitted the cache already, else here
            memory = memory_checks(cfg, dataset, stream, shape)  # the shape the loop measured
        if not (spec.store and c.store == "disk" and not c.store_dir):  # RUN/store is not this run's store
            drop_unused_store(Path(cfg.run.out) / "store", c.store_dir if spec.store and c.store == "disk" else None)
        if not spec.store:
            return FullBackend(init, state_dim, self.device, fit=memory.fit)
        setup = memory.setup
        assert setup is not None  # a mode with a store
        lay = (memory.shape or shape).layout  # a budget may have turned auto's frequency layout into identity
        if lay is not None and lay.auto:
            log.info(f"store layout: {lay.name} ({lay.why})")
        store_dir = Path(c.store_dir) if c.store_dir else Path(cfg.run.out) / "store"
        # a resumed run overwrites every row with its checkpoint's: its own old store may stay
        store = open_store(
            c.store,
            init,
            state_dim,
            store_dir,
            owned=not c.store_dir,
            reuse=c.init_from_store or ckpt is not None,  # a resume: check_resume refused another run's store
            must_exist=c.init_from_store,
            io=setup.plan.fit.sizes.io if setup.plan.fit is not None else None,
            # counted only if a store is made here (a store reopened keeps its own layout)
            layout=(lambda: frequency_store_layout(dataset)) if lay is not None and lay.name == "frequency" else None,
        )
        if lay is not None:
            store.layout_choice = lay.why
        return cached_backend(setup.plan, store, LocalPlans(setup), self.device, spec.executor)

    def restore_rows(self, ckpt: Checkpoint, backend: Backend) -> None:
        backend.restore(ckpt.reader())

    def checkpoint_cut(self, step: int, backend: Backend, target: CutTarget | None) -> PartsWriter:
        """This process is shard 0 of 1: the cut copies the rows its one part needs (the
        store's written since the previous cut, and the cache's), the part is written from
        the copy afterwards -- or, where a memory budget does not hold the copy, streams
        the part at the cut (:mod:`bagpipe.train.cut`)."""
        assert target is not None
        return local_cut(step, backend, target)

    def row_update(self, opt: SparseOptimizer, backend: Backend) -> RowUpdate:
        return LocalRowUpdate(opt)

    def mean(self, values: list[float]) -> float:
        return float(np.mean(values))

    def progress_kind(self, progress: bool) -> ProgressKind:
        # a bar redrawn into a pipe or a log file is noise: there, a line every few seconds
        return ("bar" if sys.stderr.isatty() else "lines") if progress else "off"

    def section(self, backend: Backend, rows: RowUpdate) -> None:
        return None
