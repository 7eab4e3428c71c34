"""The seams of the training loop, declared: what each part must provide.

The one training loop (:func:`bagpipe.train.loop.train`) is written against these
protocols only; every mode and topology is a choice of implementations:

========================  =================================================  ======================================
seam                      what it is                                         implementations
========================  =================================================  ======================================
:class:`Backend`          where a step's rows come from and go back to       ``FullBackend``, ``CachedBackend``
                                                                             (:mod:`bagpipe.train.backends`)
:class:`PlanSource`       where a cached backend's plans come from           ``LocalPlans`` (:mod:`bagpipe.cache.setup`),
                                                                             ``RemotePlans`` (distributed trainer)
:class:`StepFn`           one training step                                  :data:`bagpipe.train.step.STEPS`
:class:`RowUpdate`        how a step updates its embedding rows              ``LocalRowUpdate``, ``SyncedRowUpdate``,
                                                                             ``PeriodicRowUpdate``
:class:`Topology`         one process, or a trainer of a distributed job     ``SingleProcess``, ``DataParallel``
========================  =================================================  ======================================

Below them: the planners (:class:`bagpipe.oracle.planners.Planner`), the executors
(:class:`bagpipe.cache.executor.PlanExecutor` and its pipelined extension), the stores
(:class:`bagpipe.store.base.EmbeddingStore`) and the table of modes
(:mod:`bagpipe.config.modes`). ``docs/architecture.md`` tells the order to read them in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np
import torch

from bagpipe.accel.profile import HotSet
from bagpipe.budget.estimate import RunShape
from bagpipe.budget.sizing import Fit
from bagpipe.checkpoint import Checkpoint, CheckpointReader, CutTarget, Part, Snapshot
from bagpipe.checkpoint.parts import RowCut
from bagpipe.config.train import TrainConfig
from bagpipe.data.batch import Batch
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.device import Device
from bagpipe.optim.sparse import SparseOptimizer
from bagpipe.oracle.plan import Plan
from bagpipe.store.init import RowInitializer
from bagpipe.train.progress import ProgressKind
from bagpipe.train.summary import CacheStats, DistributedStats

if TYPE_CHECKING:
    from bagpipe.train.preflight import MemoryCheck

Rows = Iterator[tuple[int, np.ndarray, np.ndarray]]
"""Rows in chunks: (first global row, (n, D) weights, (n, S) optimizer state)."""

IdRows = Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]
"""Some rows in chunks: ((n,) ascending global rows, (n, D) weights, (n, S) optimizer state)."""

PartsWriter = Callable[[], list[Part]]
"""Writes (or waits for) a checkpoint's row parts after its cut; returns them."""


@dataclass
class StepInput:
    """What one training step needs from the embedding side.

    weights/state: (R or C, D) / (R or C, S) the tensors the rows live in (on the device).
    index: (U,) int64 positions in ``weights`` of the batch's unique rows (ascending row),
        on the device.
    inverse: (N,) int64 position in ``index`` of every lookup, on the device.
    batch: the batch, in host memory (the step copies what the model reads).
    plan: the cache plan of the step (None for the full tables).
    ready: puts any rows still being fetched in place (Hotline fetches its cold rows while
        the popular micro-batch computes); a step calls it before it reads them.
    """

    step: int
    batch: Batch
    weights: torch.Tensor
    state: torch.Tensor
    index: torch.Tensor
    inverse: torch.Tensor
    plan: Plan | None = None
    ready: Callable[[], None] = lambda: None


class RowUpdate(Protocol):
    """How a step updates its embedding rows (the step strategy)."""

    def apply(self, inp: StepInput, rows_u: torch.Tensor, grad_u: torch.Tensor) -> None:
        """Update the step's U rows: ``rows_u`` (U, D) the values the step used, ``grad_u`` their gradients."""
        ...

    def before_evict(self, plan: Plan) -> None:
        """Called before ``plan`` frees or refills cache slots (rows must be final by then)."""
        ...

    def finish(self) -> None:
        """Complete any deferred work: after it every row holds its latest value."""
        ...

    def phase_seconds(self) -> dict:
        """Cumulative seconds of its own phases (``sync_wait``) for the step meter."""
        ...

    def stats(self) -> dict:
        """Counters for the summary."""
        ...


class StepFn(Protocol):
    """One training step: forward, backward, the dense optimizer, then ``rows`` updates the
    embedding rows. Adds seconds to ``times["forward"|"backward"|"optimizer"]``; returns the
    batch's mean loss."""

    def __call__(
        self,
        model: torch.nn.Module,
        dense_opt: torch.optim.Optimizer,
        rows: RowUpdate,
        inp: StepInput,
        times: dict,
    ) -> float: ...


class PlanSource(Protocol):
    """Where a cached backend's plans come from: a planner in this process, or the oracle role."""

    lookahead: int | None
    """L of a planner that looks ahead (the executor fetches up to L + 1 plans ahead), else None."""

    def plans(self, stream: BatchStream, start: int, stop: int) -> Iterator[Plan]:
        """The plans of steps [start, stop)."""
        ...

    def stats(self) -> dict:
        """The planner's counters (:class:`bagpipe.oracle.plan.PlanStats` as a dict, the hot
        tier's under ``hot``)."""
        ...


class Backend(Protocol):
    """Where a step's unique rows come from and where their updates go.

    Every backend hands the step the same thing (:class:`StepInput`): a table tensor, the
    indices of the batch's unique rows in ascending global-row order, and the inverse map
    of every lookup. That is why every mode's result equals ``--mode full``'s, bit for bit.

    Its life: :meth:`restore` (a resumed run), then :meth:`steps` (with
    :meth:`after_step` after each step, :meth:`flush` whenever the store must hold
    every row -- an evaluation mid-run -- and :meth:`snapshot` at a checkpoint's cut),
    :meth:`finish`, then :meth:`touched` / :meth:`lookup` (digest, evaluation), and
    :meth:`close` always.
    """

    fit: Fit | None
    """The memory budget's fit of the run (the budget, the sizes it chose, their
    estimate; on a data-parallel trainer the oracle role's, which sized it) for the
    summary, or None where nothing was sized. Given at construction."""
    hot: HotSet | None
    """The rows held in the device's memory for the whole run beside the cache (the hot
    tier), or None."""

    def restore(self, reader: CheckpointReader) -> None:
        """Hold the checkpoint's rows (before training starts): the rows it holds are
        loaded, every other row is (again) its initial value. Costs the rows it holds."""
        ...

    def snapshot(self, everything: bool) -> Snapshot:
        """A checkpoint's cut on one process: a copy of the rows written since the previous
        cut (``everything``: since initialisation), their values as of now."""
        ...

    def cut(self, everything: bool) -> RowCut:
        """A checkpoint's cut on one process under a memory budget: the rows :meth:`snapshot`
        would copy, as a bitmap over a quiescent source (copied or streamed chunk by chunk
        before training goes on: :mod:`bagpipe.train.cut`)."""
        ...

    def steps(
        self, stream: BatchStream, start: int, stop: int, before_evict: Callable[[Plan], None] | None = None
    ) -> Iterator[StepInput]:
        """The steps [start, stop) of ``stream``, their rows in place; ``before_evict`` is
        called with each plan before its slots are freed or refilled."""
        ...

    def after_step(self, inp: StepInput) -> None:
        """The step's update is done (its expired rows may leave the cache)."""
        ...

    def flush(self, label: int, durable: bool = True) -> None:
        """After plan ``label`` (0-based) is done: the store holds every row's latest value
        (``durable``: on disk), and reads without a label of their own (evaluation, export,
        a server's checkpoint cut) see it."""
        ...

    def finish(self) -> None:
        """After the last step: every row in the store, any background work stopped."""
        ...

    def export(self) -> Rows:
        """Every row, in global-row order (the plain reference of :meth:`touched`)."""
        ...

    def touched(self) -> IdRows:
        """Every row that may differ from its initial value (written since initialisation),
        ascending; after :meth:`finish` (the digest). The rows never written are not read."""
        ...

    def lookup(self, rows: torch.Tensor) -> torch.Tensor:
        """(U, D) current weights of global ``rows`` (evaluation)."""
        ...

    def watched(self, rows: np.ndarray) -> Callable[[], torch.Tensor]:
        """A reader of the current weights of ``rows`` ((H,) ascending global rows that
        stay in the device's memory: any rows of the full tables, a cached backend's hot
        tier): each call returns an (H, D) copy, in the order of ``rows`` (Slipstream's
        snapshots). ValueError for rows this backend cannot watch."""
        ...

    def phase_seconds(self) -> dict:
        """Cumulative seconds of the trainer thread's embedding phases (``wait_embeddings``,
        ``writeback``) for the step meter."""
        ...

    def stats(self) -> CacheStats | None:
        """The summary's ``cache`` section, or None for the full tables."""
        ...

    def close(self, abandon: bool = False) -> None:
        """Release everything; ``abandon`` after a failure (pending write-backs are dropped)."""
        ...


B = TypeVar("B", bound=Backend)


class Topology(Protocol[B]):
    """What differs between one process and a trainer of a data-parallel job.

    Everything a method needs is passed in or was given to the topology's constructor:
    what a topology builds for the run (a remote store, the plan stream) lives in the
    backend ``B`` it returns, which the loop passes to every later call -- typed as the
    topology built it (a data-parallel trainer's reaches its servers without a downcast).
    """

    reports: bool
    """Whether this process writes the run's files (config, metrics, checkpoints, summary)."""
    device: Device
    """Where this trainer computes: the model, and the backend's tables or cache."""

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model as the step runs it (DDP on a data-parallel trainer)."""
        ...

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
    ) -> B:
        """Where the rows live: R = ``init.num_rows`` rows of D = ``init.dim`` weights and
        S = ``state_dim`` optimizer values; ``shape``: the run's, as its pre-flight measured
        it (:func:`bagpipe.train.preflight.preflight`: what a topology that sizes its own
        memory plans by); ``ckpt``: the checkpoint a resumed run restores; ``memory``: the
        pre-flight's memory checks (the cache it set up and fitted), None where it made none."""
        ...

    def restore_rows(self, ckpt: Checkpoint, backend: B) -> None:
        """Make the rows of ``ckpt`` the rows where this topology keeps its rows."""
        ...

    def checkpoint_cut(self, step: int, backend: B, target: CutTarget | None) -> PartsWriter | None:
        """The cut of the checkpoint of ``step`` (:mod:`bagpipe.checkpoint.writer`): copy
        what its row parts need, now, and return what writes them (or waits for the
        processes that write them) afterwards, in the background. Every trainer takes part;
        ``target`` is None (and so is the result) on a process that does not commit."""
        ...

    def row_update(self, opt: SparseOptimizer, backend: B) -> RowUpdate:
        """The step's row strategy."""
        ...

    def mean(self, values: list[float]) -> float:
        """The mean over every trainer of each trainer's mean of ``values`` (a collective)."""
        ...

    def progress_kind(self, progress: bool) -> ProgressKind:
        """How progress is shown: a bar, lines, or not at all."""
        ...

    def section(self, backend: B, rows: RowUpdate) -> DistributedStats | None:
        """The summary's ``distributed`` section, or None on one process."""
        ...
