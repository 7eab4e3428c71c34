"""The run: raw files -> shards, in one pass (hashing, ``--vocab-from``) or two (vocabulary).

The pipeline, for every format (:mod:`bagpipe.preprocess.criteo`,
:mod:`~bagpipe.preprocess.avazu`, :mod:`~bagpipe.preprocess.taobao`):

1. *probe*: every input file exists, has at least one data line; a CSV header is
   recognised (or refused with ``--no-header``).
2. *count* (only for ``0 < --split < 1``): newlines per file, so the first
   ``floor(split * N)`` data lines can go to ``train``. An input that can be read only
   once (``-``, a pipe: :func:`~bagpipe.preprocess.inputs.is_stream`) is read here, its
   text kept in a folder ``.OUT.spill-PID-*`` next to the output (removed at the end) and
   read from there by the passes below: the same lines as a file's, so the same output.
   Any other run reads a stream exactly once, in the first pass that needs its lines,
   the probe's lines replayed.
3. *vocabulary* (vocabulary mode only): every ``--input`` line is parsed, the
   categorical keys of the train lines are counted, and the parsed blocks are kept in
   a spill file next to the output directory (:mod:`bagpipe.preprocess.spill`).
4. *write*: every line is parsed (or replayed from the spill), its categorical values
   mapped to ids (:mod:`bagpipe.preprocess.vocab`), and rows appended to a
   :class:`~bagpipe.data.shards.ShardWriter`, which writes shards as they fill and
   ``meta.json`` last.

Blocks are parsed on a thread pool (numpy and pyarrow release the GIL) and consumed
strictly in order (:func:`_pipelined`), so the output does not depend on the number of
threads or the block size. Bad lines stop the run with ``FILE:LINE: problem``
(``--on-error fail``) or are skipped and counted, the first ten kept as examples
(``--on-error skip``; :class:`BadLines`, which ``bagpipe predict`` shares).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import numpy as np

from bagpipe.data.schema import META_FILE, FeatureSpec
from bagpipe.data.shards import ShardWriter
from bagpipe.errors import BagpipeError, ConfigError, DataError, ParseError
from bagpipe.output_dir import OutputDir
from bagpipe.preprocess.formats import RawFormat
from bagpipe.preprocess.inputs import (
    Block,
    InputFile,
    count_data_lines,
    identity,
    is_stream,
    iter_blocks,
    probe,
    spool,
)
from bagpipe.preprocess.options import Options, Result
from bagpipe.preprocess.space import check_space
from bagpipe.preprocess.spill import Parsed, Spill
from bagpipe.preprocess.vocab import (
    VOCAB_DIR,
    HashMapping,
    KeyCounter,
    Mapping,
    Vocabulary,
    load_mapping,
    map_ids,
    save_mapping,
)

MAX_BAD_EXAMPLES = 10

log = logging.getLogger(__name__)


def _progress(opts: Options, total: int | None, desc: str):
    """A byte progress bar; ``total`` None (a stream's size is unknown): bytes read only."""
    from tqdm import tqdm

    disable = None if opts.progress is None else not opts.progress
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=disable, leave=False, dynamic_ncols=True)


def _pipelined(items: Iterator, fn: Callable, workers: int) -> Iterator:
    """``fn(item)`` for each item on a thread pool, yielded in order (bounded read-ahead)."""
    if workers <= 1:
        for it in items:
            yield it, fn(it)
        return
    ex = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bagpipe-preprocess")
    q: deque = deque()
    try:
        for it in items:
            q.append((it, ex.submit(fn, it)))
            if len(q) > 2 * workers:
                it0, fut = q.popleft()
                yield it0, fut.result()
        while q:
            it0, fut = q.popleft()
            yield it0, fut.result()
    finally:
        for _, fut in q:
            fut.cancel()
        ex.shutdown(wait=True, cancel_futures=True)


class BadLines:
    """The bad-line policy: ``fail`` raises :class:`~bagpipe.errors.ParseError` (``FILE:LINE:
    problem``) at the first bad line; ``skip`` counts them and keeps the first
    :data:`MAX_BAD_EXAMPLES` as examples."""

    def __init__(self, on_error: str):
        self.on_error = on_error
        self.count = 0
        self.examples: list[str] = []

    def report(self, block: Block, bad: list[tuple[int, str]]) -> None:
        for off, problem in bad:
            line = block.first_line + off
            if self.on_error == "fail":
                raise ParseError(block.file.path, line, problem)
            self.count += 1
            if len(self.examples) < MAX_BAD_EXAMPLES:
                self.examples.append(f"{block.file.path}:{line}: {problem}")


def _total(files: list[InputFile]) -> int | None:
    """Bytes the next pass reads of ``files``; None when a stream's size is unknown."""
    if any(f.stream is not None and not f.stream.taken for f in files):
        return None
    return sum(f.read_size for f in files)


def run_preprocess(fmt: RawFormat, opts: Options) -> Result:
    """Convert ``opts.inputs`` / ``opts.eval_files`` in format ``fmt`` into a dataset in ``opts.out``."""
    t0 = time.perf_counter()
    opts.check()  # again: a dataclass can be changed after it was made
    workers = opts.worker_threads

    # -- the files and their splits ------------------------------------------
    split = opts.train_split
    if not opts.labelled:
        files = [InputFile(p, "test") for p in opts.inputs]
    else:
        files = [InputFile(p, "input") for p in opts.inputs] + [InputFile(p, "eval") for p in opts.eval_files]
    seen = set()
    for f in files:
        key = identity(f.path)
        if key in seen:
            raise ConfigError(f"{f.path}: given twice")
        seen.add(key)
    out = Path(opts.out)
    output = OutputDir(
        out,
        "dataset",
        META_FILE,
        overwrite=opts.overwrite,
        inputs={
            flag: [p for p in paths if not is_stream(p)]
            for flag, paths in [("--input", opts.inputs), ("--eval-files", opts.eval_files)]
        },
    )
    output.check()  # every refusal of the output before the input is read
    try:
        for f in files:
            probe(fmt, f)
        check_space(fmt, files, output)

        # -- mapping loaded early (the output may replace the dataset it is read from)
        mapping: Mapping | None = None
        if opts.vocab_from:
            mapping = load_mapping(opts.vocab_from, fmt)
        with output:  # locked (one writer per output) and staged beside it until complete
            return _convert(fmt, opts, files, output, mapping, split, workers, t0)
    finally:
        for f in files:
            f.close()


def _convert(fmt, opts, files, output, mapping, split, workers, t0) -> Result:
    """The count (``0 < --split < 1``; a stream's text kept for the passes after it),
    then :func:`_passes`."""
    out = output.target

    inputs = [f for f in files if f.role == "input"]
    n_train: int | None = None  # global data-line index bound of "train" among the inputs
    kept: Path | None = None  # streams' text, when they must be read twice
    try:
        if split is not None and inputs:
            if split >= 1.0:
                n_train = None  # all train
            elif split <= 0.0:
                n_train = 0
            else:
                bar = _progress(opts, _total(inputs), "counting lines")
                with bar:
                    for f in inputs:
                        if f.stream is not None:  # read once, kept to be read again
                            if kept is None:
                                out.parent.mkdir(parents=True, exist_ok=True)
                                # named as the Spill's, so a run killed here is cleaned up alike
                                prefix = f".{out.name}.spill-{os.getpid()}-"
                                kept = Path(tempfile.mkdtemp(prefix=prefix, dir=out.parent))
                            f.lines = spool(f, kept, opts.block_bytes, bar)
                        else:
                            f.lines = count_data_lines(f, opts.block_bytes, bar)
                total = sum(f.lines or 0 for f in inputs)
                n_train = math.floor(Fraction(str(split)) * total)
        return _passes(fmt, opts, files, output, mapping, split, workers, t0, inputs, n_train)
    finally:
        if kept is not None:
            shutil.rmtree(kept, ignore_errors=True)


def _passes(fmt, opts, files, output, mapping, split, workers, t0, inputs, n_train) -> Result:
    """Passes 1 (vocabulary mode) and 2 into the staging folder of ``output``."""
    out = output.target

    bad = BadLines(opts.on_error)
    stop = opts.on_error == "fail"
    keyed = fmt.key_features + fmt.seq_features
    if mapping is None and opts.max_rows_per_table is not None:
        mapping = HashMapping(keyed, opts.max_rows_per_table)

    def parse(b: Block) -> Parsed:
        assert b.file.layout is not None  # every input was probed first
        raw, bad_lines = fmt.parse_block(b.data, b.nlines, b.file.layout, stop)
        return Parsed(raw, fmt.transform_dense(raw.dense), bad_lines)

    def blocks(which: list[InputFile]) -> Iterator[Block]:
        """Blocks of ``which`` in order; line counts are taken here (not by the consumer,
        which lags behind), so ``global_start`` is right for every block."""
        start = 0
        for f in which:
            n = 0
            for b in iter_blocks(f, opts.block_bytes):
                b.global_start = start + b.first_index
                n += b.nlines
                yield b
            f.lines = n
            if f.role == "input":
                start += n

    def is_train(b: Block, rows: np.ndarray) -> np.ndarray | bool:
        """Which rows of an --input block go to train (True/False for all of them)."""
        if n_train is None:
            return True
        if len(rows) == 0:
            return False
        g0 = b.global_start + int(rows[0])
        g1 = b.global_start + int(rows[-1])
        if g1 < n_train:
            return True
        if g0 >= n_train:
            return False
        return (b.global_start + rows) < n_train

    # -- pass 1 (vocabulary mode): parse the --input files, count the train lines' keys,
    # keep the parsed blocks in a spill so pass 2 does not parse them again.
    spill: Spill | None = None
    try:
        if mapping is None:
            min_count = opts.min_count if opts.min_count is not None else 1
            if not inputs or n_train == 0:
                raise _no_train_lines(opts, inputs, split, parse)
            counters = {n: KeyCounter() for n in keyed}
            spill = Spill(out)

            def count_block(b: Block):
                p = parse(b)
                train = is_train(b, p.raw.rows)
                raw = p.raw if train is True else p.raw.take(train) if train is not False else None
                counts = []
                if raw is not None:
                    counts = [KeyCounter.count(k) for k in raw.keys]
                    counts += [KeyCounter.count(v) for v, _ in raw.seqs]
                return p, counts

            bar = _progress(opts, _total(inputs), "vocabulary")
            lines_done = 0
            with bar:
                for b, (p, counts) in _pipelined(blocks(inputs), count_block, workers):
                    bad.report(b, p.bad)
                    for name, (v, c) in zip(keyed, counts):
                        counters[name].add(v, c)
                    spill.put(b, p)
                    lines_done += b.nlines
                    bar.update(b.disk_bytes)
                    bar.set_postfix_str(f"{lines_done:,} lines", refresh=False)
            with ThreadPoolExecutor(max_workers=workers) as ex:
                results = dict(zip(keyed, ex.map(lambda n: counters[n].result(), keyed)))
            keys = {n: r[0] for n, r in results.items()}
            counts_ = {n: r[1] for n, r in results.items()}
            mapping = Vocabulary(keys, counts_, min_count, workers)
        return _write(
            fmt, opts, output, files, mapping, spill, bad, parse, blocks, is_train, workers, split, n_train, t0
        )
    finally:
        if spill is not None:
            spill.remove()


def _no_train_lines(opts, inputs, split, parse) -> BagpipeError:
    """Why vocabulary mode has no train line. Too few --input lines for a fractional
    --split to send one to train: the first bad line of the first block when there is one
    (a file in another format, whose lines would all be refused), else that the lines are
    too few; otherwise the options send none (``--split 0``, only --eval-files)."""
    if inputs and split is not None and 0 < split < 1:
        if opts.on_error == "fail":
            for b in iter_blocks(inputs[0], opts.block_bytes):
                bad = parse(b).bad
                if bad:
                    return ParseError(b.file.path, b.first_line + bad[0][0], bad[0][1])
                break
        lines = sum(f.lines or 0 for f in inputs)
        return DataError(
            f"--input {' '.join(f.path for f in inputs)}: {lines} data line{'' if lines == 1 else 's'}, too few to "
            f"split: --split {split} sends none of them to train, where the vocabulary comes from; give more lines, "
            "--split 1, --vocab-from DIR or --max-rows-per-table N"
        )
    return ConfigError(
        "vocabulary mode needs train lines: give --input files that go to train, "
        "--vocab-from DIR or --max-rows-per-table N"
    )


def inputs_of(files: list[InputFile]) -> list[InputFile]:
    return [f for f in files if f.role == "input"]


def _say_empty_splits(inputs, split, n_train, rows_per_split, bad) -> None:
    """Say (one line each) a split that --split sent lines of --input to but that got none:
    every one of them was bad and skipped (``--on-error skip``)."""
    if split is None or not inputs:
        return
    total = sum(f.lines or 0 for f in inputs)
    sent = {"train": total if n_train is None else n_train, "eval": 0 if n_train is None else total - n_train}
    for name, lines in sent.items():
        if lines > 0 and not rows_per_split.get(name):
            where = "first" if name == "train" else "last"
            log.warning(
                f"the {name} split is empty: --split {split} sends the {where} {lines:,} line"
                f"{'' if lines == 1 else 's'} of --input to it and every one was bad (skipped, --on-error skip; "
                f"{bad.count:,} skipped in all, e.g. {bad.examples[0] if bad.examples else '?'})"
                + ("; a run on this data set reports no eval metrics" if name == "eval" else "")
            )


def _write(
    fmt, opts, output, files, mapping, spill, bad, parse, blocks, is_train, workers, split, n_train, t0
) -> Result:
    """Pass 2: map categorical keys to ids and append every valid line to its split."""
    features = []
    fixed_rows = dict(fmt.fixed_features)
    for name in fmt.feature_order:
        if name in fixed_rows:
            features.append(FeatureSpec(name, fixed_rows[name]))
        else:
            features.append(FeatureSpec(name, mapping.num_rows(name), multi_hot=name in fmt.seq_features))
    id_dtype = "int32" if max(f.num_rows for f in features) <= np.iinfo(np.int32).max else "int64"
    writer = ShardWriter(output, fmt.dense_names, features, id_dtype=id_dtype, rows_per_shard=opts.rows_per_shard)
    save_mapping(writer.dir, fmt, mapping)
    writer.record_files(VOCAB_DIR)  # the vocabulary's sums in meta.json: part of the data set's fingerprint

    def work(item):
        kind, b, index = item
        p = spill.load(index) if kind == "spill" else parse(b)
        raw = p.raw
        ids, multihot = map_ids(fmt, mapping, raw)  # ids feature-major, like raw.keys
        sparse = np.empty((len(raw), ids.shape[0]), dtype=id_dtype)
        sparse[:] = ids.T
        return raw.rows, raw.labels, p.dense, sparse, multihot, p.bad

    def items():
        if spill is not None:
            spill.finish_writing()
            for rec, index, text in spill.records:
                rec.data_len = text
                yield "spill", rec, index
            for b in blocks([f for f in files if f.role != "input"]):
                yield "parse", b, None
        else:
            for b in blocks(files):
                yield "parse", b, None

    rows_per_split: dict[str, int] = {}
    text_bytes = 0
    lines_done = 0
    bar = _progress(opts, _total(files), "writing shards")
    with bar:
        for (kind, b, _), (rows, labels, dense, sparse, multihot, bad_lines) in _pipelined(items(), work, workers):
            if kind == "parse":
                bad.report(b, bad_lines)
                nbytes = len(b.data)
            else:
                nbytes = b.data_len
            lines_done += b.nlines
            b.file.text_bytes += nbytes
            text_bytes += nbytes
            if b.file.role == "input":
                train = is_train(b, rows)
                if train is True:
                    parts = [("train", None)]
                elif train is False:
                    parts = [("eval", None)]
                else:
                    parts = [("train", train), ("eval", ~train)]
            else:
                parts = [(b.file.role, None)]
            for split_name, mask in parts:
                if mask is None:
                    sel = (labels, dense, sparse, multihot)
                else:
                    mh = {}
                    for name, (v, lengths) in multihot.items():
                        owner = np.repeat(np.arange(len(lengths)), lengths)
                        mh[name] = (v[mask[owner]], lengths[mask])
                    sel = (labels[mask], dense[mask], sparse[mask], mh)
                if len(sel[0]) == 0:
                    continue
                writer.append(split_name, *sel[:3], multihot=sel[3] or None)
                rows_per_split[split_name] = rows_per_split.get(split_name, 0) + len(sel[0])
            bar.update(b.disk_bytes)
            bar.set_postfix_str(f"{lines_done:,} lines", refresh=False)

    if not rows_per_split:
        raise DataError("no valid lines in the input (every line was bad)")
    _say_empty_splits(inputs_of(files), split, n_train, rows_per_split, bad)
    split_desc: dict
    if split is None:
        split_desc = {"mode": "all-test", "note": "unlabelled input: every line in split 'test', labels written as 0"}
    else:
        split_desc = {"train_fraction_of_inputs": split, "eval_files": list(opts.eval_files)}
        if n_train is not None:
            split_desc["train_lines"] = n_train
    source = {
        "tool": "bagpipe preprocess",
        "format": fmt.name,
        "inputs": [
            {"path": f.path, "role": f.role, "lines": f.lines, "bytes": f.size, "header": bool(f.layout.header_lines)}
            for f in files
        ],
        "split": split_desc,
        "labelled": opts.labelled,
        "categorical": {**mapping.describe(), "key": fmt.key_kind, "vocab_from": opts.vocab_from},
        "dense": "log(1 + max(x, 0)); missing = 0",
        "on_error": opts.on_error,
        "skipped_lines": bad.count,
        "skipped_examples": bad.examples,
        "rows": dict(sorted(rows_per_split.items())),
    }
    meta = writer.close(source=source)
    seconds = time.perf_counter() - t0
    return Result(
        out=str(output.target),
        rows={k: meta.num_samples(k) for k in ("train", "eval", "test") if k in meta.splits},
        skipped=bad.count,
        bad_examples=bad.examples,
        num_tables=meta.num_features,
        total_rows=meta.total_rows,
        mapping=mapping.describe(),
        text_bytes=text_bytes,
        seconds=seconds,
    )
