"""The spill: pass 1's parsed blocks, kept on disk so that pass 2 does not parse again.

In vocabulary mode pass 1 parses the ``--input`` lines to count their keys, and pass 2
needs the same lines again to map keys to ids and write shards. Rather than parse the
text twice, pass 1 appends every parsed block (:class:`Parsed`: rows, labels,
transformed dense values, fixed ids, keys, sequences) to one file, ``blocks.bin``, in a
folder ``.OUT.spill-PID-*`` next to the output directory (removed at the end; if this
process is killed, by the next ``preprocess`` to the same ``--out``, which knows it by
its name: :meth:`bagpipe.output_dir.OutputDir.remove_left_behind`), and pass 2 replays
the blocks in order. A block whose keys all lie in ``[-1, 2**32 - 1)`` (most Criteo
blocks) stores them as uint32 ``key + 1``: about 0.6 bytes per byte of Criteo text in all.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bagpipe.preprocess.formats import Raw
from bagpipe.preprocess.inputs import Block


@dataclass
class Parsed:
    """One block after parsing: what the workers hand on, and what the spill keeps."""

    raw: Raw  # the valid lines (dense still raw)
    dense: np.ndarray  # (n, Dd) float32, transformed
    bad: list[tuple[int, str]]


class Spill:
    """Parsed blocks of pass 1, kept on disk next to the output directory ``out`` (in a
    folder of its own, named with this process's pid, removed at the end) and replayed by
    pass 2."""

    def __init__(self, out: Path):
        out.parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f".{out.name}.spill-{os.getpid()}-", dir=out.parent))
        self._f = open(self.dir / "blocks.bin", "wb")
        self.records: list[tuple[Block, list[tuple[str, int, str, tuple]], int]] = []

    def put(self, b: Block, p: Parsed) -> None:
        raw = p.raw
        arrays = {"rows": raw.rows, "labels": raw.labels, "dense": p.dense, "fixed": raw.fixed}
        keys = raw.keys
        if keys.size and keys.min() >= -1 and keys.max() < (1 << 32) - 1:
            keys = (keys + 1).astype(np.uint32)  # most Criteo keys: half the bytes
        arrays["keys"] = keys
        for j, (v, lengths) in enumerate(raw.seqs):
            arrays[f"seq{j}.values"] = v
            arrays[f"seq{j}.lengths"] = lengths
        index = []
        for name, arr in arrays.items():
            arr = np.ascontiguousarray(arr)
            index.append((name, self._f.tell(), arr.dtype.str, arr.shape))
            if arr.size:
                self._f.write(arr.data)
        # the block's text is not needed any more
        rec = Block(b.file, b"", b.nlines, b.first_line, b.first_index, b.disk_bytes, global_start=b.global_start)
        self.records.append((rec, index, len(b.data)))

    def load(self, index) -> Parsed:
        arrays = {}
        with open(self.dir / "blocks.bin", "rb") as f:
            for name, offset, dtype, shape in index:
                count = int(np.prod(shape)) if shape else 1
                f.seek(offset)
                arrays[name] = np.fromfile(f, dtype=np.dtype(dtype), count=count).reshape(shape)
        keys = arrays["keys"]
        if keys.dtype == np.uint32:
            keys = keys.astype(np.int64) - 1
        nseq = sum(1 for n in arrays if n.endswith(".values"))
        raw = Raw(
            rows=arrays["rows"],
            labels=arrays["labels"],
            dense=np.zeros((len(arrays["rows"]), 0)),
            keys=keys,
            fixed=arrays["fixed"],
            seqs=[(arrays[f"seq{j}.values"], arrays[f"seq{j}.lengths"]) for j in range(nseq)],
        )
        return Parsed(raw, arrays["dense"], [])

    def finish_writing(self) -> None:
        if not self._f.closed:
            self._f.close()

    def remove(self) -> None:
        self.finish_writing()
        shutil.rmtree(self.dir, ignore_errors=True)
