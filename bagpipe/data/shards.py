"""Writing and reading the binary shard format (see :mod:`bagpipe.data.schema`)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bagpipe.data.integrity import fingerprint, id_problem, shard_file_problems, sum_problems, values_problem
from bagpipe.data.schema import META_FILE, DatasetMeta, FeatureSpec, SplitMeta
from bagpipe.errors import DataError
from bagpipe.filesums import FileSum, SummingFile, crc_hex, file_crc
from bagpipe.output_dir import OutputDir

DEFAULT_ROWS_PER_SHARD = 1 << 18


class ShardWriter:
    """Accumulates samples per split and writes fixed-size shards as they fill.

    Everything is written into a staging folder beside ``out``
    (:class:`bagpipe.output_dir.OutputDir`): :meth:`close` writes ``meta.json`` after
    every shard, then swaps the finished dataset in, so ``out`` holds the old dataset
    (or nothing) until the new one is complete; a failure, Ctrl-C or crash before then
    leaves ``out`` as it was (:meth:`abort` removes the staging folder; a crash's is
    removed by the next writer). A dataset already in ``out`` is replaced only with
    ``overwrite``, and only when every file there is the dataset's; ``inputs`` (flag ->
    paths the command reads) may not lie inside ``out``. Files that belong with the
    dataset (a vocabulary) go into :attr:`dir`.

    Example::

        w = ShardWriter(out, dense_names, features, overwrite=True)
        w.append("train", labels, dense, sparse, multihot={"seq": (values, lengths)})
        w.close(source={"tool": "synth"})
    """

    def __init__(
        self,
        out: str | os.PathLike | OutputDir,
        dense_names: list[str],
        features: list[FeatureSpec],
        *,
        id_dtype: str = "int64",
        rows_per_shard: int = DEFAULT_ROWS_PER_SHARD,
        overwrite: bool = False,
        inputs: dict | None = None,
    ):
        if rows_per_shard <= 0:
            raise DataError("rows_per_shard must be > 0")
        if id_dtype not in ("int32", "int64"):
            raise DataError(f"id_dtype must be int32 or int64, got {id_dtype!r}")
        too_big = [f.name for f in features if id_dtype == "int32" and f.num_rows > (1 << 31)]
        if too_big:
            raise DataError(f"feature(s) {', '.join(too_big)} have more than 2^31 rows; use id_dtype int64")
        if isinstance(out, OutputDir):  # opened already by a command that locks its output early
            self.output = out
        else:
            self.output = OutputDir(out, "dataset", META_FILE, overwrite=overwrite, inputs=inputs)
        self.target = self.output.target
        self.out = self.dir = self.output.staging or self.output.open()  # the staging folder, swapped in by close()
        self.dense_names = list(dense_names)
        self.features = list(features)
        self.id_dtype = np.dtype(id_dtype)
        self.rows_per_shard = rows_per_shard
        self._pending: dict[str, list[dict]] = {}
        self._pending_rows: dict[str, int] = {}
        self._splits: dict[str, SplitMeta] = {}
        self._sums: dict[str, FileSum] = {}
        self._closed = False
        self._onehot = [f for f in features if not f.multi_hot]
        self._multihot = [f for f in features if f.multi_hot]

    def append(
        self,
        split: str,
        labels: np.ndarray,
        dense: np.ndarray,
        sparse: np.ndarray,
        multihot: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        """Add n samples to ``split``.

        labels (n,), dense (n, Dd), sparse (n, F1) ids of the one-hot features in
        schema order, multihot: name -> (values (nnz,), lengths (n,)).
        """
        n = len(labels)
        dense = np.asarray(dense, dtype=np.float32).reshape(n, len(self.dense_names))
        sparse = np.asarray(sparse).reshape(n, len(self._onehot))
        multihot = multihot or {}
        if set(multihot) != {f.name for f in self._multihot}:
            raise DataError(f"multihot features given {sorted(multihot)} != schema {[f.name for f in self._multihot]}")
        for j, f in enumerate(self._onehot):
            col = sparse[:, j]
            if n and (col.min() < 0 or col.max() >= f.num_rows):
                raise DataError(f"feature {f.name!r}: ids outside [0, {f.num_rows})")
        chunk: dict[str, Any] = {
            "labels": np.asarray(labels, dtype=np.float32),
            "dense": dense,
            "sparse": sparse.astype(self.id_dtype, copy=False),
        }
        for f in self._multihot:
            values, lengths = multihot[f.name]
            values = np.asarray(values).astype(self.id_dtype, copy=False)
            lengths = np.asarray(lengths, dtype=np.int64)
            if len(lengths) != n or lengths.sum() != len(values):
                raise DataError(f"feature {f.name!r}: lengths do not match values / sample count")
            if len(values) and (values.min() < 0 or values.max() >= f.num_rows):
                raise DataError(f"feature {f.name!r}: ids outside [0, {f.num_rows})")
            chunk[f.name] = (values, lengths)
        self._pending.setdefault(split, []).append(chunk)
        self._pending_rows[split] = self._pending_rows.get(split, 0) + n
        self._splits.setdefault(split, SplitMeta())
        while self._pending_rows[split] >= self.rows_per_shard:
            self._flush(split, self.rows_per_shard)

    def _take(self, split: str, n: int) -> dict:
        """Remove exactly n samples from the front of the split's pending chunks."""
        out: dict[str, list] = {}
        need = n
        chunks = self._pending[split]
        while need > 0:
            c = chunks[0]
            m = len(c["labels"])
            k = min(m, need)
            head, tail = _split_chunk(c, k, self._multihot)
            for key, v in head.items():
                out.setdefault(key, []).append(v)
            if k == m:
                chunks.pop(0)
            else:
                chunks[0] = tail
            need -= k
        self._pending_rows[split] -= n
        merged: dict[str, Any] = {key: np.concatenate(out[key]) for key in ("labels", "dense", "sparse")}
        for f in self._multihot:
            parts = out[f.name]
            merged[f.name] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        return merged

    def _flush(self, split: str, n: int) -> None:
        data = self._take(split, n)
        sm = self._splits[split]
        shard_dir = self.out / split / f"{len(sm.shard_sizes):05d}"
        shard_dir.mkdir(parents=True, exist_ok=True)
        self._save(shard_dir, "labels.npy", data["labels"])
        self._save(shard_dir, "dense.npy", data["dense"])
        self._save(shard_dir, "sparse.npy", np.ascontiguousarray(data["sparse"]))  # rows of samples: C order
        for f in self._multihot:
            values, lengths = data[f.name]
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            self._save(shard_dir, f"{f.name}.values.npy", values)
            self._save(shard_dir, f"{f.name}.offsets.npy", offsets)
        sm.shard_sizes.append(n)

    def _save(self, shard_dir: Path, name: str, array: np.ndarray) -> None:
        """What ``np.save`` writes (a version 1.0 .npy file), through a :class:`SummingFile`:
        the file's size and CRC-32 for meta.json, summed as the bytes are written (no
        second read)."""
        a = np.ascontiguousarray(array)
        header = {"descr": np.lib.format.dtype_to_descr(a.dtype), "fortran_order": False, "shape": a.shape}
        with open(shard_dir / name, "wb") as raw:
            f = SummingFile(raw)
            np.lib.format.write_array_header_1_0(f, header)
            f.write(a.reshape(-1).view(np.uint8))  # the array's own bytes: no copy
        self._sums[(shard_dir / name).relative_to(self.out).as_posix()] = f.sum()

    def record_files(self, folder: str) -> None:
        """Record the size and CRC-32 of every file under ``folder`` (relative to the data
        set, already written: the vocabulary) in meta.json's sums, so the data set's
        fingerprint covers them and ``bagpipe check`` / ``export`` find a later change."""
        for p in sorted((self.out / folder).rglob("*")):
            if p.is_file():
                self._sums[p.relative_to(self.out).as_posix()] = FileSum(p.stat().st_size, crc_hex(file_crc(p)))

    def close(self, source: dict | None = None) -> DatasetMeta:
        """Write remaining samples and then meta.json, and swap the dataset in."""
        if self._closed:
            raise DataError("ShardWriter already closed")
        try:
            for split in list(self._pending):
                if self._pending_rows[split] > 0:
                    self._flush(split, self._pending_rows[split])
            meta = DatasetMeta(
                dense_names=self.dense_names,
                features=self.features,
                splits=self._splits,
                id_dtype=str(self.id_dtype),
                source=dict(source or {}),
                files=dict(self._sums),
            )
            if not self._splits or all(s.num_samples == 0 for s in self._splits.values()):
                raise DataError("no samples were written")
            meta.save(self.out)
            self.output.commit()
        finally:
            self._closed = True
            self.output.close()
        return meta

    def abort(self) -> None:
        """Give up: remove what was written; ``out`` stays as it was (idempotent)."""
        self._closed = True
        self.output.close()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self.abort()


def _split_chunk(c: dict, k: int, multihot: list[FeatureSpec]) -> tuple[dict, dict]:
    head = {key: c[key][:k] for key in ("labels", "dense", "sparse")}
    tail = {key: c[key][k:] for key in ("labels", "dense", "sparse")}
    for f in multihot:
        values, lengths = c[f.name]
        cut = int(lengths[:k].sum())
        head[f.name] = (values[:cut], lengths[:k])
        tail[f.name] = (values[cut:], lengths[k:])
    return head, tail


@dataclass
class _Shard:
    labels: np.ndarray
    dense: np.ndarray
    sparse: np.ndarray
    multihot: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (values, offsets)


class Dataset:
    """Read access to a finished dataset; shards are memory-mapped, never loaded whole.

    Opening checks every shard file's header against meta.json (a damaged or truncated
    file is a DataError naming it, here rather than mid-run); a shard's files against
    the sizes and CRC-32s meta.json recorded (where it has them), its labels (0 or 1)
    and dense values (finite) the first time it is read; the ids of a block against
    their tables the first time :meth:`check_block` sees it.
    """

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        self._stamp = self._meta_stamp()
        self.meta = DatasetMeta.load(self.dir)
        self._cache: dict[tuple[str, int], _Shard] = {}
        self._checked: set[tuple[str, int, int]] = set()
        for split, sm in self.meta.splits.items():
            for i in range(len(sm.shard_sizes)):
                problems = shard_file_problems(self.dir, self.meta, split, i)
                if problems:
                    raise DataError(f"{problems[0]} ({self.check_command} checks every file)")

    def _meta_stamp(self) -> tuple | None:
        try:
            st = (self.dir / META_FILE).stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _damaged(self, problem: str) -> DataError:
        """The error for a damaged file of this data set -- or, where its meta.json is not
        the one this object read, for a data set replaced while it was read (a
        ``synth``/``preprocess --overwrite`` of it: the run was told its file was damaged
        and ``bagpipe check`` found none; newcomer round 23)."""
        if self._meta_stamp() != self._stamp:
            return DataError(
                f"{self.dir} was replaced while this run read it (its {META_FILE} is not the one the run started "
                f"with: a synth or preprocess --overwrite of it, say); the run cannot go on with another data set: "
                f"train again on the new one, or keep data sets a run reads in place until it ends"
            )
        return DataError(f"{problem} ({self.check_command} checks every file)")

    @property
    def check_command(self) -> str:
        """The command that checks every file of this data set, quoted for a shell (a path
        with a space or a quote pastes as it is)."""
        return f"`bagpipe check {shlex.quote(str(self.dir))}`"

    def fingerprint(self) -> str:
        """What identifies this data set's contents (:func:`bagpipe.data.integrity.fingerprint`)."""
        return fingerprint(self.dir, self.meta)

    def check_block(self, split: str, index: int, start: int, stop: int) -> None:
        """Ids of samples [start, stop) of a shard within their tables, checked once per block."""
        key = (split, index, start)
        if key in self._checked:
            return
        sh = self.shard(split, index)
        values = {name: np.asarray(v[o[start] : o[stop]]) for name, (v, o) in sh.multihot.items()}
        where = f"{self.dir / split / f'{index:05d}' / 'sparse.npy'}: samples {start}..{stop - 1}"
        problem = id_problem(self.meta, where, np.asarray(sh.sparse[start:stop]), values)
        if problem:
            raise DataError(
                f"{problem}; the shard is damaged or belongs to another meta.json ({self.check_command} checks every file)"
            )
        self._checked.add(key)

    def has_split(self, split: str) -> bool:
        return split in self.meta.splits and self.meta.splits[split].num_samples > 0

    def shard(self, split: str, index: int) -> _Shard:
        key = (split, index)
        if key not in self._cache:
            d = self.dir / split / f"{index:05d}"
            try:
                mh = {
                    f.name: (
                        np.load(d / f"{f.name}.values.npy", mmap_mode="r"),
                        np.load(d / f"{f.name}.offsets.npy", mmap_mode="r"),
                    )
                    for f in self.meta.multihot_features
                }
                shard = _Shard(
                    labels=np.load(d / "labels.npy", mmap_mode="r"),
                    dense=np.load(d / "dense.npy", mmap_mode="r"),
                    sparse=np.load(d / "sparse.npy", mmap_mode="r"),
                    multihot=mh,
                )
            except FileNotFoundError as e:
                raise self._damaged(f"{d}: shard file missing ({Path(e.filename).name})") from None
            sums = sum_problems(self.dir, self.meta, split, index)
            if sums:
                raise self._damaged(sums[0])
            expected = self.meta.splits[split].shard_sizes[index]
            if len(shard.labels) != expected:
                raise DataError(f"{d}: holds {len(shard.labels)} samples, meta.json says {expected}")
            problem = values_problem(d, shard.labels, shard.dense)
            if problem:
                raise DataError(
                    f"{problem}; training on it would give NaN or meaningless parameters "
                    f"({self.check_command} lists every problem)"
                )
            self._cache[key] = shard
        return self._cache[key]

    def shard_sizes(self, split: str) -> list[int]:
        return self.meta.split(split).shard_sizes
