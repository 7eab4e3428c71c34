"""Checks that a data set's files are what its meta.json says, before training reads them.

Three levels, from cheap to complete:

* :func:`shard_file_problems` reads only the ``.npy`` headers of one shard (a few hundred
  bytes per file): every file exists, has the dtype and shape meta.json implies, and
  is as long as its header says (a truncated file is found here, not as a failed
  memory map mid-run). :class:`bagpipe.data.shards.Dataset` runs it on every shard
  when it opens a data set.
* :func:`id_problem` checks the ids of a block of samples with one vectorised min/max
  per feature: each must be in [0, table rows). The batch stream runs it the first
  time it reads a block, so a bad id is named (file, samples, feature) instead of
  failing as an ``IndexError`` in an embedding lookup.
* :func:`values_problem` checks a shard's labels are 0 or 1 and its dense values
  finite (vectorised, a block at a time). :class:`bagpipe.data.shards.Dataset` runs it
  once per shard, the first time the shard is read, so one NaN or a label of 5 stops a
  run naming the file and the samples instead of training to NaN parameters.
* :func:`sum_problems` checks a shard's files against the size and CRC-32 meta.json
  recorded for each when the data set was written (its ``files``; a data set written
  before there were sums has none and is checked by size only, as above). A changed
  byte anywhere -- a flipped bit in a dense value, which no other check sees -- is named
  in one line: the file, what meta.json expects, what was found.
  :class:`bagpipe.data.shards.Dataset` runs it once per shard, the first time the shard
  is read (see docs/data.md for the cost and why not at every start).
* :func:`check_dataset` (``bagpipe check DATA``) runs all of them over every file and
  reports per file.

A table larger than its ids is fine: only ids >= rows are errors.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bagpipe.data.schema import DatasetMeta
from bagpipe.filesums import FileSum, crc_hex, file_crc

_ID_DTYPES = ("int32", "int64")


def npy_header(path: Path) -> tuple[tuple, np.dtype, int]:
    """(shape, dtype, data offset) of a ``.npy`` file, reading only its header."""
    with open(path, "rb") as f:
        major, _ = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _fortran, dtype = read(f)  # either order memory-maps (sample slices are faster in C order)
        return tuple(shape), np.dtype(dtype), f.tell()


def _file_problem(path: Path, shape: tuple, dtype: str | None) -> str | None:
    """What is wrong with one ``.npy`` file (None when nothing); ``None`` in ``shape``
    matches any length, ``dtype`` None any of the id dtypes."""
    if not path.exists():
        return f"{path}: missing"
    try:
        got_shape, got_dtype, offset = npy_header(path)
    except (ValueError, OSError, EOFError) as e:
        return f"{path}: not a readable .npy file ({e})"
    if dtype is not None and got_dtype != np.dtype(dtype):
        return f"{path}: dtype {got_dtype}, expected {dtype}"
    if dtype is None and got_dtype.name not in _ID_DTYPES:
        return f"{path}: dtype {got_dtype}, expected int32 or int64 ids"
    if len(got_shape) != len(shape) or any(w is not None and w != g for w, g in zip(shape, got_shape)):
        want = "(" + ", ".join("?" if w is None else str(w) for w in shape) + ")"
        return f"{path}: shape {got_shape}, meta.json implies {want}"
    need = offset + int(np.prod(got_shape)) * got_dtype.itemsize
    have = path.stat().st_size
    if have < need:
        return f"{path}: truncated ({have:,} bytes, its header needs {need:,})"
    return None


def shard_dir(root: Path, split: str, index: int) -> Path:
    return Path(root) / split / f"{index:05d}"


def shard_file_problems(root: Path, meta: DatasetMeta, split: str, index: int) -> list[str]:
    """Header-level problems of one shard's files (an empty list when it is sound)."""
    d = shard_dir(root, split, index)
    n = meta.splits[split].shard_sizes[index]
    one_hot = len(meta.features) - len(meta.multihot_features)
    problems = [
        _file_problem(d / "labels.npy", (n,), "float32"),
        _file_problem(d / "dense.npy", (n, meta.num_dense), "float32"),
        _file_problem(d / "sparse.npy", (n, one_hot), meta.id_dtype),
    ]
    for f in meta.multihot_features:
        offsets = d / f"{f.name}.offsets.npy"
        problem = _file_problem(offsets, (n + 1,), "int64")
        problems.append(problem)
        nnz = None
        if problem is None:
            nnz = int(np.load(offsets, mmap_mode="r")[-1])
        problems.append(_file_problem(d / f"{f.name}.values.npy", (nnz,), meta.id_dtype))
    return [p for p in problems if p is not None]


def shard_files(meta: DatasetMeta, split: str, index: int) -> list[str]:
    """The files of one shard, relative to the data set (the keys of meta.json's ``files``)."""
    names = ["labels.npy", "dense.npy", "sparse.npy"]
    for f in meta.multihot_features:
        names += [f"{f.name}.offsets.npy", f"{f.name}.values.npy"]
    return [f"{split}/{index:05d}/{n}" for n in names]


def sum_problem(path: Path, expected: FileSum) -> str | None:
    """One file against the size and CRC-32 meta.json recorded (None when they agree)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path}: missing"
    what = "damaged data set file: meta.json expects"
    if size != expected.bytes:
        how = "truncated" if size < expected.bytes else "longer than written"
        return f"{path}: {what} {expected.bytes:,} bytes, found {size:,} ({how})"
    found = crc_hex(file_crc(path))
    if found != expected.crc32:
        return (
            f"{path}: {what} CRC-32 {expected.crc32}, found {found} (its bytes changed since the data set was written)"
        )
    return None


def sum_problems(root: Path, meta: DatasetMeta, split: str, index: int) -> list[str]:
    """Every file of one shard against its recorded size and CRC-32; an empty list when
    they agree or the data set has no sums (written before there were any)."""
    if not meta.files:
        return []
    out = []
    for rel in shard_files(meta, split, index):
        if rel not in meta.files:
            out.append(f"{Path(root) / rel}: not in meta.json's files (the shard and meta.json do not belong together)")
            continue
        p = sum_problem(Path(root) / rel, meta.files[rel])
        if p:
            out.append(p)
    return out


def id_problem(meta: DatasetMeta, where: str, sparse: np.ndarray, multihot: dict[str, np.ndarray]) -> str | None:
    """The first id of a block outside its table, as a message naming ``where`` and the
    feature (None when all are in range). ``sparse`` (n, F1) holds the one-hot features
    in schema order; ``multihot`` maps a multi-hot feature to its values."""
    one_hot = [f for f in meta.features if not f.multi_hot]
    if len(sparse) and one_hot:
        lo, hi = sparse.min(axis=0), sparse.max(axis=0)
        for j, f in enumerate(one_hot):
            if lo[j] < 0 or hi[j] >= f.num_rows:
                bad = int(lo[j]) if lo[j] < 0 else int(hi[j])
                return f"{where}: feature {f.name!r} has id {bad}, outside its table of {f.num_rows:,} rows"
    for name, values in multihot.items():
        rows = next(f.num_rows for f in meta.features if f.name == name)
        if len(values) and (values.min() < 0 or values.max() >= rows):
            bad = int(values.min()) if values.min() < 0 else int(values.max())
            return f"{where}: feature {name!r} has id {bad}, outside its table of {rows:,} rows"
    return None


def fingerprint(root: Path, meta: DatasetMeta) -> str:
    """sha256 of meta.json (its schema, splits, provenance without input paths, and the
    files' sums where it has them: the shards' and, from ``preprocess``, the vocabulary's)
    and the byte size of every shard file: a data set
    moved elsewhere keeps it, one rebuilt differently does not. A data set written
    before there were sums has no ``files`` in meta.json and keeps the fingerprint it
    always had (a run trained on it still resumes)."""
    d = meta.to_json()
    src = dict(d.get("source", {}))
    if isinstance(src.get("inputs"), list):
        src["inputs"] = [{k: v for k, v in i.items() if k != "path"} for i in src["inputs"] if isinstance(i, dict)]
    d["source"] = src
    h = hashlib.sha256(json.dumps(d, sort_keys=True, allow_nan=False).encode())
    for split in sorted(meta.splits):
        for i in range(len(meta.splits[split].shard_sizes)):
            sd = shard_dir(root, split, i)
            for p in sorted(sd.glob("*.npy")):
                h.update(f"{split}/{i}/{p.name}:{p.stat().st_size};".encode())
    return h.hexdigest()


@dataclass
class FileReport:
    """``bagpipe check``'s verdict on one shard."""

    shard: str
    samples: int
    problems: list[str] = field(default_factory=list)
    files: int = 0
    """Files checked when this is not a shard (the vocabulary: ``samples`` is 0)."""


def check_dataset(root: str | os.PathLike, block: int = 1 << 16, progress: bool = True) -> list[FileReport]:
    """Every check on every shard of the data set at ``root`` (meta.json must load)."""
    from tqdm import tqdm

    root = Path(root)
    meta = DatasetMeta.load(root)
    shards = [(s, i, n) for s in sorted(meta.splits) for i, n in enumerate(meta.splits[s].shard_sizes)]
    reports = []
    for split, i, n in tqdm(
        shards, desc="checking shards", unit="shard", disable=None if progress else True
    ):  # None: on a terminal only
        d = shard_dir(root, split, i)
        rep = FileReport(str(d.relative_to(root)), n, shard_file_problems(root, meta, split, i))
        if not rep.problems:
            rep.problems += sum_problems(root, meta, split, i)
        if not rep.problems:
            rep.problems += _content_problems(d, meta, n, block)
        reports.append(rep)
    others = sorted(rel for rel in meta.files if not rel.startswith(tuple(f"{s}/" for s in meta.splits)))
    if others:  # the vocabulary (preprocess records its files' sums too)
        problems = [p for p in (sum_problem(root / rel, meta.files[rel]) for rel in others) if p]
        reports.append(FileReport(str(Path(others[0]).parent), 0, problems, files=len(others)))
    return reports


def _content_problems(d: Path, meta: DatasetMeta, n: int, block: int) -> list[str]:
    labels = np.load(d / "labels.npy", mmap_mode="r")
    dense = np.load(d / "dense.npy", mmap_mode="r")
    sparse = np.load(d / "sparse.npy", mmap_mode="r")
    mh = {
        f.name: (
            np.load(d / f"{f.name}.values.npy", mmap_mode="r"),
            np.load(d / f"{f.name}.offsets.npy", mmap_mode="r"),
        )
        for f in meta.multihot_features
    }
    out = []
    for a in range(0, n, block):
        b = min(n, a + block)
        where = f"{d / 'sparse.npy'}: samples {a}..{b - 1}"
        values = {k: np.asarray(v[o[a] : o[b]]) for k, (v, o) in mh.items()}
        p = id_problem(meta, where, np.asarray(sparse[a:b]), values)
        if p:
            out.append(p)
        p = values_problem(d, labels, dense, a, b)
        if p:
            out.append(p)
    return out


VALUES_BLOCK = 1 << 18  # samples checked at a time (bounds the temporary arrays)


def values_problem(
    d: Path, labels: np.ndarray, dense: np.ndarray, start: int = 0, stop: int | None = None
) -> str | None:
    """The first problem of samples [start, stop) of a shard's labels (n,) and dense
    values (n, Dd): a label other than 0 or 1, a NaN or infinite dense value (None when
    there is none)."""
    stop = len(labels) if stop is None else stop
    for a in range(start, stop, VALUES_BLOCK):
        b = min(stop, a + VALUES_BLOCK)
        lab = np.asarray(labels[a:b])
        bad = np.flatnonzero((lab != 0) & (lab != 1))
        if len(bad):
            return f"{d / 'labels.npy'}: samples {a}..{b - 1}: labels other than 0 and 1 (sample {a + int(bad[0])}: {float(lab[bad[0]])!r})"
        dense_ab = np.asarray(dense[a:b])
        if not np.isfinite(dense_ab).all():
            first = a + int(np.flatnonzero(~np.isfinite(dense_ab).all(axis=1))[0])
            return f"{d / 'dense.npy'}: samples {a}..{b - 1}: NaN or infinite values (sample {first})"
    return None
