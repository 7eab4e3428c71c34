"""A one-process run's checkpoint cut, within its memory budget.

Without a budget the cut copies the rows its part needs (:meth:`Backend.snapshot`) and
the part is written from the copy while training goes on: the fast path, its memory the
rows written since the previous cut.

With a budget (:attr:`Backend.fit`) the cut first takes the rows as a bitmap
(:meth:`Backend.cut`, R/8 bytes) and counts them; what the budget leaves for the cut is
:func:`bagpipe.budget.estimate.cut_bytes` (the estimate's "checkpoint cut" part and
whatever the budget leaves beyond the estimate):

* if the copy and its write's chunk fit, the rows are copied (in chunks) and the part is
  written in the background, as without a budget;
* else the part is streamed at the cut, one chunk of ``chunk_rows`` rows at a time, read
  from the store (quiescent: its write-backs drained, training waits) and the cache,
  each chunk written before the next is read; the part files' pages not yet written back
  stay under two chunks' bytes. Training waits for that write (no overlap), but the
  cut's memory is the chunk's, however many rows were written since the previous cut.

Under a budget a compaction (a full checkpoint that would merge the previous one's chain
with the rows written since) takes every written row from the store instead: the same
rows with the same values (a row not written since the previous cut holds that cut's
value in the store), without reading the chain into memory.
"""

from __future__ import annotations

from typing import Protocol

from bagpipe.budget.estimate import cut_bytes
from bagpipe.budget.sizing import Fit
from bagpipe.checkpoint import CutTarget, write_part
from bagpipe.checkpoint.parts import CutBudget, RowCut, Snapshot
from bagpipe.faults import pause_at
from bagpipe.train.protocols import PartsWriter


class CutSource(Protocol):
    """What of a :class:`~bagpipe.train.protocols.Backend` a one-process cut uses."""

    @property
    def fit(self) -> Fit | None: ...

    def snapshot(self, everything: bool) -> Snapshot: ...

    def cut(self, everything: bool) -> RowCut: ...


def cut_budget(fit: Fit | None, row_bytes: int) -> CutBudget | None:
    """What the budget of ``fit`` gives a checkpoint's cut; None without a budget."""
    if fit is None or fit.budget.usable is None:
        return None
    chunk = fit.sizes.io.chunk_rows
    return CutBudget(cut_bytes(fit.estimate, fit.budget.usable), chunk, dirty_bytes=2 * chunk * row_bytes)


def copy_fits(cut: RowCut, budget: CutBudget) -> bool:
    """Whether the cut's whole copy, and its background write's chunk and dirty pages, fit."""
    row_bytes = 4 * (cut.source.dim + cut.source.state_dim)
    return cut.nbytes() + 2 * budget.chunk_rows * row_bytes + 2 * len(cut.bits) <= budget.bytes


def local_cut(step: int, backend: CutSource, target: CutTarget) -> PartsWriter:
    """The cut of a one-process run's checkpoint ``target`` (shard 0 of 1; see the module)."""
    fit = backend.fit
    if fit is None or fit.budget.usable is None:  # today's fast path: a copy, written in the background
        snap = backend.snapshot(target.everything)

        def write():
            pause_at("checkpoint", step)  # a test kills us here: training goes on, the part is being written
            return [write_part(target.staging, snap, 0, 1, target.kind, target.base_reader())]

        return write
    cut = backend.cut(target.kind == "full")  # a compaction too takes every written row
    budget = cut_budget(fit, 4 * (cut.source.dim + cut.source.state_dim))
    assert budget is not None
    if copy_fits(cut, budget):
        snap = cut.snapshot(budget.chunk_rows)
        del cut

        def write_copy():
            pause_at("checkpoint", step)
            return [write_part(target.staging, snap, 0, 1, target.kind, None, budget.chunk_rows, budget.dirty_bytes)]

        return write_copy
    part = cut.write(target.staging, 0, 1, target.kind, budget.chunk_rows, budget.dirty_bytes)

    def written():
        pause_at("checkpoint", step)
        return [part]

    return written
