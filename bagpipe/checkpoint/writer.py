"""Checkpoints that cost almost nothing: a cut at the step boundary, files written meanwhile.

A checkpoint of step K is taken in two halves:

1. **The cut** (the training thread, at the step boundary): :meth:`CheckpointWriter.begin`
   decides the kind (a delta on the latest checkpoint; every ``compact_every``-th one
   full, merged from the chain) and makes the staging folder; the topology then copies
   what the checkpoint needs -- the rows written since the previous cut (for a first
   checkpoint: every row written since initialisation), the cached rows, and the dense
   state -- and training goes on. Under a memory budget that does not hold that copy, a
   one-process run's cut streams its part instead, chunk by chunk, before training goes
   on (:mod:`bagpipe.train.cut`, :class:`~bagpipe.checkpoint.parts.RowCut`).
2. **The write** (a background thread of trainer 0, or of the one process): the parts
   are written from the copy (an embedding server writes its own part in a thread of its
   own), then :func:`commit_checkpoint` writes dense.pt and commits (``MANIFEST.json``,
   ``LATEST``) once every part is durable.

At most one checkpoint is in flight: the next cut first waits for the previous write
(in a run that checkpoints every few minutes it has long finished). A checkpoint that
fails for lack of space (ENOSPC, EDQUOT) is discarded -- its partial files removed, the
previous checkpoint stays the latest -- and said in one line; the rows it would have held
stay in the store, and the next checkpoint is a full one, so nothing is missed. Any
other failure of the write stops the run at the next cut or at the end.
"""

from __future__ import annotations

import errno
import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bagpipe.checkpoint.folder import CheckpointFolder
from bagpipe.checkpoint.format import InitialRows, Kind, Manifest, Part
from bagpipe.checkpoint.reader import CheckpointReader
from bagpipe.errors import CheckpointError
from bagpipe.faults import pause_at

log = logging.getLogger(__name__)

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
ABANDON_WAIT_S = 30.0


class NoSpace(CheckpointError):
    """A checkpoint part could not be written: its disk is full (reported by another process)."""


def no_space(e: BaseException) -> bool:
    return isinstance(e, NoSpace) or (isinstance(e, OSError) and e.errno in NO_SPACE)


@dataclass(frozen=True)
class RowSpace:
    """What a manifest records of the rows: R rows of D weights and S optimizer values,
    relative to the initial tables ``init``."""

    num_rows: int
    dim: int
    state_dim: int
    init: InitialRows


@dataclass(frozen=True)
class CutTarget:
    """Where the checkpoint of ``step`` goes and what its parts hold.

    ``kind`` "delta": the rows written since ``base``. "full" with a ``base``: the rows of
    ``base`` merged with those written since (compaction); "full" without one: every row
    written since initialisation (:attr:`everything`)."""

    step: int
    staging: Path
    kind: Kind
    base: str | None
    chain: int
    root: Path

    @property
    def everything(self) -> bool:
        """Whether the cut must copy every row written since initialisation."""
        return self.kind == "full" and self.base is None

    def base_reader(self) -> CheckpointReader | None:
        """The checkpoint a compacted full part merges (None for a delta or a first full)."""
        return CheckpointReader(self.root / self.base) if self.kind == "full" and self.base else None


@dataclass
class Written:
    """One checkpoint this run took (or tried to)."""

    step: int
    kind: Kind
    rows: int = 0
    bytes: int = 0
    cut_s: float = 0.0
    write_s: float = 0.0
    failed: str | None = None


def commit_checkpoint(
    folder: CheckpointFolder, target: CutTarget, space: RowSpace, dense: dict, write_parts: Callable[[], list[Part]]
) -> Manifest:
    """Write and commit the checkpoint ``target``: the one commit sequence of every topology.

    dense.pt first, then ``write_parts`` (the process's own part, or waiting for every
    embedding server's), then the manifest and the commit. Nothing counts until
    :meth:`CheckpointFolder.commit`. ``write_parts`` runs even when dense.pt could not be
    written: parts under way elsewhere still report, and their reports must be taken."""
    failed: BaseException | None = None
    dense_sum = None
    try:
        dense_sum = folder.write_dense(target.staging, dense)
    except BaseException as e:  # noqa: BLE001 - raised once the parts are in
        failed = e
    parts = write_parts()
    if failed is not None:
        raise failed
    pause_at("commit", target.step)  # a test kills us here: every part written, nothing committed
    manifest = Manifest(
        step=target.step,
        num_rows=space.num_rows,
        dim=space.dim,
        state_dim=space.state_dim,
        kind=target.kind,
        base=target.base if target.kind == "delta" else None,
        parts=parts,
        chain=target.chain,
        init=space.init,
        dense_sum=dense_sum,
    )
    folder.commit(target.staging, manifest)
    return manifest


@dataclass
class CheckpointWriter:
    """Takes a run's checkpoints: :meth:`begin` at the cut, :meth:`submit` the write,
    :meth:`wait` for it (see the module docstring). ``background=False`` writes in the
    caller's thread (the plain reference of the background write)."""

    folder: CheckpointFolder
    compact_every: int
    space: RowSpace
    background: bool = True
    history: list[Written] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._full_next = False  # after a failed checkpoint: the rows it took are in no checkpoint
        self._no_space: list[int] = []  # steps not written for lack of space since the last one said
        self._abandon = threading.Event()
        # the staging folder of a cut not yet handed to a finished write: a signal during the
        # cut (between begin and submit) must not leave it behind (the write removes its own)
        self._staged: Path | None = None

    @property
    def abandoned(self) -> threading.Event:
        """Set when the run failed: a write waiting on other processes gives up."""
        return self._abandon

    def begin(self, step: int) -> CutTarget:
        """The cut's target: waits for the previous checkpoint, decides the kind, makes the staging folder."""
        self.wait()
        kind, base, chain = self.folder.next_kind(self.compact_every)
        if self._full_next:
            kind, base, chain = "full", None, 0
            self._full_next = False
        self._staged = self.folder.staging(step)  # named before it is made: a signal in between still finds it
        staging = self.folder.begin(step)
        return CutTarget(step, staging, kind, base, chain, self.folder.root)

    def submit(self, target: CutTarget, dense: dict, write_parts: Callable[[], list[Part]], cut_s: float) -> None:
        """Write the checkpoint ``target`` (in the background unless ``background`` is False)."""
        record = Written(target.step, target.kind, cut_s=cut_s)
        self.history.append(record)
        if not self.background:
            self._write(target, dense, write_parts, record)
            self._raise()
            return
        self._thread = threading.Thread(
            target=self._write, args=(target, dense, write_parts, record), name="bagpipe-checkpoint", daemon=True
        )
        self._thread.start()

    def _write(self, target: CutTarget, dense: dict, write_parts: Callable[[], list[Part]], record: Written) -> None:
        t0 = time.perf_counter()
        try:
            m = commit_checkpoint(self.folder, target, self.space, dense, write_parts)
            record.rows, record.bytes = m.rows, m.bytes
            self._count_unwritten(f"step {target.step} is written again")
        except BaseException as e:  # noqa: BLE001 - handed to the training thread, or said in one line
            self.folder.discard(target.staging)
            record.failed = str(e).splitlines()[0] if str(e) else type(e).__name__
            self._full_next = True
            if no_space(e):
                if not self._no_space:  # the first of a row of them is said in full, the rest counted
                    free = shutil.disk_usage(self.folder.root).free
                    latest = self.folder.latest_name()
                    log.warning(
                        f"checkpoint of step {target.step} not written: no space left on the disk of "
                        f"{self.folder.root} ({free / 2**20:,.0f} MiB free); its partial files are removed and "
                        + (f"{latest} stays the latest checkpoint" if latest else "the run has no checkpoint yet")
                    )
                self._no_space.append(target.step)
            else:
                self._error = e
        finally:
            record.write_s = time.perf_counter() - t0
            self._staged = None  # committed (renamed) or discarded

    def _count_unwritten(self, then: str) -> None:
        """Say how many checkpoints after the first said were not written for lack of space."""
        more, self._no_space = self._no_space[1:], []
        if more:
            latest = self.folder.latest_name()
            log.warning(
                f"{len(more)} more checkpoint(s) (steps {more[0]}..{more[-1]}) not written for lack of space on the "
                f"disk of {self.folder.root}; {then}"
                + ("" if "written again" in then else f" ({latest or 'no checkpoint'} is the latest)")
            )

    def _raise(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    def wait(self) -> None:
        """Until no checkpoint is being written; raises its failure (unless for lack of space)."""
        if self._thread is not None and self._thread.ident is not None:
            self._thread.join()
        self._thread = None
        self._raise()

    def close(self, abandon: bool = False) -> None:
        """The run ends: wait for the write in flight. ``abandon`` (the run failed): its cut
        was consistent, so it is still let finish, for at most :data:`ABANDON_WAIT_S` (a
        write waiting on processes that are gone fails at once); its error is not raised."""
        if abandon:
            self._abandon.set()
            # a signal can stop the run between the write's Thread() and its start(): nothing to wait for
            if self._thread is not None and self._thread.ident is not None:
                self._thread.join(timeout=ABANDON_WAIT_S)
            writing = self._thread is not None and self._thread.is_alive()
            if self._staged is not None and not writing:  # the cut was stopped before its write began
                self.folder.discard(self._staged)
                self._staged = None
            self._count_unwritten("the run ends")
            return
        self.wait()
        self._count_unwritten("the run ends")
