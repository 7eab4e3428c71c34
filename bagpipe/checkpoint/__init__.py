"""Checkpoints: one format for every mode and topology, relative to the initial rows,
written in parts by whoever holds the rows, in the background after a cut at the step
boundary, incremental between periodic full ones (see :mod:`.format`, :mod:`.writer`)."""

from bagpipe.checkpoint.folder import (
    Checkpoint,
    CheckpointFolder,
    latest,
    load_dense,
)
from bagpipe.checkpoint.format import InitialRows, Manifest, Part
from bagpipe.checkpoint.parts import RowSource, Snapshot, take_snapshot, write_part
from bagpipe.checkpoint.reader import CheckpointReader, RowTarget, restore_rows
from bagpipe.checkpoint.writer import (
    CheckpointWriter,
    CutTarget,
    NoSpace,
    RowSpace,
    Written,
    commit_checkpoint,
)

__all__ = [
    "Checkpoint",
    "CheckpointFolder",
    "CheckpointReader",
    "CheckpointWriter",
    "CutTarget",
    "InitialRows",
    "Manifest",
    "NoSpace",
    "Part",
    "RowSource",
    "RowSpace",
    "RowTarget",
    "Snapshot",
    "Written",
    "commit_checkpoint",
    "latest",
    "load_dense",
    "restore_rows",
    "take_snapshot",
    "write_part",
]
