"""The dataset schema stored in ``meta.json``.

A dataset is a directory::

    DIR/meta.json                      written last, atomically: its presence means "complete"
    DIR/<split>/<shard:05d>/labels.npy float32 (n,)
    DIR/<split>/<shard:05d>/dense.npy  float32 (n, Dd)
    DIR/<split>/<shard:05d>/sparse.npy int32|int64 (n, F1), the one-hot features in schema order
    DIR/<split>/<shard:05d>/<name>.values.npy / <name>.offsets.npy
                                       a multi-hot feature: ids (nnz,) and offsets (n + 1,) int64

``meta.json``'s ``files`` maps every shard file (``<split>/<shard:05d>/<name>.npy``) to its
size and CRC-32 (``{"bytes": .., "crc32": ".."}``), summed as the writer wrote it; a data
set written before there were sums has no ``files`` and is checked by size only
(:mod:`bagpipe.data.integrity`).

``meta_crc32`` is the CRC-32 of meta.json's own canonical content
(:func:`bagpipe.filesums.seal`): an edit that keeps valid JSON (a table's ``num_rows``
grown, a shard size changed) is a damaged meta.json, not a different data set read
silently. The rule (format version 2 added it): a meta.json that carries ``meta_crc32``
is checked against it first, whatever its version; a version-2 meta.json must carry it;
version 1, written before, carries none and is read as before (its shard files' sums, if
it has them, are still checked). An older bagpipe refuses a version-2 data set in one
line (it reads version 1).

Every categorical feature has its own table; ``FeatureSpec.num_rows`` is that table's
size and ids are in ``[0, num_rows)``. Splits (``train``, ``eval``) share the tables.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bagpipe.errors import DataError
from bagpipe.files import atomic_write_text
from bagpipe.filesums import FileSum, seal, sealed_problem

FORMAT_VERSION = 2
READS = (1, 2)  # format versions this bagpipe reads
SEALED = 2  # the first version whose meta.json must carry the CRC-32 of its content
META_FILE = "meta.json"
META_SUM = "meta_crc32"  # the key of that CRC-32


@dataclass
class FeatureSpec:
    """One categorical feature and its embedding table."""

    name: str
    num_rows: int
    multi_hot: bool = False

    def __post_init__(self) -> None:
        if self.num_rows <= 0:
            raise DataError(f"feature {self.name!r}: num_rows must be > 0, got {self.num_rows}")


@dataclass
class SplitMeta:
    """Sample counts of one split, one entry per shard."""

    shard_sizes: list[int] = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        return int(sum(self.shard_sizes))


@dataclass
class DatasetMeta:
    """Everything a reader needs to interpret the shards."""

    dense_names: list[str]
    features: list[FeatureSpec]
    splits: dict[str, SplitMeta]
    id_dtype: str = "int64"
    format_version: int = FORMAT_VERSION
    source: dict = field(default_factory=dict)
    files: dict[str, FileSum] = field(default_factory=dict)  # shard file (relative path) -> its sum

    @property
    def num_dense(self) -> int:
        return len(self.dense_names)

    @property
    def num_features(self) -> int:
        return len(self.features)

    @property
    def table_sizes(self) -> list[int]:
        return [f.num_rows for f in self.features]

    @property
    def total_rows(self) -> int:
        return int(sum(self.table_sizes))

    @property
    def multihot_features(self) -> list[FeatureSpec]:
        return [f for f in self.features if f.multi_hot]

    def num_samples(self, split: str = "train") -> int:
        return self.split(split).num_samples

    def split(self, name: str) -> SplitMeta:
        if name not in self.splits:
            raise DataError(f"dataset has no split {name!r} (it has: {', '.join(sorted(self.splits))})")
        return self.splits[name]

    def to_json(self) -> dict:
        d = asdict(self)
        if self.files:
            d["files"] = {k: FileSum.of(v).to_json() for k, v in sorted(self.files.items())}
        else:  # a data set without sums keeps the meta.json (and fingerprint) it always had
            del d["files"]
        for name, sm in self.splits.items():
            d["splits"][name]["num_samples"] = sm.num_samples
        return d

    @classmethod
    def from_json(cls, d: dict) -> DatasetMeta:
        version = d.get("format_version")
        problem = sealed_problem(d, META_SUM, "format_version", SEALED)
        if problem is not None:
            raise DataError(f"damaged data set file: {problem}; rebuild the data set or restore its {META_FILE}")
        if version not in READS:
            raise DataError(
                f"unsupported dataset format_version {version!r} (this bagpipe reads {', '.join(map(str, READS))})"
            )
        splits = {k: SplitMeta(shard_sizes=[int(x) for x in v["shard_sizes"]]) for k, v in d["splits"].items()}
        for name, sm in splits.items():
            said = d["splits"][name].get("num_samples")
            if said is not None and said != sm.num_samples:  # written from shard_sizes: one was edited
                raise DataError(
                    f"splits.{name}.num_samples is {said!r} but its shard_sizes add up to {sm.num_samples:,} "
                    "(the file was edited or damaged; rebuild the data set or restore its meta.json)"
                )
        return cls(
            dense_names=list(d["dense_names"]),
            features=[FeatureSpec(**f) for f in d["features"]],
            splits=splits,
            id_dtype=d.get("id_dtype", "int64"),
            format_version=version,
            source=dict(d.get("source", {})),
            files=_file_sums(d.get("files")),
        )

    def save(self, directory: str | os.PathLike) -> None:
        """Write ``meta.json`` atomically (temp file, fsync, rename), with the CRC-32 of its content."""
        text = json.dumps(seal(self.to_json(), META_SUM), indent=2, sort_keys=True, allow_nan=False)
        atomic_write_text(Path(directory) / META_FILE, text)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> DatasetMeta:
        path = Path(directory) / META_FILE
        if Path(directory).exists() and not Path(directory).is_dir():
            raise DataError(
                f"{directory}: a file, not a dataset directory (raw logs become one with `bagpipe preprocess`)"
            )
        if not Path(directory).is_dir():
            raise DataError(f"{directory}: no such dataset directory")
        if not path.exists():
            raise DataError(f"{path}: missing; {directory} is not a finished bagpipe dataset")
        try:
            return cls.from_json(read_json(path))
        except DataError as e:
            if str(e).startswith(str(path)):
                raise
            raise DataError(f"{path}: {e}") from None


def _file_sums(d) -> dict[str, FileSum]:
    if d is None:
        return {}
    try:
        return {str(k): FileSum.of(v) for k, v in d.items()}
    except (AttributeError, KeyError, TypeError, ValueError):
        raise DataError(
            f"{META_FILE}: 'files' is not a map of file -> {{bytes, crc32}} (a damaged meta.json)"
        ) from None


def read_json(path: str | os.PathLike):
    """Parse a JSON file; a syntax error becomes a DataError naming file and line, a
    file that is missing, unreadable or not UTF-8 text one naming the file."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text (a damaged or foreign file)") from None
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror})") from None
