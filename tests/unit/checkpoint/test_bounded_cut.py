"""A checkpoint's cut under a memory budget (bagpipe/checkpoint/parts.py RowCut,
bagpipe/train/cut.py; docs/beyond-memory.md#the-end-of-a-run):

* the rows a cut takes, read from its bitmap chunk by chunk, are exactly the rows a copy
  takes (every size of chunk, empty and full bitmaps);
* a streamed part is byte for byte the part written from a copy (a delta and a full
  part, with the cache's rows over the store's), and it reads the store in chunks of at
  most the ``chunk_rows`` the budget gave it;
* under a budget that does not hold the copy the cut streams, every read within the
  budget's chunk and the memory it allocates (traced) within the estimate's "checkpoint
  cut" part; under one that does, the cut copies and the part is written afterwards;
  without a budget the cut is today's (a snapshot, written afterwards).
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from bagpipe.budget.estimate import CUT, Estimate, Part, Sizes, cut_bytes, cut_part
from bagpipe.budget.sizing import MARGIN, Budget, Fit
from bagpipe.checkpoint import CutTarget, take_snapshot, write_part
from bagpipe.checkpoint.parts import RowCut, bits_chunks, bits_count, set_bits
from bagpipe.store.diskio import DiskIO
from bagpipe.store.memory import MemoryStore
from bagpipe.train.cut import local_cut

pytestmark = pytest.mark.unit

R, D, S = 50_000, 8, 2


def _init():
    from bagpipe.store.init import RowInitializer

    return RowInitializer([R // 2, R - R // 2], D, seed=3)


class Recording:
    """A store whose reads are recorded (sizes of every ``peek``)."""

    def __init__(self, store):
        self.store, self.reads = store, []
        self.num_rows, self.dim, self.state_dim = store.num_rows, store.dim, store.state_dim

    def peek(self, rows):
        self.reads.append(len(rows))
        return self.store.peek(rows)

    def __getattr__(self, name):
        return getattr(self.store, name)


class Cached:
    """An overlay: rows with values of their own."""

    def __init__(self, rows, w, s):
        self.rows, self._w, self._s = rows, w, s

    def values(self, at):
        return self._w[at], self._s[at]


def _store(written: int, seed: int = 0) -> MemoryStore:
    rng = np.random.default_rng(seed)
    st = MemoryStore(_init(), S)
    rows = np.unique(rng.integers(0, R, written))
    st.write(rows, rng.standard_normal((len(rows), D)).astype(np.float32), rng.random((len(rows), S), np.float32))
    return st


@pytest.mark.parametrize("frac", [0.0, 0.002, 0.3, 1.0])
def test_bitmap_chunks_are_the_rows(frac):
    rng = np.random.default_rng(1)
    rows = np.arange(R) if frac == 1 else np.unique(rng.integers(0, R, int(R * frac)))
    bits = np.zeros((R + 7) // 8, np.uint8)
    set_bits(bits, rows)
    assert bits_count(bits) == len(rows)
    for chunk in (1, 13, 4096, 1 << 16):
        parts = list(bits_chunks(bits, R, chunk))
        assert all(len(p) == chunk for p in parts[:-1]) and all(0 < len(p) <= chunk for p in parts)
        got = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        assert np.array_equal(got, rows)


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("kind", ["delta", "full"])
def test_a_streamed_part_is_the_copys_part_and_reads_in_chunks(tmp_path, kind):
    everything = kind == "full"
    a, b = _store(20_000), _store(20_000)
    for st in (a, b):  # a first cut, then rows written since
        st.take_dirty()
        rng = np.random.default_rng(7)
        rows = np.unique(rng.integers(0, R, 5_000))
        st.write(rows, np.ones((len(rows), D), np.float32) * 2, np.zeros((len(rows), S), np.float32))
    rng = np.random.default_rng(9)
    cached = np.unique(rng.integers(0, R, 700))
    cw, cs = rng.standard_normal((len(cached), D)).astype(np.float32), rng.random((len(cached), S), np.float32)
    snap = take_snapshot(a, everything).overlay(cached, cw, cs)
    (tmp_path / "copy").mkdir()
    (tmp_path / "streamed").mkdir()
    p1 = write_part(tmp_path / "copy", snap, 0, 1, kind)
    rec = Recording(b)
    cut = RowCut.take(rec, everything, Cached(cached, cw, cs))
    assert cut.rows == len(snap.rows)
    p2 = cut.write(tmp_path / "streamed", 0, 1, kind, chunk_rows=1000, dirty_bytes=64 << 10)
    assert (p1.rows, p1.bytes, p1.sums) == (p2.rows, p2.bytes, p2.sums)
    assert _files(tmp_path / "copy") == _files(tmp_path / "streamed")
    assert rec.reads and max(rec.reads) <= 1000 and sum(rec.reads) == cut.rows
    assert np.array_equal(cut.snapshot(333).weights, snap.weights)


class FakeBackend:
    """A one-process backend whose cut comes from a recording store, under ``fit``."""

    def __init__(self, store, fit):
        self.rec, self.fit, self.snapshots = Recording(store), fit, 0

    def cut(self, everything):
        return RowCut.take(self.rec, everything)

    def snapshot(self, everything):
        self.snapshots += 1
        return take_snapshot(self.rec, everything)


def _fit(budget_bytes: int | None, chunk_rows: int, rest: int) -> Fit:
    rb = 4 * (D + S)
    io = DiskIO(chunk_rows=chunk_rows)
    sizes = Sizes(cache_rows=0, hot_rows=0, lookahead=0, staged=0, io=io)
    est = Estimate("trainer", (Part("the rest", rest), cut_part(R, rb, chunk_rows, 0)))
    return Fit(Budget(budget_bytes, "test"), sizes, est)


def _target(tmp_path) -> CutTarget:
    staging = tmp_path / "staging"
    staging.mkdir()
    return CutTarget(step=5, staging=staging, kind="full", base=None, chain=0, root=tmp_path)


def test_under_a_budget_that_does_not_hold_the_copy_the_cut_streams_within_its_part(tmp_path):
    chunk = 2048
    total = _fit(None, chunk, 100).estimate.total
    # a budget that leaves the cut its own part only: the copy (every written row) does not fit
    fit = _fit(math.ceil(total / (1 - MARGIN)) + 1, chunk, 100)
    part = fit.estimate.part(CUT)
    assert 0 <= cut_bytes(fit.estimate, fit.budget.usable or 0) - part < 64
    backend = FakeBackend(_store(R), fit)  # every row written: 50,000 rows, a copy of 2.4 MB
    assert RowCut.take(_store(R), True).nbytes() > part
    tracemalloc.start()
    try:
        writer = local_cut(5, backend, _target(tmp_path))  # the part is written here, at the cut
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(list((tmp_path / "staging").iterdir())) == 2  # ids and values written at the cut
    assert backend.snapshots == 0 and backend.rec.reads and max(backend.rec.reads) <= chunk
    assert peak <= part, (peak, part)
    reads = len(backend.rec.reads)
    (p,) = writer()
    assert len(backend.rec.reads) == reads and p.rows == bits_count(backend.rec.written_bits())


def test_under_a_budget_that_holds_the_copy_the_cut_copies_and_writes_later(tmp_path):
    fit = _fit(1 << 30, 2048, 0)
    backend = FakeBackend(_store(20_000), fit)
    writer = local_cut(5, backend, _target(tmp_path))
    assert not list((tmp_path / "staging").iterdir())  # nothing written at the cut: a copy
    assert backend.rec.reads and max(backend.rec.reads) <= 2048
    (p,) = writer()
    assert p.rows == len(backend.rec.written_rows())


def test_without_a_budget_the_cut_is_a_snapshot(tmp_path):
    fit = _fit(None, 2048, 0)
    backend = FakeBackend(_store(20_000), fit)
    writer = local_cut(5, backend, _target(tmp_path))
    assert backend.snapshots == 1 and not list((tmp_path / "staging").iterdir())
    (p,) = writer()
    assert p.rows == len(backend.rec.written_rows())
