"""``bagpipe export``: a run's latest checkpoint -> a portable export directory.

Layout of ``OUT/`` (docs/export.md)::

    model.json                       what the export holds (written last: its presence
                                     means the export is complete): format version, the
                                     model's architecture, dense feature names, tables
                                     (name, rows, D, first global row, file, key),
                                     the dense naming, the training run, preprocessing
    dense.safetensors                the dense parameters (TorchRec names for DLRM,
                                     bagpipe's otherwise: :mod:`bagpipe.export.naming`)
    embeddings-00000-of-0000N.safetensors   the tables, whole tables per file, packed in
                                     table order up to --shard-mb (a larger table gets a
                                     file of its own)
    model.safetensors.index.json     {"metadata": {"total_size"}, "weight_map": {key: file}}
                                     (the Hugging Face convention for sharded files)
    vocab/                           the preprocessing vocabulary or hashing, copied from
                                     the dataset the run was trained on (when it has one)

The embedding rows stream from the checkpoint's memory-mapped parts (its chain) in
chunks of ``chunk_rows`` rows: no table is ever loaded whole. Optimizer state is not
exported (a model for scoring; resume from the run's checkpoint instead).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import zlib
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np

from bagpipe.checkpoint import latest
from bagpipe.data.schema import DatasetMeta
from bagpipe.errors import CheckpointError, ConfigError, DataError
from bagpipe.export import tensorfile
from bagpipe.export.naming import table_key, to_export
from bagpipe.files import atomic_write_text
from bagpipe.filesums import FileSum, crc_hex, file_crc, seal
from bagpipe.models import ModelConfig, build_model
from bagpipe.output_dir import OutputDir
from bagpipe.train.rundir import RunDir

log = logging.getLogger(__name__)

FORMAT = "bagpipe-export"
#: 2: model.json records every other file's size and CRC-32 (``files``) and its own
#: content's (``manifest_crc32``), checked before the export is read; 1 (no sums) still loads.
VERSION = 2
VERSIONS = (1, 2)
#: Version from which model.json must carry ``files`` and ``manifest_crc32``.
SUMMED = 2
MANIFEST_SUM = "manifest_crc32"
MANIFEST = "model.json"
INDEX = "model.safetensors.index.json"
DENSE_FILE = "dense.safetensors"
DEFAULT_SHARD_BYTES = 2 << 30
CHUNK_ROWS = 1 << 20


@dataclass
class Exported:
    """What :func:`export_run` wrote."""

    out: str
    step: int
    tables: int
    rows: int
    files: int
    naming: str
    vocab: bool

    def line(self) -> str:
        vocab = "with the preprocessing vocabulary" if self.vocab else "no preprocessing vocabulary (synthetic data)"
        return (
            f"exported step {self.step}: {self.tables} tables ({self.rows:,} rows) in {self.files} file(s), "
            f"dense layers with {self.naming} names, {vocab} -> {self.out}"
        )


def plan_shards(sizes: list[int], limit: int) -> list[list[int]]:
    """Tables (by index) per file: whole tables in order, a file closed before it would
    exceed ``limit`` bytes (a table larger than ``limit`` alone in its file)."""
    shards: list[list[int]] = []
    used = 0
    for i, n in enumerate(sizes):
        if not shards or (used + n > limit and shards[-1]):
            shards.append([])
            used = 0
        shards[-1].append(i)
        used += n
    return shards


def _prepare_out(out: Path, overwrite: bool) -> None:
    """An empty ``out``; an earlier export there is replaced only with ``overwrite``."""
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        if not (out / MANIFEST).exists():
            raise DataError(f"{out}: directory is not empty and holds no export; choose another --out")
        if not overwrite:
            raise DataError(f"{out}: already holds an export (pass --overwrite to replace it)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def export_run(
    run: str | Path,
    out: str | Path,
    *,
    data: str | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    chunk_rows: int = CHUNK_ROWS,
    overwrite: bool = False,
) -> Exported:
    """Export ``run``'s latest checkpoint into ``out`` (see the module docstring).

    ``data``: the dataset whose tables the run trained (default: the one in its
    config.json), for the table names, the dense feature names and the vocabulary.
    """
    run, out = Path(run), Path(out)
    if not RunDir(run).config_file.exists():
        raise ConfigError(f"{run}: not a bagpipe run directory (no config.json)")
    if shard_bytes <= 0 or chunk_rows <= 0:
        raise ConfigError(f"shard size and chunk rows must be > 0, got {shard_bytes} and {chunk_rows}")
    conf = RunDir(run).read_config()
    ckpt = latest(run)
    if ckpt is None:
        raise CheckpointError(f"{run}: the run has no checkpoint to export")
    data_dir = Path(data or conf["train"]["data"]["data"])
    if not (data_dir / "meta.json").exists():
        if data is None and not data_dir.is_absolute():  # config.json keeps --data as it was typed
            raise DataError(
                f"{data_dir}: the run's dataset (its --data, a path relative to the folder `bagpipe train` ran in) "
                f"is not found from {Path.cwd()}; run export from that folder, or give --data DIR, a dataset with "
                "the same tables"
            )
        raise DataError(
            f"{data_dir}: the run's dataset is not there (moved?); give --data DIR, a dataset with the same tables"
        )
    meta = DatasetMeta.load(data_dir)
    _same_data_set(run, conf, data_dir, meta)
    reader = ckpt.reader()
    if reader.num_rows != meta.total_rows:
        raise DataError(
            f"{data_dir} has {meta.total_rows:,} embedding rows but the run was trained with {reader.num_rows:,}"
        )
    try:
        mcfg = ModelConfig(**conf["model"])
        model = build_model(mcfg, meta.num_dense, meta.num_features)
        model.load_state_dict(ckpt.dense["model"])
    except (TypeError, KeyError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{ckpt.path}: does not fit the model of {run}/config.json and the tables of {data_dir} ({first})"
        ) from None
    output = OutputDir(out, "export", MANIFEST, overwrite=overwrite, inputs={"--run": [run], "--data": [data_dir]})
    with output as staging:  # built beside --out, swapped in whole: a failed export leaves the old one
        result = _write(run, staging, conf, mcfg, model, ckpt, reader, data_dir, meta, shard_bytes, chunk_rows)
        output.commit()
    return dataclasses.replace(result, out=str(out))


def _same_data_set(run: Path, conf: dict, data_dir: Path, meta: DatasetMeta) -> None:
    """Refuse, in one line, a data set other than the one ``run`` trained on (its
    fingerprint, which config.json records, as a resume compares it): its vocabulary
    would map raw lines to rows the run did not train for them. A run without the record
    (written before it was kept) is not checked."""
    from bagpipe.data.integrity import fingerprint

    was = (conf.get("dataset") or {}).get("fingerprint") if isinstance(conf.get("dataset"), dict) else None
    if not was:
        return
    now = fingerprint(data_dir, meta)
    if now != was:
        raise DataError(
            f"{data_dir}: not the data set {run} was trained on (fingerprint {str(was)[:12]}, this one's {now[:12]}); "
            "its vocabulary would map lines to rows the run did not learn for them: give --data the run's data set"
        )


def _write(
    run: Path,
    out: Path,
    conf: dict,
    mcfg: ModelConfig,
    model,
    ckpt,
    reader,
    data_dir: Path,
    meta: DatasetMeta,
    shard_bytes: int,
    chunk_rows: int,
) -> Exported:
    """Every file of the export into the (staging) folder ``out``."""
    dense, naming = to_export(model.state_dict(), mcfg, meta.num_dense, meta.num_features)
    sums: dict[str, FileSum] = {}  # every file of the export but model.json -> its size and CRC-32
    sums[DENSE_FILE] = tensorfile.write(
        out / DENSE_FILE,
        [tensorfile.Entry(k, tuple(v.shape), partial(_tensor_chunks, v)) for k, v in dense.items()],
        {"format": "pt", "producer": "bagpipe export", "naming": naming},
    )

    D = reader.dim
    offsets = np.concatenate([[0], np.cumsum(meta.table_sizes)]).astype(np.int64)

    def rows(lo: int, hi: int):
        for a in range(lo, hi, chunk_rows):
            yield reader.values(np.arange(a, min(a + chunk_rows, hi), dtype=np.int64))[0]

    shards = plan_shards([n * D * 4 for n in meta.table_sizes], shard_bytes)
    tables, weight_map = [], {k: DENSE_FILE for k in dense}
    for s, members in enumerate(shards):
        name = f"embeddings-{s:05d}-of-{len(shards):05d}.safetensors"
        entries = []
        for i in members:
            f = meta.features[i]
            lo, hi = int(offsets[i]), int(offsets[i + 1])
            entries.append(tensorfile.Entry(table_key(f.name), (f.num_rows, D), partial(rows, lo, hi)))
            tables.append(
                {
                    "name": f.name,
                    "num_embeddings": f.num_rows,
                    "embedding_dim": D,
                    "row_offset": lo,
                    "multi_hot": f.multi_hot,
                    "pooling": "sum",
                    "feature_names": [f.name],
                    "key": table_key(f.name),
                    "file": name,
                }
            )
            weight_map[table_key(f.name)] = name
        sums[name] = tensorfile.write(out / name, entries, {"format": "pt", "producer": "bagpipe export"})

    has_vocab = (data_dir / "vocab").is_dir()
    if has_vocab:
        shutil.copytree(data_dir / "vocab", out / "vocab")
        for p in sorted((out / "vocab").rglob("*")):
            if p.is_file():  # summed as copied into the export: a later change of either is found
                rel = p.relative_to(out).as_posix()
                sums[rel] = FileSum(p.stat().st_size, crc_hex(file_crc(p)))
                if rel in meta.files and FileSum.of(meta.files[rel]) != sums[rel]:
                    raise DataError(
                        f"{data_dir / rel}: changed since the data set was written (meta.json records "
                        f"{FileSum.of(meta.files[rel]).bytes:,} bytes, CRC-32 {FileSum.of(meta.files[rel]).crc32}); "
                        "its vocabulary would map lines to other rows than the run learned: restore it or "
                        "preprocess again"
                    )
    total = sum(v.numel() * 4 for v in dense.values()) + meta.total_rows * D * 4
    index = json.dumps({"metadata": {"total_size": int(total)}, "weight_map": weight_map}, indent=2).encode()
    atomic_write_text(out / INDEX, index.decode())
    sums[INDEX] = FileSum(len(index), crc_hex(zlib.crc32(index)))
    summary = RunDir(run).summary_file
    digest = None
    if summary.exists():
        try:
            s = json.loads(summary.read_text())
            digest = s.get("params_sha256") if isinstance(s, dict) and s.get("steps") == ckpt.step else None
        except (OSError, ValueError) as e:  # the checkpoint is what is exported; the summary only names its digest
            log.warning(f"{summary}: unreadable ({e}); the export records no params_sha256")
    source = meta.source
    preprocessing = None
    if source.get("tool") == "bagpipe preprocess":
        preprocessing = {
            "format": source["format"],
            "labelled": source.get("labelled", True),
            "categorical": source.get("categorical"),
            "dense": source.get("dense"),
            "vocab": "vocab" if has_vocab else None,
        }
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "model": asdict(mcfg),
        "dense_features": list(meta.dense_names),
        "tables": tables,
        "dense": {"file": DENSE_FILE, "naming": naming},
        "training": {
            "run": str(run.resolve()),
            "step": ckpt.step,
            "optimizer": conf["train"]["optim"]["optimizer"],
            "params_sha256": digest,
            "dataset": str(data_dir.resolve()),
        },
        "preprocessing": preprocessing,
        "files": {k: v.to_json() for k, v in sorted(sums.items())},
    }
    atomic_write_text(out / MANIFEST, json.dumps(seal(manifest, MANIFEST_SUM), indent=2))
    return Exported(str(out), ckpt.step, len(tables), meta.total_rows, len(shards) + 1, naming, has_vocab)


def _tensor_chunks(t) -> list[np.ndarray]:
    """A dense (torch) tensor as the one chunk of its safetensors entry."""
    return [t.detach().contiguous().numpy()]
