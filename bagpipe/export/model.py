"""An exported model as an ``nn.Module``: ``bagpipe.load(DIR)``.

::

    import bagpipe
    model = bagpipe.load("exports/criteo")            # tables memory-mapped, nothing loaded yet
    p = model.predict_lines(["\\t".join(fields)])     # raw log lines (the training data's format)
    logits = model(dense, ids)                        # dense (B, Dd) float, ids (B, F) table-local int

The tables stay in their safetensors files, memory-mapped: a lookup reads the rows it
needs, so a model whose tables exceed memory still scores. Raw lines go through the
preprocessing code (parser, dense transform, vocabulary or hashing) exactly as the
training data did (:mod:`bagpipe.export.score`); ids go through the same batch
construction and model forward as ``bagpipe eval``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from bagpipe.data.batch import make_batch
from bagpipe.data.schema import FeatureSpec, read_json
from bagpipe.errors import ConfigError, DataError
from bagpipe.export import tensorfile
from bagpipe.export.naming import from_export
from bagpipe.export.write import FORMAT, MANIFEST, MANIFEST_SUM, SUMMED, VERSIONS
from bagpipe.filesums import FileSum, crc_hex, file_crc, seal_problem
from bagpipe.models import ModelConfig, build_model
from bagpipe.train.evaluate import batch_logits

if TYPE_CHECKING:
    from bagpipe.preprocess.vocab import Mapping


class ExportedModel(nn.Module):
    """A model read from an export directory (see the module docstring).

    Attributes: ``config`` (the architecture), ``features`` (one :class:`FeatureSpec` per
    table, schema order), ``dense_names``, ``net`` (the dense model, bagpipe's module),
    ``manifest`` (model.json).
    """

    def __init__(self, directory: str | Path, verify: bool = True):
        super().__init__()
        self.directory = Path(directory)
        if self.directory.name == MANIFEST and self.directory.is_file():  # the export's model.json itself
            self.directory = self.directory.parent
        path = self.directory / MANIFEST
        if not path.exists():
            d = self.directory
            if (d / "config.json").is_file() and (d / "checkpoints").is_dir():
                raise DataError(
                    f"{d}: a run folder, not an export: `bagpipe export --run {d} --out DIR` writes one, then load DIR"
                )
            raise DataError(f"{d}: not a finished bagpipe export (no {MANIFEST})")
        self.manifest = m = read_json(path)
        if not isinstance(m, dict) or m.get("format") != FORMAT or m.get("version") not in VERSIONS:
            raise DataError(f"{path}: not a {FORMAT} manifest of version {' or '.join(map(str, VERSIONS))}")
        check_export(self.directory, m, files=verify)
        try:
            self.config = ModelConfig(**m["model"])
            self.features = [FeatureSpec(t["name"], t["num_embeddings"], t["multi_hot"]) for t in m["tables"]]
            self.dense_names = list(m["dense_features"])
            self.net = build_model(self.config, len(self.dense_names), len(self.features))
            offsets = [int(t["row_offset"]) for t in m["tables"]]
            files = [(t["file"], t["key"], (int(t["num_embeddings"]), int(t["embedding_dim"]))) for t in m["tables"]]
            dense_file, naming = m["dense"]["file"], m["dense"]["naming"]
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(
                f"{path}: a damaged export manifest ({type(e).__name__}: {e}); export the run again"
            ) from None
        self._load_dense(dense_file, naming)
        self.tables = []
        for name, key, shape in files:
            t = tensorfile.open_tensor(self.directory / name, key)
            if t.shape != shape:
                raise DataError(
                    f"{self.directory / name}: {key} has shape {t.shape}, {MANIFEST} says {shape}; "
                    "a damaged export: export the run again"
                )
            self.tables.append(t)
        self.table_offsets = np.array(offsets + [sum(f.num_rows for f in self.features)], np.int64)
        self._mapping: Mapping | None = None
        self.eval()

    def _load_dense(self, name: str, naming: str) -> None:
        """Load the dense layers from the export's safetensors file ``name``."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = self.directory / name
        try:
            tensors = load_file(str(path))
            state = from_export(tensors, self.config, len(self.dense_names), len(self.features), naming)
            self.net.load_state_dict(state)
        except FileNotFoundError:
            raise DataError(f"{path}: missing; a damaged export: export the run again") from None
        except (SafetensorError, OSError, KeyError, RuntimeError, ValueError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise DataError(
                f"{path}: unreadable or not this model's ({first}); a damaged export: export the run again"
            ) from None

    # -- ids ---------------------------------------------------------------------------
    def embedding(self, name: str) -> np.ndarray:
        """Table ``name`` (num_embeddings, D), a read-only memory map."""
        for f, t in zip(self.features, self.tables):
            if f.name == name:
                return t
        raise ConfigError(f"no table {name!r} (tables: {', '.join(f.name for f in self.features)})")

    def lookup(self, rows: torch.Tensor) -> torch.Tensor:
        """(U, D) weights of ascending global rows ``rows`` (U,), table by table."""
        r = rows.numpy()
        out = np.empty((len(r), self.config.embedding_dim), np.float32)
        bounds = np.searchsorted(r, self.table_offsets)
        for t, table in enumerate(self.tables):
            a, b = int(bounds[t]), int(bounds[t + 1])
            if b > a:
                out[a:b] = table[r[a:b] - self.table_offsets[t]]
        return torch.from_numpy(out)

    def forward(self, dense, ids, multihot: dict | None = None) -> torch.Tensor:
        """(B,) logits of B samples: dense (B, Dd) transformed dense features (float), ids
        (B, F1) table-local ids of the one-hot features in table order, ``multihot``
        name -> (ids (nnz,), lengths (B,)) of each multi-hot feature. Inference only."""
        dense = np.asarray(dense, dtype=np.float32)
        ids = integer_ids(ids, "ids")
        one_hot = [f for f in self.features if not f.multi_hot]
        B = len(ids)
        if ids.ndim != 2 or dense.shape != (B, len(self.dense_names)) or ids.shape != (B, len(one_hot)):
            rows = B if ids.ndim == 2 else "B"  # a 1-D ids array has no sample axis to count
            one = " (one sample is dense[None], ids[None])" if ids.ndim == 1 else ""
            raise ConfigError(
                f"expected dense ({rows}, {len(self.dense_names)}) and ids ({rows}, {len(one_hot)}) for B samples, "
                f"got {dense.shape} and {ids.shape}{one}"
            )
        bad = np.argwhere(~np.isfinite(dense))
        if len(bad):  # a NaN input gives a NaN probability: refused, as the data sets refuse it
            i, j = (int(x) for x in bad[0])
            raise DataError(
                f"dense must be finite: got {dense[i, j]} at ({i}, {j}), feature {self.dense_names[j]} "
                f"({len(bad):,} of its {dense.size:,} values are not); transform missing values as the training data did"
            )
        for j, f in enumerate(one_hot):
            if B and (ids[:, j].min() < 0 or ids[:, j].max() >= f.num_rows):
                raise DataError(f"table {f.name}: ids must be in [0, {f.num_rows})")
        if multihot:
            multihot = {
                name: (integer_ids(v, f"multihot[{name!r}] ids"), integer_ids(n, f"multihot[{name!r}] lengths"))
                for name, (v, n) in multihot.items()
            }
        if B == 0:  # no sample: no logit (the model's reshapes need one)
            return torch.zeros(0)
        batch = make_batch(self.features, self.table_offsets, np.zeros(B, np.float32), dense, ids, multihot)
        return batch_logits(self.net, self.lookup, batch)

    def predict(self, dense, ids, multihot: dict | None = None) -> np.ndarray:
        """(B,) click probabilities (float32) of :meth:`forward`'s inputs (B = 0: an empty array)."""
        return torch.sigmoid(self(dense, ids, multihot)).numpy().astype(np.float32, copy=False)

    # -- raw log lines -----------------------------------------------------------------
    @property
    def raw_format_name(self) -> str:
        """The raw format the training data was preprocessed from."""
        pre = self.manifest.get("preprocessing")
        if pre is None:
            raise DataError(
                f"{self.directory}: trained on data without a raw format (bagpipe synth); score ids with model(dense, ids)"
            )
        return pre["format"]

    def raw_format(self, labelled: bool = True, header: str = "auto"):
        from bagpipe.preprocess.registry import raw_format

        return raw_format(self.raw_format_name, labelled=labelled, header=header)

    def mapping(self) -> Mapping:
        """The preprocessing's keys -> ids mapping (vocabulary or hashing), read once."""
        if self._mapping is None:
            from bagpipe.preprocess.vocab import read_mapping

            path = self.directory / "vocab" / "vocab.json"
            if not path.exists():
                pre = self.manifest.get("preprocessing") or {}
                if pre.get("vocab"):  # the export wrote one: its folder is damaged, not the data
                    raise DataError(
                        f"{path}: missing, though {MANIFEST} lists the vocabulary; a damaged export: "
                        "export the run again"
                    )
                raise DataError(
                    f"{self.directory}: the export has no vocab/ (its dataset had none); raw lines cannot be mapped"
                )
            self._mapping = read_mapping(path, self.raw_format())
        return self._mapping

    def predict_lines(self, lines: Iterable[str | bytes], labelled: bool = False) -> np.ndarray:
        """Click probabilities (float32) of raw log lines in the training data's format
        (with a label column if ``labelled``; a CSV header line is recognised). A bad
        line raises :class:`~bagpipe.errors.ParseError` naming ``<lines>:N``. One string
        (or bytes) is its lines, not its characters: ``predict_lines("1\t2\t...")`` scores
        one line."""
        from bagpipe.export.score import score_lines

        if isinstance(lines, (str, bytes)):
            lines = lines.splitlines()
        return score_lines(self, lines, labelled)


def integer_ids(values, what: str) -> np.ndarray:
    """``values`` as int64: integers, or floats that hold integers (``1.0``: ids read from a
    float column); a fractional, NaN or infinite float, or anything else, is a
    :class:`DataError` naming the first such value (never truncated: 1.9 is not id 1)."""
    a = np.asarray(values)
    if a.dtype.kind in "iu":
        return a.astype(np.int64, copy=False)
    if a.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(a) | (a != np.trunc(a))
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise DataError(
                f"{what} must be integers: got {float(a[at])!r} at {at if len(at) > 1 else at[0]} "
                "(a float id is not truncated; give whole numbers)"
            )
        return a.astype(np.int64)
    raise DataError(f"{what} must be integers, got an array of {a.dtype}")


def load(directory: str | Path, verify: bool = True) -> ExportedModel:
    """The model exported into ``directory`` by ``bagpipe export`` (see :class:`ExportedModel`).
    ``verify``: check every file's size and CRC-32 against model.json first (see
    :func:`check_export`; ``False`` skips the files' sums, not model.json's own)."""
    return ExportedModel(directory, verify=verify)


# (device, inode, size, mtime_ns, ctime_ns) of export files this process checked -> their CRC-32
_checked: dict[tuple[int, int, int, int, int], str] = {}


def _damaged(path: Path, what: str) -> DataError:
    return DataError(f"{path}: damaged export file: {what}; export the run again")


def check_export(directory: Path, m: dict, files: bool = True) -> None:
    """An export (version 2 and later) is what ``bagpipe export`` wrote: model.json's own
    content sum (``manifest_crc32``), then -- with ``files`` -- every file it lists has the
    size and CRC-32 recorded when it was written, or a one-line :class:`DataError` naming
    the file. Version 1 (written before sums) is not checked. Files are read in chunks
    (about 2 GiB/s), once per process while their inode, size and times stay the same."""
    path = directory / MANIFEST
    version = m["version"]
    problem = seal_problem(m, MANIFEST_SUM)
    if problem is None and version >= SUMMED and (MANIFEST_SUM not in m or not isinstance(m.get("files"), dict)):
        problem = f"it says version {version}, which records its files' sums and its own ({MANIFEST_SUM}), and has none"
    if problem is not None:
        raise _damaged(path, problem)
    if version < SUMMED or not files:
        return
    for name, recorded in sorted(m["files"].items()):
        try:
            expected = FileSum.of(recorded)
        except (KeyError, TypeError, ValueError):
            raise _damaged(path, f"its entry for {name} is not a size and CRC-32") from None
        p = directory / name
        try:
            st = os.stat(p)
        except FileNotFoundError:
            raise DataError(
                f"{p}: missing, though {MANIFEST} lists it; a damaged export: export the run again"
            ) from None
        if not stat.S_ISREG(st.st_mode):
            raise _damaged(p, "not a regular file")
        if st.st_size != expected.bytes:
            how = "truncated" if st.st_size < expected.bytes else "longer than written"
            raise _damaged(p, f"{MANIFEST} records {expected.bytes:,} bytes, found {st.st_size:,} ({how})")
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if _checked.get(key) == expected.crc32:
            continue
        found = crc_hex(file_crc(p))
        if found != expected.crc32:
            raise _damaged(
                p,
                f"{MANIFEST} records CRC-32 {expected.crc32}, found {found} (its bytes changed since it was exported)",
            )
        _checked[key] = found
