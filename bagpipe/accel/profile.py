"""Which rows are hot: access counts over a seeded sample of the train split.

FAE profiles a sample of its training inputs (5% by default), keeps the most accessed
rows that fit a memory budget in fast memory, and calls an input *hot* when every one
of its lookups is a hot row. :func:`profile` does the same, vectorised:

1. **Sample.** Each shard of the split is cut into blocks of :data:`BLOCK` samples and a
   seeded choice of ``round(rate * blocks)`` of them (at least one per shard) is read.
   Blocks, not single samples: a per-sample choice would touch nearly every page of the
   shard files anyway, so it would cost what reading everything costs.
2. **Count.** The sampled ids of each table are buffered and counted with one
   ``np.bincount`` per table per :data:`BUFFER_LOOKUPS` buffered lookups.
3. **Choose.** The ``k = budget / (4 (D + S))`` most counted rows -- a row and its
   optimizer state, as FAE counts them; ties go to the lower row; a row the sample never
   saw is never chosen.
4. **Cover.** A second, *held-out* sample -- blocks the count did not read, as many as
   it read up to :data:`COVER_RATE` of each shard -- measures, per table and overall, the
   share of lookups hot rows serve and of inputs whose lookups are all hot: what a run
   will see, not how well the rows fit the sample that chose them. With ``rate = 1``
   nothing is held out and the figures are in-sample (the report says which).

The result is a :class:`HotSet` (the rows and that report), saved by ``bagpipe profile
--out FILE`` as one ``.npz`` file that ``bagpipe train --hot-rows FILE`` reads.
"""

from __future__ import annotations

import io
import json
import os
import stat
import time
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from bagpipe.data.shards import Dataset
from bagpipe.data.stream import bag_values
from bagpipe.errors import ConfigError
from bagpipe.files import atomic_write_bytes
from bagpipe.jsonout import json_text

BLOCK = 1024  # samples per sampled block
COVER_RATE = 0.05  # at most this share of each shard's blocks is read to measure coverage
BUFFER_LOOKUPS = 1 << 25  # sampled lookups buffered before they are counted (~128 MiB of int32 ids)
MIB = 1 << 20

#: The first bytes of a .npz archive (a zip file), as :meth:`HotSet.save` writes one.
ZIP_MAGIC = b"PK\x03\x04"

#: The members of a .npz that :meth:`HotSet.save` writes, in the order written.
HOT_MEMBERS = ("rows.npy", "report.npy")


#: The report's mark, written by :meth:`HotSet.save` (``"format"``): what tells a hot-row
#: file from any other .npz with members called rows and report.
HOT_FORMAT = "bagpipe hot rows"

#: Keys every profiler report has: a file written before :data:`HOT_FORMAT` was is told by them.
REPORT_KEYS = frozenset({"budget_mb", "capacity_rows", "hot_rows", "hot_mib", "sample_rate", "table_sizes"})

#: report.npy larger than this (a JSON string held as 4-byte characters) is not read to tell a file's kind.
REPORT_PEEK = 16 * MIB


def is_hot_row_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a file :meth:`HotSet.save` wrote (``bagpipe profile --out``
    replaces only such a file), told without loading its rows: a zip archive whose members
    are exactly rows.npy and report.npy (read from its central directory, a few hundred
    bytes at the end) and whose report -- a small JSON string, read without pickles -- holds
    :data:`HOT_FORMAT` (files written before that mark: every key of :data:`REPORT_KEYS`).
    One damaged there (truncated: the file :meth:`HotSet.load` tells to profile again, whose
    report is lost) by its first member's local header, rows.npy first, as written, and as
    much of that member's .npy header as is left: int64 rows, one axis."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != ZIP_MAGIC:
                return False
            try:
                with zipfile.ZipFile(f) as z:
                    return sorted(z.namelist()) == sorted(HOT_MEMBERS) and _holds_hot_report(z)
            except (zipfile.BadZipFile, EOFError, ValueError):
                pass
            f.seek(0)
            head = f.read(4096)
    except OSError:
        return False
    return _truncated_hot_row_file(head)


def _holds_hot_report(z: zipfile.ZipFile) -> bool:
    """Whether the archive's report.npy is a profiler's report (a JSON object string)."""
    if z.getinfo(HOT_MEMBERS[1]).file_size > REPORT_PEEK:
        return False
    try:
        with z.open(HOT_MEMBERS[1]) as m:
            text = np.lib.format.read_array(m, allow_pickle=False)
    except zipfile.BadZipFile:  # a bit of it flipped (CRC): unreadable, as a truncated file is; told by its members
        return True
    except (ValueError, EOFError, OSError, zlib.error):
        return False
    if text.shape != () or text.dtype.kind != "U":
        return False
    try:
        report = json.loads(str(text))
    except ValueError:
        return False
    return isinstance(report, dict) and (report.get("format") == HOT_FORMAT or REPORT_KEYS <= report.keys())


def _truncated_hot_row_file(head: bytes) -> bool:
    """Whether the first bytes of a zip archive without its central directory are a hot-row
    file's: rows.npy first (as :meth:`HotSet.save` writes it, stored), and its .npy header,
    as far as it goes, that of an int64 array of one axis."""
    name_length = int.from_bytes(head[26:28], "little")
    if not (name_length == len(HOT_MEMBERS[0]) and head[30 : 30 + name_length] == HOT_MEMBERS[0].encode()):
        return False
    npy = head[30 + name_length + int.from_bytes(head[28:30], "little") :]
    magic = np.lib.format.MAGIC_PREFIX
    if npy[: len(magic)] != magic[: len(npy)]:
        return False
    size_bytes = 2 if npy[len(magic) : len(magic) + 1] == b"\x01" else 4  # .npy 1.0: a 2-byte header length
    start = len(magic) + 2 + size_bytes
    if len(npy) < start or len(npy) < start + int.from_bytes(npy[start - size_bytes : start], "little"):
        return True  # cut inside the .npy header: as far as it goes, it is rows.npy's
    try:
        version = np.lib.format.read_magic(io.BytesIO(npy))
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(io.BytesIO(npy[len(magic) + 2 :]))
    except (ValueError, EOFError):
        return False
    return dtype == np.dtype("<i8") and len(shape) == 1


# (ids of the inputs' lookups into one table, (n,) bag lengths or None when one id per input)
Column = tuple[np.ndarray, "np.ndarray | None"]


@dataclass
class HotSet:
    """H hot rows of a row space of ``num_rows`` rows, and how they were chosen.

    rows: (H,) int64 global rows, ascending and distinct.
    report: the profiler's figures (budget, sample, coverage per table and overall).
    """

    rows: np.ndarray
    num_rows: int
    report: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        rows = np.asarray(self.rows, dtype=np.int64)
        if len(rows) and (rows[0] < 0 or rows[-1] >= self.num_rows or bool(np.any(np.diff(rows) <= 0))):
            raise ConfigError(f"hot rows must be distinct, ascending rows in [0, {self.num_rows})")
        self.rows = rows

    @cached_property
    def _bitmap(self) -> tuple[np.ndarray, np.ndarray]:
        """A bitmap of R bits in 64-bit words and the hot rows before each word: membership and
        a hot row's index without an R-entry map (R/8 + R/16 bytes) and without a binary
        search over H rows (~4 ms a batch at H = 1.4M, against ~0.3 ms). Made on first use,
        so making a set costs O(H) (one received from the wire, whose R it names, too)."""
        mask = np.zeros(-(-self.num_rows // 64) * 64, dtype=bool)
        mask[self.rows] = True
        words = np.packbits(mask, bitorder="little").view("<u8")
        return words, np.concatenate([[0], np.cumsum(np.bitwise_count(words))[:-1]]).astype(np.int32)

    def __len__(self) -> int:
        return len(self.rows)

    def contains(self, rows: np.ndarray) -> np.ndarray:
        """(n,) bool: which of ``rows`` (n,) are hot."""
        rows = np.asarray(rows, dtype=np.int64)
        words, _ = self._bitmap
        return ((words[rows >> 6] >> (rows & 63).astype(np.uint64)) & np.uint64(1)).astype(bool)

    def position(self, rows: np.ndarray) -> np.ndarray:
        """(n,) int64 index in :attr:`rows` of each of ``rows`` (which must be hot)."""
        rows = np.asarray(rows, dtype=np.int64)
        words, before = self._bitmap
        word = rows >> 6
        below = words[word] & ((np.uint64(1) << (rows & 63).astype(np.uint64)) - np.uint64(1))
        return before[word] + np.bitwise_count(below).astype(np.int64)

    def mib(self, dim: int, state_dim: int) -> float:
        """MiB the rows take with their optimizer state (D + S floats each)."""
        return len(self.rows) * 4 * (dim + state_dim) / MIB

    def save(self, path: str | os.PathLike) -> None:
        """One .npz file (rows + the report as JSON), written atomically."""
        buf = io.BytesIO()
        report = {"format": HOT_FORMAT, **self.report}
        np.savez(buf, rows=self.rows, report=np.array(json_text(report)))
        atomic_write_bytes(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike, table_sizes: list[int]) -> HotSet:
        """A file of :meth:`save`; it must have been made for tables of ``table_sizes``."""
        expected = (
            "`bagpipe profile --out FILE` writes one, a NumPy .npz archive of the rows and their report; "
            "give --hot-rows such a file"
        )
        if str(path) == "-":  # `profile --out -` writes one to standard output; an archive is read by seeking
            raise ConfigError(
                "-: a hot-row file is not read from standard input (a .npz archive is read by seeking); write it "
                "to a file first (bagpipe profile ... --out hot.npz) and give --hot-rows hot.npz"
            )
        try:
            if not stat.S_ISREG(os.stat(path).st_mode) and not os.path.isdir(path):
                # opened twice (the magic, then the archive): a named pipe's second open waits for ever
                raise ConfigError(
                    f"{path}: a hot-row file is read by seeking (a .npz archive), so a pipe or a device cannot be "
                    "read; write it to a file first (bagpipe profile ... --out hot.npz) and give --hot-rows hot.npz"
                )
            with open(path, "rb") as raw:
                if raw.read(4) != ZIP_MAGIC:  # np.load would take it for a pickle, and refuse it as one
                    raise ConfigError(f"{path}: not a hot-row file (not a .npz archive): {expected}")
            with np.load(path, allow_pickle=False) as f:
                rows, report = f["rows"], json.loads(str(f["report"]))
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such hot-row file (make one with `bagpipe profile --out`)") from None
        except IsADirectoryError:
            raise ConfigError(f"{path}: is a folder, not a hot-row file: {expected}") from None
        except (zipfile.BadZipFile, EOFError, zlib.error) as e:  # a .npz truncated, or a bit of it flipped
            raise ConfigError(
                f"{path}: damaged hot-row file ({type(e).__name__}: {e}): profile again with `bagpipe profile --out {path}`"
            ) from None
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"{path}: not a hot-row file ({e}): {expected}") from None
        if not isinstance(report, dict):
            raise ConfigError(
                f"{path}: damaged hot-row file (its report is not a JSON object): "
                f"profile again with `bagpipe profile --out {path}`"
            )
        report.pop("format", None)  # the file's mark (HOT_FORMAT), not a figure
        if report.get("table_sizes") != list(table_sizes):
            raise ConfigError(f"{path}: made for another dataset (its tables differ from this one's)")
        return cls(rows, int(sum(table_sizes)), report)

    def line(self, dim: int | None = None, state_dim: int | None = None) -> str:
        """One line about the set, for the start of a run and for ``bagpipe profile``. Given
        the run's ``dim`` and ``state_dim``, the size is what the rows take in that run, and
        where that is not what they were profiled for (``--hot-rows`` made for another
        embedding size or optimizer) both are said."""
        r = self.report
        profiled = r.get("hot_mib", 0)
        size = f"{profiled:,.2f} MiB"
        if dim is not None and state_dim is not None and (r.get("dim"), r.get("state_dim")) != (dim, state_dim):
            size = f"{self.mib(dim, state_dim):,.2f} MiB in this run; profiled as {size}"
        return (
            f"hot rows: {len(self):,} ({size}) serve {r.get('lookup_share', 0):.1%} of the "
            f"{r.get('coverage_sample', '')} lookups; {r.get('input_share', 0):.1%} of the inputs are all hot "
            f"(profiled {r.get('profiled_inputs', 0):,} inputs in {r.get('seconds', 0):.1f} s)"
        )


def sample_blocks(
    dataset: Dataset, split: str, rate: float, seed: int, exclude: list[np.ndarray] | None = None
) -> tuple[list[np.ndarray], bool]:
    """Per shard of ``split``: the first samples of its sampled blocks, ascending; ``rate``
    of its blocks (at least one), taken from those not in ``exclude`` while any are left.
    Also returns whether the sample is disjoint from ``exclude``."""
    if not 0 < rate <= 1:
        raise ConfigError(f"sample rate must be in (0, 1], got {rate}")
    out, disjoint = [], True
    for s, n in enumerate(dataset.shard_sizes(split)):
        starts = np.arange(0, n, BLOCK, dtype=np.int64)
        k = max(1, int(round(rate * len(starts))))
        if exclude is not None:
            rest = np.setdiff1d(starts, exclude[s])
            disjoint &= len(rest) > 0
            starts = rest if len(rest) else starts
        if k < len(starts):
            pick = np.random.default_rng([seed, s]).choice(len(starts), size=k, replace=False)
            starts = starts[np.sort(pick)]
        out.append(starts)
    return out, disjoint


def sampled_columns(dataset: Dataset, split: str, blocks: list[np.ndarray]) -> Iterator[tuple[int, list[Column]]]:
    """Per shard: (sampled inputs n, one :data:`Column` per table in schema order)."""
    meta = dataset.meta
    for s, starts in enumerate(blocks):
        sh = dataset.shard(split, s)
        n_shard = len(sh.labels)
        if len(starts) * BLOCK >= n_shard:  # every block: a plain read
            idx = np.arange(n_shard, dtype=np.int64)
            sparse = np.asarray(sh.sparse)
        else:
            idx = (starts[:, None] + np.arange(BLOCK, dtype=np.int64)[None, :]).ravel()
            idx = idx[idx < n_shard]
            sparse = np.asarray(sh.sparse[idx])
        cols: list[Column] = []
        j = 0
        for f in meta.features:
            if f.multi_hot:
                values, offsets = sh.multihot[f.name]
                cols.append(bag_values(values, offsets, idx))
            else:
                cols.append((sparse[:, j], None))
                j += 1
        yield len(idx), cols


def bags_hot(hot: np.ndarray, lengths: np.ndarray | None) -> np.ndarray:
    """(n,) whether each input's bag is all hot, from (nnz,) ``hot`` per lookup (an empty bag is)."""
    if lengths is None:
        return hot
    cold = np.concatenate([[0], np.cumsum(~hot)])
    ends = np.cumsum(lengths)
    return cold[ends] == cold[ends - lengths]


def table_offsets(table_sizes: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(table_sizes)]).astype(np.int64)


def count_accesses(
    dataset: Dataset, split: str, blocks: list[np.ndarray], progress: bool = False
) -> tuple[np.ndarray, int]:
    """((R,) uint32 lookups of every global row in the sampled blocks, inputs read)."""
    from tqdm import tqdm

    sizes = dataset.meta.table_sizes
    off = table_offsets(sizes)
    counts = np.zeros(int(off[-1]), dtype=np.uint32)  # 4 bytes a row: half of bincount's int64
    buffers: list[list[np.ndarray]] = [[] for _ in sizes]
    buffered = inputs = 0

    def flush() -> None:
        for t, parts in enumerate(buffers):
            if parts:
                c = np.bincount(np.concatenate(parts), minlength=sizes[t])
                seg = counts[off[t] : off[t + 1]]
                np.add(seg, c, out=seg, casting="unsafe")
                parts.clear()

    for n, cols in tqdm(
        sampled_columns(dataset, split, blocks),
        total=len(blocks),
        disable=None if progress else True,  # None: shown on a terminal only, not into a pipe
        desc="profile: counting",
        unit="shard",
    ):
        inputs += n
        for t, (ids, _) in enumerate(cols):
            buffers[t].append(ids)
            buffered += len(ids)
        if buffered >= BUFFER_LOOKUPS:
            flush()
            buffered = 0
    flush()
    return counts, inputs


def most_accessed(counts: np.ndarray, k: int) -> np.ndarray:
    """(<= k,) ascending rows with the highest counts (ties: lower rows; never a count of 0)."""
    seen = np.flatnonzero(counts)
    if len(seen) <= k:
        return seen.astype(np.int64)
    if k <= 0:
        return np.zeros(0, np.int64)
    c = counts[seen]
    t = np.partition(c, len(c) - k)[len(c) - k]  # the k-th largest count
    above = seen[c > t]
    at = seen[c == t][: k - len(above)]  # seen is ascending: the lowest rows at the threshold
    return np.sort(np.concatenate([above, at]))


def coverage(dataset: Dataset, split: str, blocks: list[np.ndarray], hot: HotSet, progress: bool = False) -> dict:
    """Per table and overall, over the inputs of ``blocks``: lookups, the share hot rows
    serve, the share of inputs whose lookups into the table (overall: into every table)
    are all hot."""
    from tqdm import tqdm

    meta = dataset.meta
    off = table_offsets(meta.table_sizes)
    T = meta.num_features
    lookups, hot_lookups, hot_inputs = np.zeros(T, np.int64), np.zeros(T, np.int64), np.zeros(T, np.int64)
    inputs = all_hot = 0
    for n, cols in tqdm(
        sampled_columns(dataset, split, blocks),
        total=len(blocks),
        disable=None if progress else True,  # None: shown on a terminal only, not into a pipe
        desc="profile: coverage",
        unit="shard",
    ):
        every = np.ones(n, dtype=bool)
        for t, (ids, lengths) in enumerate(cols):
            h = hot.contains(ids.astype(np.int64) + off[t])
            lookups[t] += len(h)
            hot_lookups[t] += int(h.sum())
            b = bags_hot(h, lengths)
            hot_inputs[t] += int(b.sum())
            every &= b
        inputs += n
        all_hot += int(every.sum())
    rows_per_table = np.diff(np.searchsorted(hot.rows, off))
    tables = [
        {
            "table": f.name,
            "rows": f.num_rows,
            "hot_rows": int(rows_per_table[t]),
            "lookups": int(lookups[t]),
            "lookup_share": float(hot_lookups[t] / max(lookups[t], 1)),
            "input_share": float(hot_inputs[t] / max(inputs, 1)),
        }
        for t, f in enumerate(meta.features)
    ]
    return {
        "coverage_inputs": inputs,
        "coverage_lookups": int(lookups.sum()),
        "lookup_share": float(hot_lookups.sum() / max(int(lookups.sum()), 1)),
        "input_share": float(all_hot / max(inputs, 1)),
        "tables": tables,
    }


def all_hot_inputs(dataset: Dataset, split: str, hot: HotSet) -> list[np.ndarray]:
    """Per shard of ``split``: (n,) bool, whether each input's lookups are all hot."""
    off = table_offsets(dataset.meta.table_sizes)
    blocks, _ = sample_blocks(dataset, split, 1.0, 0)
    out = []
    for n, cols in sampled_columns(dataset, split, blocks):
        every = np.ones(n, dtype=bool)
        for t, (ids, lengths) in enumerate(cols):
            every &= bags_hot(hot.contains(ids.astype(np.int64) + off[t]), lengths)
        out.append(every)
    return out


def profile(
    dataset: Dataset,
    budget_mb: float,
    *,
    dim: int,
    state_dim: int,
    sample_rate: float = 0.05,
    seed: int = 0,
    split: str = "train",
    progress: bool = False,
) -> HotSet:
    """The hot rows of ``dataset`` for a budget of ``budget_mb`` MiB (rows of D weights and
    S optimizer-state floats), from a ``sample_rate`` sample of ``split`` drawn with ``seed``."""
    if not budget_mb > 0:
        raise ConfigError(f"hot budget must be > 0 MiB, got {budget_mb}")
    t0 = time.perf_counter()
    meta = dataset.meta
    row_bytes = 4 * (dim + state_dim)
    capacity = int(budget_mb * MIB // row_bytes)
    blocks, _ = sample_blocks(dataset, split, sample_rate, seed)
    counts, profiled = count_accesses(dataset, split, blocks, progress)
    hot = HotSet(most_accessed(counts, capacity), meta.total_rows)
    del counts
    held, held_out = sample_blocks(dataset, split, min(sample_rate, COVER_RATE), seed + 1, exclude=blocks)
    cover = coverage(dataset, split, held, hot, progress)
    hot.report = {
        "budget_mb": float(budget_mb),
        "dim": dim,
        "state_dim": state_dim,
        "capacity_rows": capacity,
        "hot_rows": len(hot),
        "hot_mib": hot.mib(dim, state_dim),
        "sample_rate": sample_rate,
        "seed": seed,
        "split": split,
        "profiled_inputs": profiled,
        "coverage_sample": "held-out" if held_out else "in-sample",
        **cover,
        "table_sizes": list(meta.table_sizes),
        "seconds": time.perf_counter() - t0,
    }
    return hot
