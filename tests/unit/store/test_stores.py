"""The embedding stores keep exactly what they are given and nothing else.

For both :class:`MemoryStore` and :class:`DiskStore` (parametrised) this proves:
rows never written read as :meth:`RowInitializer.rows` bit for bit with zero state;
a write followed by a read returns exactly the written bits, in the caller's order,
for unsorted unique rows; rows not written keep their initial value; the stats count
rows; ``read_range`` over written and unwritten rows is what it should be; and a
hypothesis property test runs random write/read/read_range sequences against both
stores and a plain dict, which must agree bit for bit.

For :class:`DiskStore` alone: data persists across close/reopen (and ``create=False``
reopens), a header that does not match the requested shape or seed raises
:class:`DataError`, and so does a store of the old (version 1) layout; a row's weights
and state sit side by side in ``rows.f32``; the files are sparse (a 10M-row store with
a few rows written allocates far less than its size), and a reader thread and a
writer thread working on disjoint rows at the same time both see correct results.

For both stores and the full tables: ``written_rows`` is exactly the rows written (or
loaded) -- reads, also of rows never written, add none -- and ``reset`` returns rows to
their initial value (durably for the disk store); the digest computed from the written
rows alone equals the plain reference over every row, counts a row written back with its
initial value as never written, and differs when one bit of a row does.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bagpipe.errors import DataError
from bagpipe.store.disk import DiskStore
from bagpipe.store.init import RowInitializer
from bagpipe.store.layout import RowLayout
from bagpipe.store.memory import MemoryStore
from bagpipe.store.rowlog import SEGMENTS, log_slots

pytestmark = pytest.mark.unit

TABLES = [700, 50, 1250]
D = 8


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(bits(a), bits(b))


def packed_layout(num_rows: int) -> RowLayout:
    """A frequency layout's shape: a few hundred rows from all over the table, hottest first
    (the first and last rows among them: the edges of read_range)."""
    rows = np.random.default_rng(99).permutation(num_rows)[:300]
    return RowLayout(np.concatenate([[num_rows - 1, 0], rows[(rows != 0) & (rows != num_rows - 1)]]))


def make(kind: str, init: RowInitializer, state_dim: int, path) -> MemoryStore | DiskStore:
    if kind == "memory":
        return MemoryStore(init, state_dim)
    layout = packed_layout(init.num_rows) if kind == "disk-packed" else None
    return DiskStore(init, state_dim, path, threads=4, layout=layout)


@pytest.fixture(params=["memory", "disk", "disk-packed"])
def kind(request):
    return request.param


@pytest.fixture(params=[0, 1, 3], ids=lambda s: f"S{s}")
def state_dim(request):
    return request.param


@pytest.fixture
def store(kind, state_dim, tmp_path):
    s = make(kind, RowInitializer(TABLES, D, seed=7), state_dim, tmp_path / "store")
    yield s
    s.close()


def values(rng, n, d):
    return rng.standard_normal((n, d)).astype(np.float32)


def test_unread_rows_are_initial_values(store):
    rows = np.random.default_rng(0).permutation(store.num_rows)[:500]
    w, s = store.read(rows)
    assert same_bits(w, store.init.rows(rows))
    assert s.shape == (500, store.state_dim) and not s.any()


def test_write_then_read_in_callers_order(store):
    rng = np.random.default_rng(1)
    rows = rng.permutation(store.num_rows)[:300]  # unique, unsorted
    w, s = values(rng, 300, D), values(rng, 300, store.state_dim)
    store.write(rows, w, s)
    # read back a different permutation, mixing in rows never written
    fresh = np.setdiff1d(np.arange(store.num_rows), rows)[:100]
    ask = rng.permutation(np.concatenate([rows, fresh]))
    got_w, got_s = store.read(ask)
    pos = {int(r): i for i, r in enumerate(rows)}
    for j, r in enumerate(ask.tolist()):
        if r in pos:
            assert same_bits(got_w[j], w[pos[r]]) and same_bits(got_s[j], s[pos[r]])
        else:
            assert same_bits(got_w[j], store.init.rows(np.array([r]))[0])
            assert not got_s[j].any()


def test_a_row_asked_twice_reads_its_own_value_each_time(store):
    """A sorted read of [4, 5, 5, 7] once passed the disk store's contiguous-run test (7 - 4 = 3
    rows after 4) and gave the second 5 row 6's value."""
    rng = np.random.default_rng(4)
    rows = np.arange(3, 9)
    w, s = values(rng, 6, D), values(rng, 6, store.state_dim)
    store.write(rows, w, s)
    for ask in ([4, 5, 5, 7], [7, 5, 4, 5], [5, 5], [8, 3, 3, 3, 8]):
        got_w, got_s = store.read(np.array(ask))
        assert same_bits(got_w, w[np.array(ask) - 3]) and same_bits(got_s, s[np.array(ask) - 3]), ask


def test_stats_count_rows(store):
    rng = np.random.default_rng(2)
    store.read(np.array([5, 3, 9]))
    store.write(np.array([4, 2]), values(rng, 2, D), values(rng, 2, store.state_dim))
    store.read(np.array([1]))
    store.write(np.array([], dtype=np.int64), values(rng, 0, D), values(rng, 0, store.state_dim))
    store.read_range(0, 100)  # not a training read
    assert store.stats.as_dict() == {"reads": 2, "rows_read": 4, "writes": 1, "rows_written": 2}


def test_read_range_mixes_written_and_initial(store):
    rng = np.random.default_rng(3)
    rows = rng.choice(np.arange(600, 900), 120, replace=False)
    w, s = values(rng, 120, D), values(rng, 120, store.state_dim)
    store.write(rows, w, s)
    ew = store.init.range(650, 880)
    es = np.zeros((230, store.state_dim), np.float32)
    inside = (rows >= 650) & (rows < 880)
    ew[rows[inside] - 650] = w[inside]
    es[rows[inside] - 650] = s[inside]
    gw, gs = store.read_range(650, 880)
    assert same_bits(gw, ew) and same_bits(gs, es)
    gw, gs = store.read_range(10, 10)
    assert gw.shape == (0, D) and gs.shape == (0, store.state_dim)


# ---------------------------------------------------------------- property test

SMALL = [40, 9, 71]
N_SMALL = sum(SMALL)

op = st.one_of(
    st.tuples(
        st.just("write"),
        st.lists(st.integers(0, N_SMALL - 1), min_size=1, max_size=40, unique=True),
        st.integers(0, 2**32 - 1),
    ),
    st.tuples(
        st.just("read"), st.lists(st.integers(0, N_SMALL - 1), min_size=0, max_size=60), st.just(0)
    ),  # repeats too
    st.tuples(st.just("range"), st.tuples(st.integers(0, N_SMALL), st.integers(0, N_SMALL)), st.just(0)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(op, max_size=25),
    state_dim=st.sampled_from([0, 1, 2]),
    seed=st.integers(0, 3),
    packed=st.lists(st.integers(0, N_SMALL - 1), min_size=1, max_size=N_SMALL, unique=True),
)
def test_random_operations_agree_with_a_dict(ops, state_dim, seed, packed):
    """The memory store, the disk store and a disk store with a row layout (any rows
    packed at the front of its file, in any order) against a dict, then reopened."""
    init = RowInitializer(SMALL, 4, seed)
    ref: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def expect(rows):
        w = (
            np.stack([ref[r][0] if r in ref else init.rows(np.array([r]))[0] for r in rows])
            if rows
            else np.zeros((0, 4), np.float32)
        )
        s = (
            np.stack([ref[r][1] if r in ref else np.zeros(state_dim, np.float32) for r in rows])
            if rows
            else np.zeros((0, state_dim), np.float32)
        )
        return w.reshape(len(rows), 4), s.reshape(len(rows), state_dim)

    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as d2:
        stores = [
            MemoryStore(init, state_dim),
            DiskStore(init, state_dim, d, threads=3),
            DiskStore(init, state_dim, d2, threads=3, layout=RowLayout(np.array(packed))),
        ]
        try:
            for kind, arg, vseed in ops:
                if kind == "write":
                    rng = np.random.default_rng(vseed)
                    w, s = values(rng, len(arg), 4), values(rng, len(arg), state_dim)
                    for store in stores:
                        store.write(np.array(arg, dtype=np.int64), w, s)
                    for i, r in enumerate(arg):
                        ref[r] = (w[i].copy(), s[i].copy())
                elif kind == "read":
                    ew, es = expect(arg)
                    for store in stores:
                        gw, gs = store.read(np.array(arg, dtype=np.int64))
                        assert same_bits(gw, ew) and same_bits(gs, es)
                else:
                    a, b = sorted(arg)
                    ew, es = expect(list(range(a, b)))
                    for store in stores:
                        gw, gs = store.read_range(a, b)
                        assert same_bits(gw, ew) and same_bits(gs, es)
            ew, es = expect(list(range(N_SMALL)))
            for store in stores:
                gw, gs = store.read_range(0, N_SMALL)
                assert same_bits(gw, ew) and same_bits(gs, es)
            for i, path in ((1, d), (2, d2)):
                stores[i].close()
                reopened = DiskStore(init, state_dim, path, create=False, threads=2)  # its own layout
                assert np.array_equal(reopened.layout.packed, (np.array(packed) if i == 2 else np.zeros(0)))
                gw, gs = reopened.read_range(0, N_SMALL)
                assert same_bits(gw, ew) and same_bits(gs, es)
                gw, gs = reopened.read(np.arange(N_SMALL)[::-1].copy())
                reopened.close()
                assert same_bits(gw, ew[::-1]) and same_bits(gs, es[::-1])
        finally:
            for store in stores:
                store.close()


# ---------------------------------------------------------------- DiskStore only


def test_disk_persists_across_reopen(tmp_path):
    init = RowInitializer(TABLES, D, seed=11)
    rng = np.random.default_rng(4)
    rows = rng.permutation(init.num_rows)[:200]
    w, s = values(rng, 200, D), values(rng, 200, 1)
    with DiskStore(init, 1, tmp_path / "st") as store:
        store.write(rows, w, s)
        before = store.read_range(0, init.num_rows)
    for create in (True, False):  # same path with create=True reopens, never truncates
        with DiskStore(init, 1, tmp_path / "st", create=create) as store:
            gw, gs = store.read(rows)
            assert same_bits(gw, w) and same_bits(gs, s)
            after = store.read_range(0, init.num_rows)
            assert same_bits(after[0], before[0]) and same_bits(after[1], before[1])


def test_disk_header_mismatch_raises(tmp_path):
    path = tmp_path / "st"
    DiskStore(RowInitializer(TABLES, D, seed=1), 1, path).close()
    bad = {
        "dim": (RowInitializer(TABLES, D * 2, seed=1), 1),
        "state_dim": (RowInitializer(TABLES, D, seed=1), 0),
        "num_rows": (RowInitializer(TABLES + [5], D, seed=1), 1),
        "seed": (RowInitializer(TABLES, D, seed=2), 1),
        "table_sizes": (RowInitializer([1250, 50, 700], D, seed=1), 1),
    }
    for field, (init, sd) in bad.items():
        with pytest.raises(DataError, match=field):
            DiskStore(init, sd, path)
    with pytest.raises(DataError, match="no DiskStore"):
        DiskStore(RowInitializer(TABLES, D, seed=1), 1, tmp_path / "missing", create=False)
    # a truncated data file is caught too
    os.truncate(path / "rows.f32", 100)
    with pytest.raises(DataError, match="bytes, expected"):
        DiskStore(RowInitializer(TABLES, D, seed=1), 1, path)


@pytest.mark.parametrize("state_dim", [0, 1, 3], ids=lambda s: f"S{s}")
def test_disk_row_weights_and_state_side_by_side(tmp_path, state_dim):
    init = RowInitializer(TABLES, D, seed=12)
    rng = np.random.default_rng(13)
    rows = rng.permutation(np.setdiff1d(np.arange(init.num_rows), np.arange(1000, 1100)))[:200]
    w, s = values(rng, 300, D), values(rng, 300, state_dim)
    with DiskStore(init, state_dim, tmp_path / "st") as store:
        store.write(rows[:200], w[:200], s[:200])  # scattered through the memory map
        run = np.arange(1000, 1100)  # a contiguous run: one pwrite
        store.write(run, w[200:], s[200:])
        store.flush()
        raw = np.fromfile(tmp_path / "st" / "rows.f32", dtype=np.float32)
        assert raw.size == init.num_rows * (D + state_dim)
        raw = raw.reshape(init.num_rows, D + state_dim)
        # row g is its D weights then its S state values, at byte offset g * 4 * (D + S)
        assert same_bits(raw[rows[:200], :D], w[:200]) and same_bits(raw[rows[:200], D:], s[:200])
        assert same_bits(raw[run, :D], w[200:]) and same_bits(raw[run, D:], s[200:])
        g = int(rows[7])
        with open(tmp_path / "st" / "rows.f32", "rb") as f:
            f.seek(g * 4 * (D + state_dim))
            one = np.frombuffer(f.read(4 * (D + state_dim)), dtype=np.float32)
        assert same_bits(one, np.concatenate([w[7], s[7]]))
        # rows never written stay holes (zeros) in the file
        never = np.setdiff1d(np.arange(init.num_rows), np.concatenate([rows[:200], run]))
        assert not raw[never].any()
        # read returns separate C-contiguous float32 arrays
        gw, gs = store.read(rows[:200])
        for a, cols in ((gw, D), (gs, state_dim)):
            assert a.dtype == np.float32 and a.flags.c_contiguous and a.shape == (200, cols)
        gw, gs = store.read(run)  # sorted, all present: the no-reorder path
        assert gw.flags.c_contiguous and gs.flags.c_contiguous
        assert same_bits(gw, w[200:]) and same_bits(gs, s[200:])
        gw, gs = store.read_range(1000, 1100)
        assert gw.flags.c_contiguous and gs.flags.c_contiguous
        assert same_bits(gw, w[200:]) and same_bits(gs, s[200:])


def test_disk_old_layout_version_raises(tmp_path):
    init = RowInitializer(TABLES, D, seed=1)
    path = tmp_path / "st"
    DiskStore(init, 1, path).close()
    # turn it into a version-1 store: header version 1, weights and state in two files
    header = json.loads((path / "header.json").read_text())
    assert header["version"] == 2
    header["version"] = 1
    (path / "header.json").write_text(json.dumps(header))
    (path / "rows.f32").unlink()
    with open(path / "weights.f32", "wb") as f:
        f.truncate(init.num_rows * D * 4)
    with open(path / "state.f32", "wb") as f:
        f.truncate(init.num_rows * 4)
    for create in (True, False):
        with pytest.raises(DataError, match="version 1.*recreate"):
            DiskStore(init, 1, path, create=create)
    # nothing was overwritten or created
    assert sorted(p.name for p in path.iterdir()) == ["header.json", "present.u8", "state.f32", "weights.f32"]
    assert json.loads((path / "header.json").read_text())["version"] == 1


def test_a_packed_layout_puts_its_rows_at_the_front_of_the_file(tmp_path):
    """Row layout (format version 3): the K packed rows have their home at slots 0..K-1 in
    their order, every other row g is at slot K + g; a packed row written goes to the row
    log behind them (slots num_rows + K + p, p from log.i32 as p + 1, written by the
    flush), whole rows in the order written; the file has num_rows + K + E slots;
    layout.i64 holds the packed rows and the header their count, CRC-32 and E; a store
    without a layout stays version 2 (what earlier bagpipes read)."""
    init = RowInitializer(TABLES, D, seed=5)
    R, S = init.num_rows, 1
    packed = np.array([1999, 3, 1000, 7])
    store = DiskStore(init, S, tmp_path / "st", layout=RowLayout(packed))
    rng = np.random.default_rng(8)
    rows = np.array([7, 3, 5, 1000, 1999, 1998])
    w, s = values(rng, 6, D), values(rng, 6, S)
    store.write(rows, w, s)
    store.close()
    header = json.loads((tmp_path / "st" / "header.json").read_text())
    E = header["layout"]["log_slots"]
    assert E == log_slots(4) and E % SEGMENTS == 0 and E >= 4
    raw = np.fromfile(tmp_path / "st" / "rows.f32", dtype=np.float32).reshape(R + 4 + E, D + S)
    at = np.fromfile(tmp_path / "st" / "log.i32", dtype="<i4")
    # packed rows 7, 3, 1000, 1999 (their home slots 3, 1, 2, 0) were written in row order
    # (3, 7, 1000, 1999) to log positions 0..3
    assert at.tolist() == [4, 1, 3, 2]
    slot = {3: R + 4 + 0, 7: R + 4 + 1, 1000: R + 4 + 2, 1999: R + 4 + 3, 5: 4 + 5, 1998: 4 + 1998}
    for i, r in enumerate(rows.tolist()):
        assert same_bits(raw[slot[r], :D], w[i]) and same_bits(raw[slot[r], D:], s[i])
    assert not raw[:4].any()  # the packed rows' homes: not written yet (the log holds them)
    assert not raw[4 + 1999].any() and not raw[4 + 3].any()  # a packed row's own slot: a hole
    assert header["version"] == 3 and header["layout"]["packed_rows"] == 4
    assert np.array_equal(np.fromfile(tmp_path / "st" / "layout.i64", dtype="<i8"), packed)
    back = DiskStore(init, S, tmp_path / "st", create=False)
    assert np.array_equal(back.layout.packed, packed)
    gw, gs = back.read(rows[::-1].copy())
    back.close()
    assert same_bits(gw, w[::-1]) and same_bits(gs, s[::-1])
    DiskStore(init, S, tmp_path / "plain").close()
    assert json.loads((tmp_path / "plain" / "header.json").read_text())["version"] == 2
    assert not (tmp_path / "plain" / "layout.i64").exists()


def test_a_damaged_or_missing_layout_file_is_refused_naming_it(tmp_path):
    init = RowInitializer(TABLES, D, seed=5)
    DiskStore(init, 0, tmp_path / "st", layout=RowLayout(np.array([5, 9, 2]))).close()
    f = tmp_path / "st" / "layout.i64"
    good = f.read_bytes()
    f.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(DataError, match=rf"^{f}: its CRC-32 is [0-9a-f]{{8}}, the store's header says [0-9a-f]{{8}}"):
        DiskStore(init, 0, tmp_path / "st")
    f.write_bytes(good[:8])
    with pytest.raises(DataError, match=rf"^{f}: DiskStore file is 8 bytes, expected 24$"):
        DiskStore(init, 0, tmp_path / "st")
    f.unlink()
    with pytest.raises(DataError, match=rf"^{f}: DiskStore file missing"):
        DiskStore(init, 0, tmp_path / "st")
    with pytest.raises(DataError, match="packed row 2000 outside the table's 2,000 rows"):
        DiskStore(init, 0, tmp_path / "new", layout=RowLayout(np.array([3, 2000])))
    with pytest.raises(ValueError, match="packed rows must be unique"):
        RowLayout(np.array([3, 4, 3]))


def test_layout_slots_and_the_frequency_order():
    from bagpipe.store.layout import frequency_layout

    ident = RowLayout.identity()
    rows = np.array([4, 0, 9])
    assert ident.slots(rows) is rows and ident.slot_count(10) == 10
    lay = frequency_layout(np.array([2, 5, 7, 8]), np.array([3, 9, 3, 1]), max_rows=3)
    assert lay.packed.tolist() == [5, 2, 7]  # most used first; a tie: the lower row first; at most 3
    assert lay.slots(np.array([7, 5, 0, 2, 8, 9])).tolist() == [2, 0, 3, 1, 11, 12]
    assert lay.slot_count(10) == 13
    got = lay.packed_in(2, 7)
    assert got[0].tolist() == [2, 5] and got[1].tolist() == [1, 0]


def test_layout_and_io_settings_refuse_what_they_cannot_mean(tmp_path):
    from bagpipe.store.diskio import DiskIO
    from bagpipe.store.layout import frequency_layout

    with pytest.raises(ValueError, match="max_rows must be >= 0"):
        frequency_layout(np.array([1, 2]), np.array([5, 3]), max_rows=-1)
    for bad in ({"chunk_rows": 0}, {"threads": 0}, {"hint_bytes": -1}, {"dirty_bytes": 0}, {"page_cache_bytes": -5}):
        with pytest.raises(ValueError, match=f"DiskIO.{next(iter(bad))} must be"):
            DiskIO(**bad)
    a, b = RowLayout(np.array([3, 1])), RowLayout(np.array([3, 1]))
    assert a == a and a != b and len({a, b}) == 2  # compared as objects: == over the array raised


def test_a_layout_is_made_only_for_a_store_made_here(tmp_path):
    """The frequency layout is a pass over the train split: made under the opener's lock, only
    when a store is created (a reopened store keeps its own; a refused one costs nothing)."""
    init = RowInitializer(TABLES, D, seed=1)
    made: list[int] = []

    def layout() -> RowLayout:
        made.append(1)
        return RowLayout(np.array([7, 3]))

    with DiskStore(init, 0, tmp_path / "st", layout=layout) as store:
        assert store.layout.packed.tolist() == [7, 3]
    with DiskStore(init, 0, tmp_path / "st", layout=layout) as store:  # reopened: its own layout
        assert store.layout.packed.tolist() == [7, 3]
    assert made == [1]


def test_the_layouts_peak_memory_is_within_the_budgets_part(tiny_data):
    """`plan`'s "store layout" part (budget.shape.layout_bytes) against the peak that counting
    the split and ordering its rows allocate, measured (NumPy reports to tracemalloc)."""
    import tracemalloc

    from bagpipe.budget.shape import layout_bytes
    from bagpipe.data.frequency import row_use_counts
    from bagpipe.data.shards import Dataset
    from bagpipe.store.layout import LayoutChoice, frequency_layout

    dataset = Dataset(tiny_data)
    tracemalloc.start()
    try:
        rows, counts = row_use_counts(dataset)
        counting = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        frequency_layout(rows, counts, max_rows=len(rows))
        ordering = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    n, used = dataset.meta.total_rows, len(rows)
    per_sample = dataset.meta.num_features  # one-hot tiny: a lookup a feature
    part = layout_bytes(LayoutChoice("frequency", "made here"), n, used, per_sample)
    assert counting <= part and ordering <= part, (counting, ordering, part)
    assert counting >= part - (2 << 20) or ordering >= part - (2 << 20)  # not a wide guess either


def test_lookup_counts_saturate_instead_of_wrapping():
    from bagpipe.data.frequency import count_lookups

    top = np.iinfo(np.uint32).max
    counts = np.array([top - 1, 5, 0], dtype=np.uint32)
    count_lookups(counts, np.array([[0, 0, 0], [1, 2, 0]]))
    assert counts.tolist() == [top, 6, 1]  # row 0: 4 more lookups would have wrapped to 2


def test_an_identity_store_made_where_a_stopped_making_left_a_layout_file_removes_it(tmp_path):
    init = RowInitializer(TABLES, D, seed=1)
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "layout.i64").write_bytes(b"\0" * 16)  # no header: a making that was stopped
    with DiskStore(init, 0, tmp_path / "st") as store:
        assert store.layout.is_identity
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == ["header.json", "present.u8", "rows.f32"]
    from bagpipe.store.disk import layout_name

    assert layout_name(tmp_path / "st") == "identity"
    with DiskStore(init, 0, tmp_path / "st2", layout=RowLayout(np.array([5, 2]))):
        pass
    assert layout_name(tmp_path / "st2") == "frequency"


def test_disk_files_are_sparse(tmp_path):
    init = RowInitializer([6_000_000, 4_000_000], 16, seed=3)
    rng = np.random.default_rng(5)
    rows = rng.choice(init.num_rows, 50, replace=False)
    with DiskStore(init, 1, tmp_path / "big") as store:
        store.write(rows, values(rng, 50, 16), values(rng, 50, 1))
        store.flush()
        files = sorted(p.name for p in (tmp_path / "big").iterdir())
        assert files == ["header.json", "present.u8", "rows.f32"], files
        logical = sum(os.stat(tmp_path / "big" / f).st_size for f in ("rows.f32", "present.u8"))
        allocated = sum(os.stat(tmp_path / "big" / f).st_blocks * 512 for f in ("rows.f32", "present.u8"))
        assert logical == 10_000_000 * (64 + 4 + 1)
        assert sum(store.disk_usage().values()) == allocated
        assert allocated < 4 * 1024 * 1024, allocated  # 50 rows touch <= 150 blocks of 4 KiB
        gw, _ = store.read(rows)
        assert store.read(np.array([0, init.num_rows - 1]))[0].shape == (2, 16)
    with pytest.raises(IndexError):
        with DiskStore(init, 1, tmp_path / "big") as store:
            store.read(np.array([init.num_rows]))


def test_disk_rejects_duplicate_rows_in_a_write(tmp_path):
    with DiskStore(RowInitializer(TABLES, D, seed=1), 0, tmp_path / "st") as store:
        with pytest.raises(ValueError, match="unique"):
            store.write(np.array([3, 9, 3]), np.zeros((3, D), np.float32), np.zeros((3, 0), np.float32))


def test_disk_concurrent_reader_and_writer_on_disjoint_rows(tmp_path):
    init = RowInitializer([40_000, 24_000], D, seed=9)
    rng = np.random.default_rng(6)
    rows = rng.permutation(init.num_rows)
    read_rows, write_rows = rows[:20_000], rows[20_000:40_000]
    base_w, base_s = values(rng, 20_000, D), values(rng, 20_000, 1)
    errors: list[str] = []
    rounds = 30

    def wvals(k):  # round k's value of write_rows: recognisable, distinct per round
        return np.full((len(write_rows), D), k, np.float32) + np.arange(D, dtype=np.float32), np.full(
            (len(write_rows), 1), -k, np.float32
        )

    with DiskStore(init, 1, tmp_path / "st", threads=8) as store:
        store.write(read_rows, base_w, base_s)

        def reader():
            r = np.random.default_rng(7)
            for _ in range(rounds):
                pick = r.permutation(20_000)[:5000]
                gw, gs = store.read(read_rows[pick])
                if not (same_bits(gw, base_w[pick]) and same_bits(gs, base_s[pick])):
                    errors.append("reader saw wrong values")
                # also rows never written (beyond 40_000 in the permutation)
                gw, _ = store.read(rows[40_000:41_000])
                if not same_bits(gw, init.rows(rows[40_000:41_000])):
                    errors.append("reader saw wrong initial values")

        def writer():
            for k in range(rounds):
                store.write(write_rows, *wvals(k))

        threads = [threading.Thread(target=reader), threading.Thread(target=writer)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        gw, gs = store.read(write_rows)
        ew, es = wvals(rounds - 1)
        assert same_bits(gw, ew) and same_bits(gs, es)


def test_disk_drop_page_cache_keeps_data(tmp_path):
    init = RowInitializer(TABLES, D, seed=2)
    rng = np.random.default_rng(8)
    rows = rng.permutation(init.num_rows)[:500]
    w = values(rng, 500, D)
    with DiskStore(init, 0, tmp_path / "st") as store:
        store.write(rows, w, np.zeros((500, 0), np.float32))
        store.drop_page_cache()
        assert same_bits(store.read(rows)[0], w)
    store.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        store.read(rows)


def test_written_rows_are_the_rows_written_and_reset_forgets_them(store, tmp_path):
    rng = np.random.default_rng(3)
    S = store.state_dim
    store.read(np.array([5, 900, 1999]))  # reads write nothing
    store.peek(np.array([6, 7]))
    store.write(np.array([40, 3, 1500]), values(rng, 3, D), values(rng, 3, S))
    store.load(np.array([77]), values(rng, 1, D), values(rng, 1, S))
    assert store.written_rows().tolist() == [3, 40, 77, 1500]
    store.reset(np.array([40, 77]))
    assert store.written_rows().tolist() == [3, 1500]
    w, s = store.read(np.array([40, 77]))
    assert same_bits(w, store.init.rows(np.array([40, 77]))) and not s.any()
    if isinstance(store, DiskStore):  # durable: a reopened store agrees
        store.close()
        again = DiskStore(store.init, S, store.path)
        assert again.written_rows().tolist() == [3, 1500]
        again.close()


def test_the_digest_of_the_written_rows_equals_the_digest_of_every_row(tmp_path):
    import torch

    from bagpipe.train.backends import FullBackend
    from bagpipe.train.rundir import digest_of, every_row

    init = RowInitializer(TABLES, D, seed=7)
    model = torch.nn.Linear(3, 1)
    rng = np.random.default_rng(0)
    rows = np.array([2, 10, 1999])
    w, s = values(rng, 3, D), values(rng, 3, 1)
    mem, disk, full = MemoryStore(init, 1), DiskStore(init, 1, tmp_path / "d"), FullBackend(init, 1)
    for target in (mem, disk, full):
        target.load(rows, w, s)
    # one of them also wrote a row back with its initial value: still equal parameters
    mem.write(np.array([500]), init.rows(np.array([500])), np.zeros((1, 1), np.float32))
    digests = set()
    for target in (mem, disk, full):
        chunks = [
            (np.arange(a, a + len(cw)), cw, cs)
            for a, cw, cs in (target.chunks() if hasattr(target, "chunks") else target.export())
        ]
        touched = target.written_rows()
        wt, st_ = target.peek(touched)
        fast = digest_of(model, init, 1, iter([(touched, wt, st_)]))
        reference = digest_of(model, init, 1, every_row(iter([(a[0], cw, cs) for a, cw, cs in chunks])))
        assert fast == reference
        digests.add(fast)
    assert len(digests) == 1  # equal parameters, equal digests, whatever each wrote
    w2 = w.copy()
    w2.view(np.uint32)[1, 4] ^= 1  # one bit of one row
    mem.load(rows, w2, s)
    wt, st_ = mem.peek(mem.written_rows())
    assert digest_of(model, init, 1, iter([(mem.written_rows(), wt, st_)])) not in digests
    disk.close()
