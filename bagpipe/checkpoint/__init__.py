"""Checkpoints: one format for every mode and topology, written in parts by whoever
holds the rows, incremental between periodic full ones (see :mod:`.format`)."""

from bagpipe.checkpoint.folder import (
    Checkpoint,
    CheckpointFolder,
    PartsTarget,
    commit_checkpoint,
    latest,
    load_dense,
)
from bagpipe.checkpoint.format import Manifest, Part
from bagpipe.checkpoint.parts import write_part
from bagpipe.checkpoint.reader import CheckpointReader

__all__ = [
    "Checkpoint",
    "CheckpointFolder",
    "CheckpointReader",
    "Manifest",
    "Part",
    "PartsTarget",
    "commit_checkpoint",
    "latest",
    "load_dense",
    "write_part",
]
