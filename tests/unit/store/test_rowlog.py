"""The disk store's row log (bagpipe/store/rowlog.py): packed rows written back are appended
to a ring behind the table and read from there; a segment's live rows go home before it
is reused; the durable index (log.i32) never names a slot overwritten after it.

Every test uses a ring of a few dozen slots (``MIN_SEGMENT_SLOTS`` patched down) so that
it turns many times; a dict of the latest values is the reference.
"""

from __future__ import annotations

import errno
import json
import shutil
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bagpipe.errors import DataError
from bagpipe.store import rowlog
from bagpipe.store.disk import DiskStore, StoreFullError
from bagpipe.store.init import RowInitializer
from bagpipe.store.layout import RowLayout
from bagpipe.store.rowlog import SEGMENTS, RowLog

pytestmark = pytest.mark.unit

TABLES = [300, 500]
D, S = 4, 1
PACKED = np.array([17, 3, 499, 250, 301, 42, 7, 799, 600, 5, 11, 13, 400, 90, 91, 92, 93, 94, 95, 96])


@pytest.fixture
def small_ring(monkeypatch):
    """Segments of 3 slots: E = 24 for the 20 packed rows."""
    monkeypatch.setattr(rowlog, "MIN_SEGMENT_SLOTS", 3)


def make(tmp_path, name="st"):
    init = RowInitializer(TABLES, D, seed=3)
    return DiskStore(init, S, tmp_path / name, layout=RowLayout(PACKED)), init


def same(a, b) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


class Reference:
    """The latest (weights, state) of every row written; the rest read as initial, zero state."""

    def __init__(self, init):
        self.init = init
        self.rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def expect(self, rows):
        w = self.init.rows(np.asarray(rows, dtype=np.int64))
        s = np.zeros((len(rows), S), dtype=np.float32)
        for i, r in enumerate(np.asarray(rows).tolist()):
            if r in self.rows:
                w[i], s[i] = self.rows[r]
        return w, s


def write(store, ref, rng, rows):
    rows = np.asarray(rows, dtype=np.int64)
    w = rng.standard_normal((len(rows), D)).astype(np.float32)
    s = rng.standard_normal((len(rows), S)).astype(np.float32)
    store.write(rows, w, s)
    for i, r in enumerate(rows.tolist()):
        ref.rows[r] = (w[i].copy(), s[i].copy())


def test_the_ring_of_a_store_is_whole_segments_of_at_least_k_slots(tmp_path, small_ring):
    store, _ = make(tmp_path)
    header = json.loads((tmp_path / "st" / "header.json").read_text())
    store.close()
    assert header["layout"]["log_slots"] == SEGMENTS * 3 == 24 and header["layout"]["log_file"] == "log.i32"
    assert rowlog.log_slots(0) == 0 and rowlog.log_slots(25) == SEGMENTS * 4


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 20), st.integers(0, 2**31)), min_size=1, max_size=40))
def test_reads_give_the_latest_value_through_many_turns_of_the_ring(tmp_path_factory, steps):
    """Writes of packed and other rows, reads, flushes and reopenings in any order: every
    read (and read_range) equals the dict's, the ring turning many times."""
    rowlog.MIN_SEGMENT_SLOTS, keep = 3, rowlog.MIN_SEGMENT_SLOTS
    try:
        tmp = tmp_path_factory.mktemp("ring")
        store, init = make(tmp)
        ref = Reference(init)
        for kind, n, seed in steps:
            rng = np.random.default_rng(seed)
            pool = PACKED if seed % 3 else np.arange(init.num_rows)  # mostly packed rows
            rows = rng.choice(pool, size=min(n, len(pool)), replace=False)
            if kind in (0, 1):
                write(store, ref, rng, rows)
            elif kind == 2:
                store.flush()
            else:
                store.close()
                store = DiskStore(init, S, tmp / "st", create=False)
            every = np.arange(init.num_rows)
            w, s = store.read(every[::-1].copy())
            ew, es = ref.expect(every[::-1])
            assert same(w, ew) and same(s, es)
        rw, rs = store.read_range(0, init.num_rows)
        ew, es = ref.expect(np.arange(init.num_rows))
        assert same(rw, ew) and same(rs, es)
        store.close()
    finally:
        rowlog.MIN_SEGMENT_SLOTS = keep


def test_a_row_not_written_again_for_a_turn_goes_home(tmp_path, small_ring):
    """Row 17 written once, then 24 other packed-row writes (a whole turn): its value is at
    its home slot in the file and log.i32 says so after a flush."""
    store, init = make(tmp_path)
    ref = Reference(init)
    rng = np.random.default_rng(1)
    write(store, ref, rng, [17])
    others = [r for r in PACKED.tolist() if r != 17]
    for i in range(30):
        write(store, ref, rng, [others[i % len(others)]])
    store.flush()
    assert store._log.at[0] == -1  # 17 is packed row 0: at home
    raw = np.fromfile(tmp_path / "st" / "rows.f32", dtype=np.float32).reshape(-1, D + S)
    assert same(raw[0, :D], ref.rows[17][0]) and same(raw[0, D:], ref.rows[17][1])
    assert np.fromfile(tmp_path / "st" / "log.i32", dtype="<i4")[0] == 0
    w, _ = store.read(np.array([17]))
    assert same(w[0], ref.rows[17][0])
    store.close()


def test_a_copy_taken_between_flushes_never_reads_another_rows_value(tmp_path, small_ring):
    """A crash at any moment: the files as they are between two writes (no flush) -- every
    packed row of the copy reads its initial value or a value it was given, never a slot
    another row took since the index on disk was written."""
    store, init = make(tmp_path)
    history: dict[int, list[bytes]] = {r: [init.rows(np.array([r]))[0].tobytes()] for r in PACKED.tolist()}
    rng = np.random.default_rng(2)
    for step in range(60):
        rows = rng.choice(PACKED, size=int(rng.integers(1, 6)), replace=False)
        w = rng.standard_normal((len(rows), D)).astype(np.float32)
        store.write(rows, w, rng.standard_normal((len(rows), S)).astype(np.float32))
        for i, r in enumerate(rows.tolist()):
            history[r].append(w[i].tobytes())
        if step % 7 == 3:
            store.flush()
        if step % 5 == 4:
            copy = tmp_path / f"crash{step}"
            shutil.copytree(tmp_path / "st", copy)
            back = DiskStore(init, S, copy, create=False)
            got, _ = back.read(PACKED.copy())
            back.close()
            for i, r in enumerate(PACKED.tolist()):
                assert got[i].tobytes() in history[r], (step, r)
    store.close()


def test_reads_beside_a_writer_turning_the_ring_see_the_latest_values(tmp_path, small_ring):
    """One reader and one writer thread on disjoint rows (the store's contract): rows B,
    written once, move home while the writer turns the ring with rows A; every read of B
    gives B's values."""
    store, init = make(tmp_path)
    ref = Reference(init)
    rng = np.random.default_rng(4)
    b_rows, a_rows = PACKED[:8], PACKED[8:]
    write(store, ref, rng, b_rows)
    want_w, want_s = ref.expect(b_rows)
    bad: list[int] = []
    done = threading.Event()

    def reader():
        while not done.is_set():
            w, s = store.read(b_rows.copy())
            if not (same(w, want_w) and same(s, want_s)):
                bad.append(1)

    t = threading.Thread(target=reader)
    t.start()
    try:
        wrng = np.random.default_rng(5)
        for _ in range(300):
            rows = wrng.choice(a_rows, size=int(wrng.integers(1, len(a_rows))), replace=False)
            store.write(rows, np.ones((len(rows), D), np.float32), np.ones((len(rows), S), np.float32))
    finally:
        done.set()
        t.join()
    assert not bad
    assert (store._log.at[:8] == -1).all()  # every B row went home on the way
    store.close()


def test_a_damaged_log_index_or_header_is_refused_naming_the_file(tmp_path, small_ring):
    store, init = make(tmp_path)
    write(store, Reference(init), np.random.default_rng(0), PACKED[:3])
    store.close()
    f = tmp_path / "st" / "log.i32"
    good = f.read_bytes()
    at = np.frombuffer(good, dtype="<i4").copy()
    at[5] = 999  # a slot past the ring's 24
    f.write_bytes(at.tobytes())
    with pytest.raises(
        DataError, match=rf"^{f}: packed row 5 is at log slot 998, outside \[0, 24\): the file is damaged"
    ):
        DiskStore(init, S, tmp_path / "st", create=False)
    at[5] = at[0]  # two rows at one slot
    f.write_bytes(at.tobytes())
    with pytest.raises(DataError, match=rf"^{f}: two packed rows at one log slot: the file is damaged"):
        DiskStore(init, S, tmp_path / "st", create=False)
    f.write_bytes(good)
    h = tmp_path / "st" / "header.json"
    header = json.loads(h.read_text())
    header["layout"]["log_slots"] = 25
    h.write_text(json.dumps(header))
    with pytest.raises(DataError, match=rf"^{h}: layout.log_slots is 25, not a count of slots in whole segments"):
        DiskStore(init, S, tmp_path / "st", create=False)


def test_take_prepares_each_segment_once_before_its_slots_are_handed_out():
    log = RowLog(4, 8)  # segments of one slot
    pos, todo = log.take(3)
    assert pos.tolist() == [0, 1, 2] and todo == [(0, 1), (1, 2), (2, 3)]
    log.prepared()  # one of three: a write that failed now is taken again from slot 0
    pos, todo = log.take(3)
    assert pos.tolist() == [0, 1, 2] and todo == [(1, 2), (2, 3)]
    log.prepared()
    log.prepared()
    log.commit(np.array([0, 1, 2]), pos)
    pos, todo = log.take(6)  # wraps: slots 3..7 then 0
    assert pos.tolist() == [3, 4, 5, 6, 7, 0] and todo == [(3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (0, 1)]
    rows, at = log.live_in(0, 1)
    assert rows.tolist() == [0] and at.tolist() == [0]
    assert not log.durably_named(0, 1)
    snap = log.snapshot()
    log.made_durable(snap, log.changed(snap))
    assert log.durably_named(0, 1)
    with pytest.raises(ValueError, match="more than the log's 8 slots"):
        log.take(9)


def test_a_bulk_load_puts_rows_at_home_and_drops_their_log_copies(tmp_path, small_ring):
    """``load`` (a checkpoint's restore, a table made whole) writes packed rows at their
    home slots, never to the log; a row the log held reads the loaded value."""
    store, init = make(tmp_path)
    ref = Reference(init)
    rng = np.random.default_rng(6)
    write(store, ref, rng, PACKED[:5])
    assert (store._log.at[:5] >= 0).all()
    w = rng.standard_normal((7, D)).astype(np.float32)
    s = rng.standard_normal((7, S)).astype(np.float32)
    store.load(PACKED[2:9], w, s)
    assert (store._log.at[:2] >= 0).all() and (store._log.at[2:9] == -1).all()
    raw = np.fromfile(tmp_path / "st" / "rows.f32", dtype=np.float32).reshape(-1, D + S)
    assert same(raw[2:9, :D], w) and same(raw[2:9, D:], s)  # home slots 2..8
    for i, r in enumerate(PACKED[2:9].tolist()):
        ref.rows[r] = (w[i], s[i])
    got_w, got_s = store.read(PACKED.copy())
    want_w, want_s = ref.expect(PACKED)
    assert same(got_w, want_w) and same(got_s, want_s)
    store.close()


class _FailingMap:
    """A memory map whose msync fails (EIO): a flush that dies at that point."""

    def __init__(self, m):
        self.m = m

    def flush(self):
        raise OSError(errno.EIO, "Input/output error")


def put(store, rows, v: float) -> None:
    rows = np.asarray(rows, dtype=np.int64)
    store.write(rows, np.full((len(rows), D), v, np.float32), np.full((len(rows), S), v, np.float32))


@pytest.mark.parametrize("dies_at", ["log.i32", "present.u8"])
def test_a_flush_that_dies_midway_leaves_a_first_written_row_readable(tmp_path, small_ring, dies_at):
    """A packed row written for the first time lives only in the log (its home a hole): a
    crash after its present flag but before the index would read zeros, a value it never
    had. log.i32 is made durable before present.u8, so a crash at either msync reads the
    row as its initial or its written value (review of the row log, finding 1)."""
    store, init = make(tmp_path)
    put(store, [17], 7.0)
    real = store._maps[dies_at]
    store._maps[dies_at] = _FailingMap(real)
    with pytest.raises(OSError):
        store.flush()
    store._maps[dies_at] = real
    shutil.copytree(tmp_path / "st", tmp_path / "after")
    back = DiskStore(init, S, tmp_path / "after", create=False)
    w, s = back.read(np.array([17]))
    back.close()
    store.close()
    assert same(w[0], np.full(D, 7.0, np.float32)) or same(w[0], init.rows(np.array([17]))[0])


def test_a_write_whose_segment_could_not_be_prepared_prepares_it_again(tmp_path, small_ring):
    """A full disk while a segment's live rows are copied home fails that write (a
    StoreFullError); the next write must not take the segment's slots unprepared, which
    would overwrite a live row (finding 2)."""
    store, _ = make(tmp_path)
    E = store._log.capacity
    put(store, [3], 1.0)
    put(store, [17], 2.0)  # log position 1: the row watched
    put(store, [499], 3.0)
    for k in range(E - 3):  # the head to E: segment 0 (17's) is next
        put(store, [7], 100.0 + k)
    real = store._reservers["rows.f32"].reserve

    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    store._reservers["rows.f32"].reserve = full  # 17's home page is a hole: it needs blocks
    with pytest.raises(StoreFullError):
        put(store, [5], 50.0)
    store._reservers["rows.f32"].reserve = real
    put(store, [42, 11], 60.0)
    w, _ = store.read(np.array([17]))
    store.close()
    assert same(w[0], np.full(D, 2.0, np.float32))


def test_a_failed_flush_of_the_index_is_written_again_and_guards_the_ring(tmp_path, small_ring):
    """The index's msync fails after its entries were stored in the map (the kernel may
    still write them): those entries are in doubt -- the next flush writes them again and
    no segment is reused before it -- so a row the file may name is not overwritten and a
    clean close reads every row right (finding 3)."""
    store, init = make(tmp_path)
    put(store, [17], 2.0)  # log position 0
    real = store._maps["log.i32"]
    store._maps["log.i32"] = _FailingMap(real)
    with pytest.raises(OSError):
        store.flush()
    store._maps["log.i32"] = real
    for k in range(40):  # 17 goes home when the ring comes round to position 0
        put(store, [3], 10.0 + k)
        if k >= 30 and k % 5 == 0:
            store.flush()
    store.close()
    back = DiskStore(init, S, tmp_path / "st", create=False)
    w, _ = back.read(np.array([17, 3]))
    back.close()
    assert same(w[0], np.full(D, 2.0, np.float32)) and same(w[1], np.full(D, 49.0, np.float32))


def test_a_header_with_fewer_log_slots_than_packed_rows_is_refused(tmp_path, small_ring):
    store, init = make(tmp_path)
    store.close()
    h = tmp_path / "st" / "header.json"
    header = json.loads(h.read_text())
    header["layout"]["log_slots"] = 16  # whole segments, but fewer than the 20 packed rows
    h.write_text(json.dumps(header))
    with pytest.raises(DataError, match=rf"^{h}: layout.log_slots is 16, fewer than its 20 packed rows"):
        DiskStore(init, S, tmp_path / "st", create=False)


def test_a_row_moving_home_waits_for_a_read_that_found_it_in_the_log(tmp_path, small_ring):
    """The reader holds the log's lock from finding a row's slot to gathering it: a writer
    preparing that slot's segment (copying the row home, then overwriting the slot) waits
    for it. Made deterministic: the read stops between the two until the writer has had
    half a second; without the lock the writer overwrites the slot first and the read
    returns another row's value."""
    store, _ = make(tmp_path)
    E = store._log.capacity
    put(store, [17], 2.0)  # log position 0
    for k in range(E - 1):  # the head to E: the next write prepares segment 0
        put(store, [7], 100.0 + k)
    found, go = threading.Event(), threading.Event()
    gather = store._gather_sorted
    reader = None

    def stalled(*args):
        if threading.current_thread() is reader:
            found.set()
            go.wait(10)
        return gather(*args)

    store._gather_sorted = stalled
    got: dict[str, np.ndarray] = {}
    reader = threading.Thread(target=lambda: got.setdefault("w", store.read(np.array([17]))[0]))
    reader.start()
    assert found.wait(10)
    writer = threading.Thread(target=lambda: put(store, [3, 42, 11], 60.0))  # takes slots 0..2
    writer.start()
    writer.join(0.5)
    go.set()
    reader.join(10)
    writer.join(10)
    store.close()
    assert same(got["w"][0], np.full(D, 2.0, np.float32))
