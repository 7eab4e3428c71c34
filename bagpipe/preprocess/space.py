"""Before converting: will the data set fit on the disk of ``--out``?

From the plain regular ``--input`` / ``--eval-files`` files (a pipe or a gzip file is
not counted: its size is not known before it is read) the lines are estimated, and a
data set that surely cannot fit -- at least a label, the dense values and an id per
feature for each line -- is refused in one line before any line is converted.
"""

from __future__ import annotations

import os

from bagpipe.output_dir import OutputDir
from bagpipe.preprocess.formats import RawFormat
from bagpipe.preprocess.inputs import InputFile, is_stream

#: Bytes of a plain input file whose lines are counted to estimate how many it holds.
SPACE_PROBE_BYTES = 1 << 20


def expected_size(fmt: RawFormat, files: list[InputFile]) -> tuple[int, int]:
    """(lines, bytes a sample takes at least) of the output of ``files``' plain regular
    files: their lines estimated from the first :data:`SPACE_PROBE_BYTES` of each (a
    stream or a gzip file is not counted: its size is not known before it is read); a
    sample's label and dense values (float32), a 4-byte id per one-hot feature and an
    8-byte offset per multi-hot one (its ids not counted)."""
    lines = 0
    for f in files:
        if is_stream(f.path):
            continue
        try:
            size = os.path.getsize(f.path)
            with open(f.path, "rb") as raw:
                head = raw.read(SPACE_PROBE_BYTES)
        except OSError:
            continue
        if head[:2] == b"\x1f\x8b" or not head:
            continue
        n = head.count(b"\n") + (not head.endswith(b"\n") and len(head) == size)
        lines += n if len(head) >= size else round(size * n / (head.rindex(b"\n") + 1)) if n else 1
    seq = len(fmt.seq_features)
    per_sample = 4 + 4 * len(fmt.dense_names) + 4 * (len(fmt.feature_order) - seq) + 8 * seq
    return lines, per_sample


def check_space(fmt: RawFormat, files: list[InputFile], output: OutputDir) -> None:
    """Refuse, in one line and before any line is converted, a data set the disk of
    ``--out`` has surely no room for (:func:`expected_size`)."""
    lines, per_sample = expected_size(fmt, files)
    if lines:
        output.check_space(
            lines * per_sample,
            f"about {lines:,} input lines x at least {per_sample} bytes a sample",
            "convert fewer lines",
        )
