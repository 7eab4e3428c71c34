"""``bagpipe predict``: raw log lines -> one click probability per line.

Nothing here parses or maps on its own: a file (or a pipe, ``-``: read once as it
comes) is read in blocks of whole lines with exact line numbers
(:mod:`bagpipe.preprocess.inputs`), each block parsed by the format's
parser with its exact fallback (:meth:`RawFormat.parse_block`), dense values transformed
and categorical keys mapped to ids by the saved vocabulary or hashing
(:func:`bagpipe.preprocess.vocab.map_ids`), bad lines reported as ``FILE:LINE: problem``
by the preprocessing's policy (:class:`bagpipe.preprocess.run.BadLines`). Each block is
scored as one batch by :meth:`ExportedModel.predict`.

Output: one line per data line of the input (a header line excluded), the probability
as ``%.9g`` (exact for float32), ``nan`` for a bad line skipped with ``--on-error skip``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from bagpipe.errors import ParseError
from bagpipe.preprocess.formats import strip_cr
from bagpipe.preprocess.inputs import Block, InputFile, iter_blocks, probe
from bagpipe.preprocess.run import BadLines
from bagpipe.preprocess.vocab import map_ids
from bagpipe.train.evaluate import eval_line, scores

DEFAULT_BLOCK_BYTES = 1 << 20  # about 4,000 Criteo lines: one batch

#: How :func:`predict_file` writes a probability (a float32: 9 digits are exact).
PROBABILITY_FORMAT = "%.9g"
#: The bytes of an existing file :func:`is_predictions_file` reads.
PREDICTIONS_PEEK = 64 << 10
#: A line as :data:`PROBABILITY_FORMAT` writes one: digits, a fraction, an exponent; nan.
_PREDICTION_LINE = re.compile(rb"(?:\d+(?:\.\d+)?(?:e[+-]\d+)?|nan)")


def is_predictions_file(path: str | Path) -> bool:
    """Whether ``path`` is an earlier predictions file (``bagpipe predict --out``
    replaces only such a file): empty, or every whole line of its first
    :data:`PREDICTIONS_PEEK` bytes a probability in [0, 1] as :func:`predict_file` writes
    one (:data:`PROBABILITY_FORMAT`; ``nan`` for a skipped bad line), the last one ended.
    A column of only 0s and 1s is not: that is a label column (``cut -f1 day_0``), and a
    probability is hardly ever exactly 0 or 1."""
    try:
        with open(path, "rb") as f:
            head = f.read(PREDICTIONS_PEEK + 1)
    except OSError:
        return False
    if not head:
        return True
    if len(head) > PREDICTIONS_PEEK:  # a larger file: its whole lines in the first PREDICTIONS_PEEK bytes
        head = head[: head.rfind(b"\n", 0, PREDICTIONS_PEEK) + 1]
    if not head.endswith(b"\n"):
        return False  # no line break in the first 64 KiB, or a last line without one: not predict's
    numbers = set()
    for line in head[:-1].split(b"\n"):
        if not _PREDICTION_LINE.fullmatch(line):
            return False
        if line != b"nan":
            if not 0.0 <= float(line) <= 1.0:
                return False
            numbers.add(line)
    return not numbers or not numbers <= {b"0", b"1"}


def score_block(model, fmt, block: Block, bad: BadLines) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, labels) of every line of ``block`` (nlines,), NaN for a bad line."""
    raw, bad_lines = fmt.parse_block(block.data, block.nlines, block.file.layout, stop_at_bad=bad.on_error == "fail")
    bad.report(block, bad_lines)
    probs = np.full(block.nlines, np.nan, np.float32)
    labels = np.full(block.nlines, np.nan, np.float32)
    if len(raw):
        ids, multihot = map_ids(fmt, model.mapping(), raw)
        probs[raw.rows] = model.predict(fmt.transform_dense(raw.dense), ids.T, multihot)
        labels[raw.rows] = raw.labels
    return probs, labels


def score_lines(model, lines: Iterable[str | bytes], labelled: bool) -> np.ndarray:
    """Probabilities of in-memory raw lines (``ExportedModel.predict_lines``); bad lines raise."""
    items = [(x.encode() if isinstance(x, str) else x).rstrip(b"\n") for x in lines]
    broken = next((i for i, x in enumerate(items, 1) if b"\n" in x), None)
    if broken is not None:  # scored as two lines, it would give more probabilities than items
        raise ParseError(
            "<lines>",
            broken,
            "the item holds a line break; give one line per item "
            "(or a whole text as one string: predict_lines(text) scores its lines)",
        )
    data = b"".join(x + b"\n" for x in items)
    if not data:
        return np.zeros(0, np.float32)
    fmt = model.raw_format(labelled)
    layout = fmt.layout("<lines>", strip_cr(data.split(b"\n", 1)[0]))
    if layout.header_lines:
        data = data.split(b"\n", 1)[1]
    f = InputFile("<lines>", "input", layout=layout)
    block = Block(f, data, data.count(b"\n"), 1 + layout.header_lines, 0, len(data))
    return score_block(model, fmt, block, BadLines("fail"))[0]


@dataclass
class Prediction:
    """What :func:`predict_file` did."""

    lines: int
    skipped: int
    bad_examples: list[str]
    scores: dict | None  # the eval figures over the scored lines, when they are labelled

    def line(self, source: str) -> str:
        text = f"scored {self.lines - self.skipped:,} of {self.lines:,} lines of {source}"
        if self.skipped:
            text += f" ({self.skipped:,} bad lines skipped, e.g. {self.bad_examples[0]})"
        if self.scores is not None:
            text += f"; {eval_line(self.scores)}"
        return text


def predict_file(
    model,
    path: str | Path,
    out: TextIO,
    *,
    labelled: bool = False,
    header: str = "auto",
    on_error: str = "fail",
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> Prediction:
    """Write one probability per data line of raw file ``path`` (plain or gzip) to ``out``.
    ``path`` may be ``-`` (standard input) or a pipe: read once, as it comes, never seeked."""
    fmt = model.raw_format(labelled, header)
    model.mapping()  # a missing vocabulary is an error before any output
    f = InputFile(str(path), "input")
    probe(fmt, f)
    bad = BadLines(on_error)
    lines = 0
    kept: list[tuple[np.ndarray, np.ndarray]] = []
    try:
        for block in iter_blocks(f, block_bytes):
            probs, labels = score_block(model, fmt, block, bad)
            np.savetxt(out, probs, fmt=PROBABILITY_FORMAT)
            lines += block.nlines
            if labelled:
                ok = ~np.isnan(probs)
                kept.append((labels[ok], probs[ok]))
    finally:
        f.close()
    figures = None
    if labelled and kept:
        y, p = (np.concatenate(parts) for parts in zip(*kept))
        figures = scores(y, p) if len(y) else None
    return Prediction(lines, bad.count, bad.examples, figures)
