"""Categorical keys -> ids: counting keys, the vocabulary, hashing, and saving the mapping.

A categorical value is an int64 *key* (see :mod:`bagpipe.preprocess.fastparse`; a
missing value is :data:`~bagpipe.preprocess.fastparse.MISSING_KEY`, -1). A
:class:`Mapping` turns the keys of each keyed feature into row ids of its table:

* :class:`HashMapping` (``--max-rows-per-table M``): ``id = key % M``, a missing value
  -> 0 (DLRM's ``max-ind-range``); tables of M rows.
* :class:`Vocabulary` (``--min-count K``): keys seen at least K times in the train lines
  get ids 1.. in increasing key order (the missing key -1 is counted like any other);
  rarer and unseen keys share row 0.
  Built from a :class:`KeyCounter` per feature (counts merged block by block) and looked
  up through a :class:`KeyIndex` (a vectorised open-addressing hash table).

:func:`map_ids` turns parsed lines into the ids of every feature (preprocessing and
``bagpipe predict`` share it). :func:`save_mapping` writes ``OUT/vocab/vocab.json`` plus,
in vocabulary mode, per feature ``<name>.keys.npy`` and ``<name>.counts.npy`` (every
distinct key of the train lines, sorted ascending, int64, with its count);
:func:`load_mapping` reads them back for ``--vocab-from DIR``, :func:`read_mapping` from
any copy of the ``vocab`` folder (an exported model's).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bagpipe.data.schema import META_FILE, read_json
from bagpipe.errors import ConfigError, DataError
from bagpipe.preprocess.fastparse import MISSING_KEY
from bagpipe.preprocess.formats import Raw, RawFormat

VOCAB_DIR = "vocab"
VOCAB_FILE = "vocab.json"
VOCAB_VERSION = 1

_U = np.uint64
_GOLDEN = _U(0x9E3779B97F4A7C15)
_EMPTY_SLOT = np.iinfo(np.int64).min


class KeyIndex:
    """A static hash table (open addressing, linear probing, load <= 1/2) from distinct
    int64 keys to their position in the array it was built from; vectorised lookups.

    ``priority`` (e.g. the counts) inserts frequent keys first, so they sit in their
    home slot and most lookups take one probe. Faster than binary search once a table
    outgrows the cache, and on skewed queries.
    """

    def __init__(self, keys: np.ndarray, priority: np.ndarray | None = None):
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        n = len(keys)
        self.bits = max(4, (2 * n - 1).bit_length())
        self.mask = (1 << self.bits) - 1
        self._shift = _U(64 - self.bits)
        self.slot_key = np.full(1 << self.bits, _EMPTY_SLOT, dtype=np.int64)
        self.slot_pos = np.full(1 << self.bits, -1, dtype=np.int32 if n < (1 << 31) else np.int64)
        order = np.arange(n, dtype=np.int64)
        if priority is not None and n:
            order = np.argsort(-np.asarray(priority), kind="stable")
        # insert in tiers of growing size: the most frequent keys meet few collisions
        lo = 0
        for hi in [n >> 8, n >> 4, n >> 2, n]:
            if hi > lo:
                self._insert(keys, order[lo:hi])
                lo = hi

    def _insert(self, keys: np.ndarray, pend: np.ndarray) -> None:
        sk, sp = self.slot_key, self.slot_pos
        pos = self._home(keys[pend])
        while pend.size:
            free = sp[pos] < 0
            cand, cpos = pend[free], pos[free]
            sp[cpos] = cand  # several keys may claim one slot: one of them wins
            won = sp[cpos] == cand
            sk[cpos[won]] = keys[cand[won]]
            taken = ~free
            pend = np.concatenate([pend[taken], cand[~won]])
            pos = (np.concatenate([pos[taken], cpos[~won]]) + 1) & self.mask

    def _home(self, keys: np.ndarray) -> np.ndarray:
        h = keys.view(np.uint64) * _GOLDEN
        h >>= self._shift
        return h.view(np.int64)

    def lookup(self, q: np.ndarray) -> np.ndarray:
        """Position of each key of ``q`` in the build array, -1 where absent."""
        q = np.ascontiguousarray(q, dtype=np.int64)
        h = self._home(q)
        res = self.slot_pos[h].astype(np.int64)
        miss = self.slot_key[h] != q
        if miss.any():
            idx = np.flatnonzero(miss)
            idx = idx[res[idx] >= 0]  # an empty home slot ends the probe
            hi = h[idx]
            res[miss] = -1
            while idx.size:
                hi = (hi + 1) & self.mask
                k = self.slot_key[hi]
                hit = k == q[idx]
                res[idx[hit]] = self.slot_pos[hi[hit]]
                cont = ~hit & (k != _EMPTY_SLOT)
                idx, hi = idx[cont], hi[cont]
        return res


class KeyCounter:
    """Counts of int64 keys, accumulated block by block as sorted runs (``np.unique``)
    that are merged geometrically, so the total work stays O(N log N)."""

    def __init__(self) -> None:
        self._main: tuple[np.ndarray, np.ndarray] | None = None
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_len = 0

    @staticmethod
    def count(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(distinct keys sorted, counts) of one block's keys."""
        values, counts = np.unique(keys, return_counts=True)
        return values.astype(np.int64, copy=False), counts.astype(np.int64, copy=False)

    def add(self, values: np.ndarray, counts: np.ndarray) -> None:
        self._pending.append((values, counts))
        self._pending_len += len(values)
        main_len = len(self._main[0]) if self._main else 0
        if self._pending_len > max(1 << 20, main_len):
            self._merge()

    def _merge(self) -> None:
        runs = ([self._main] if self._main else []) + self._pending
        self._pending, self._pending_len = [], 0
        if not runs:
            return
        if len(runs) == 1:
            self._main = runs[0]
            return
        keys = np.concatenate([r[0] for r in runs])
        counts = np.concatenate([r[1] for r in runs])
        order = np.argsort(keys, kind="stable")  # a merge of sorted runs (timsort)
        keys, counts = keys[order], counts[order]
        first = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
        self._main = (keys[first], np.add.reduceat(counts, first) if len(first) else counts[:0])

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys sorted ascending, counts) as int64."""
        self._merge()
        if self._main is None:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return self._main


class Mapping:
    """Maps the keys of each keyed feature (one-hot and multi-hot) to ids."""

    mode = "?"

    def num_rows(self, name: str) -> int:
        raise NotImplementedError

    def map(self, name: str, keys: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def describe(self) -> dict:
        raise NotImplementedError


class HashMapping(Mapping):
    """``id = key % max_rows``; a missing value -> 0 (DLRM's max-ind-range)."""

    mode = "hash"

    def __init__(self, names: Sequence[str], max_rows: int):
        if max_rows < 1:
            raise ConfigError(f"--max-rows-per-table must be >= 1, got {max_rows}")
        self.names = list(names)
        self.max_rows = int(max_rows)

    def num_rows(self, name: str) -> int:
        return self.max_rows

    def map(self, name: str, keys: np.ndarray) -> np.ndarray:
        ids = keys % self.max_rows
        ids[keys == MISSING_KEY] = 0
        return ids

    def describe(self) -> dict:
        return {"mode": "hash", "max_rows_per_table": self.max_rows}


class Vocabulary(Mapping):
    """Per feature: every distinct key of the train lines with its count. Keys counted
    at least ``min_count`` times get ids 1.. in increasing key order; others -> 0."""

    mode = "vocab"

    def __init__(self, keys: dict[str, np.ndarray], counts: dict[str, np.ndarray], min_count: int, workers: int = 1):
        if min_count < 1:
            raise ConfigError(f"--min-count must be >= 1, got {min_count}")
        self.keys = keys
        self.counts = counts
        self.min_count = int(min_count)
        self.kept = {n: np.ascontiguousarray(keys[n][counts[n] >= min_count]) for n in keys}

        def build(n: str) -> KeyIndex:
            return KeyIndex(self.kept[n], counts[n][counts[n] >= min_count])

        names = sorted(keys, key=lambda n: -len(self.kept[n]))  # big tables first
        with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
            self._index = dict(zip(names, ex.map(build, names)))

    def num_rows(self, name: str) -> int:
        return len(self.kept[name]) + 1

    def map(self, name: str, keys: np.ndarray) -> np.ndarray:
        ids = self._index[name].lookup(keys)
        ids += 1
        return ids

    def describe(self) -> dict:
        return {"mode": "vocab", "min_count": self.min_count}


def map_ids(fmt: RawFormat, mapping: Mapping, raw: Raw) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The ids of parsed lines ``raw``: (F1, n) int64 of the one-hot features in schema order
    (feature-major, like ``raw.keys``), and per multi-hot feature (ids (nnz,), lengths (n,))."""
    fixed_names = [n for n, _ in fmt.fixed_features]
    one_hot = [n for n in fmt.feature_order if n not in fmt.seq_features]
    ids = np.empty((len(one_hot), len(raw)), dtype=np.int64)
    for col, name in enumerate(one_hot):
        if name in fmt.key_features:
            ids[col] = mapping.map(name, raw.keys[fmt.key_features.index(name)])
        else:
            ids[col] = raw.fixed[:, fixed_names.index(name)]
    multihot = {name: (mapping.map(name, v), lengths) for name, (v, lengths) in zip(fmt.seq_features, raw.seqs)}
    return ids, multihot


def save_mapping(out: Path, fmt: RawFormat, mapping: Mapping) -> None:
    d = out / VOCAB_DIR
    d.mkdir(parents=True, exist_ok=True)
    features = {}
    for name in fmt.key_features + fmt.seq_features:
        entry: dict[str, int | str] = {"num_rows": mapping.num_rows(name)}
        if isinstance(mapping, Vocabulary):
            np.save(d / f"{name}.keys.npy", mapping.keys[name])
            np.save(d / f"{name}.counts.npy", mapping.counts[name])
            entry["distinct"] = int(len(mapping.keys[name]))
            entry["keys"] = f"{name}.keys.npy"
            entry["counts"] = f"{name}.counts.npy"
        features[name] = entry
    doc = {
        "version": VOCAB_VERSION,
        "format": fmt.name,
        "key": fmt.key_kind,
        **mapping.describe(),
        "features": features,
        "fixed_features": {n: r for n, r in fmt.fixed_features},
    }
    (d / VOCAB_FILE).write_text(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n")


def load_mapping(directory: str | os.PathLike, fmt: RawFormat) -> Mapping:
    """The mapping of dataset ``directory`` (``--vocab-from``)."""
    directory = Path(directory)
    path = directory / VOCAB_DIR / VOCAB_FILE
    if not directory.is_dir():
        raise DataError(f"--vocab-from {directory}: no such directory")
    if not (directory / META_FILE).exists():
        raise DataError(f"--vocab-from {directory}: not a finished dataset (no {META_FILE})")
    if not path.exists():
        raise DataError(f"--vocab-from {directory}: has no {VOCAB_DIR}/{VOCAB_FILE} (not made by bagpipe preprocess)")
    return read_mapping(path, fmt, f"--vocab-from {directory}")


def read_mapping(path: str | os.PathLike, fmt: RawFormat, name: str | None = None) -> Mapping:
    """The mapping saved in ``path`` (a ``vocab.json`` beside its ``.npy`` files); ``name``
    (default: the folder) starts the messages of its errors."""
    path = Path(path)
    name = name or str(path.parent)
    doc = read_json(path)
    if doc.get("version") != VOCAB_VERSION:
        raise DataError(f"{path}: unsupported vocabulary version {doc.get('version')!r}")
    if doc.get("format") != fmt.name:
        raise DataError(f"{name}: holds a {doc.get('format')} vocabulary, not {fmt.name}")
    names = fmt.key_features + fmt.seq_features
    missing = [n for n in names if n not in doc.get("features", {})]
    if missing:
        raise DataError(f"{path}: no entry for feature(s) {', '.join(missing)}")
    if doc.get("mode") == "hash":
        return HashMapping(names, int(doc["max_rows_per_table"]))
    if doc.get("mode") != "vocab":
        raise DataError(f"{path}: unknown mode {doc.get('mode')!r}")
    keys, counts = {}, {}
    for n in names:
        try:
            keys[n] = np.load(path.parent / doc["features"][n]["keys"])
            counts[n] = np.load(path.parent / doc["features"][n]["counts"])
        except (OSError, ValueError, KeyError) as e:
            raise DataError(f"{path.parent}: vocabulary of {n} unreadable ({e})") from None
        if keys[n].dtype != np.int64 or keys[n].shape != counts[n].shape:
            raise DataError(f"{path.parent}: vocabulary of {n} is malformed")
    return Vocabulary(keys, counts, int(doc["min_count"]))
