"""The checkpoint format (``bagpipe/checkpoint/``), checked on hand-made stores.

* A full checkpoint written by S shards reads back, bit for bit, as every row in
  order, and as the rows of any shard of any other S' (re-partitioning); it holds only
  the rows written since initialisation (its bytes are those rows'), the others read as
  their initial value.
* Delta checkpoints hold exactly the rows written since the previous checkpoint; a
  chain of deltas on a full base reads back as the latest values; every
  ``compact_every``-th checkpoint is full again, merged from the chain (the rows of the
  chain plus those written since, nothing else).
* A checkpoint counts only once committed: a staged folder without its manifest is
  never the latest, a later commit removes it, and pruning keeps the newest
  checkpoints and every checkpoint their chains rest on.
* A restore loads the checkpoint's rows and returns every other row the target wrote to
  its initial value (memory and disk stores, the full tables).
* Version 2 checkpoints (every row in a full part) still read, also under a version-4
  delta; another version is refused in one line.
* Version 4 records every file's size and CRC-32 (summed as it was written); version 3
  (no checksums) still reads, checked by size.
* Version 5 records the CRC-32 of the manifest's own content: an edit that keeps valid
  JSON (step, seed, dim, state_dim, the version itself one digit off) is a one-line
  "damaged checkpoint file" naming MANIFEST.json, and so is a version-5 manifest without
  its sum; a version-4 manifest (written before, no sum) still reads.
* A broken chain or a missing part is a one-line CheckpointError.
* A part that does not fit its disk fails with ENOSPC before writing anything (a real
  full filesystem: a small tmpfs; skipped where none can be mounted); the writer then
  discards it, says so in one line, keeps the previous checkpoint as the latest, and
  makes the next one full.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from bagpipe.checkpoint import (
    Checkpoint,
    CheckpointFolder,
    CheckpointReader,
    CheckpointWriter,
    InitialRows,
    Manifest,
    RowSpace,
    restore_rows,
    take_snapshot,
    write_part,
)
from bagpipe.distributed.server import ShardInit
from bagpipe.errors import CheckpointError
from bagpipe.store.disk import DiskStore
from bagpipe.store.init import RowInitializer
from bagpipe.store.memory import MemoryStore

pytestmark = pytest.mark.unit

SIZES = [37, 11, 52]  # 100 rows
D, S_STATE = 4, 1
SEED = 3
SPACE = RowSpace(sum(SIZES), D, S_STATE, InitialRows(SEED, SIZES))
ROW_BYTES = 8 + 4 * (D + S_STATE)  # a stored row: its id and its values


def newest(folder: CheckpointFolder) -> Checkpoint:
    """The folder's latest checkpoint (the test has committed one)."""
    ck = folder.latest()
    assert ck is not None, f"{folder.root}: no committed checkpoint"
    return ck


def stores(shards: int) -> list[MemoryStore]:
    init = RowInitializer(SIZES, D, seed=SEED)
    return [MemoryStore(ShardInit(init, k, shards) if shards > 1 else init, S_STATE) for k in range(shards)]


def write_rows(shard_stores: list[MemoryStore], rows: np.ndarray, tag: float) -> None:
    """Write global ``rows`` (values derived from ``tag``) into the shards that own them."""
    S = len(shard_stores)
    for k, st in enumerate(shard_stores):
        mine = rows[rows % S == k]
        if len(mine):
            st.write(
                mine // S,
                np.full((len(mine), D), tag, np.float32) + mine[:, None],
                np.full((len(mine), 1), -tag, np.float32),
            )


def truth(shard_stores) -> tuple[np.ndarray, np.ndarray]:
    S = len(shard_stores)
    R = sum(SIZES)
    w, s = np.empty((R, D), np.float32), np.empty((R, S_STATE), np.float32)
    for k, st in enumerate(shard_stores):
        for a, cw, cs in st.chunks():
            g = (np.arange(a, a + len(cw)) * S) + k
            w[g], s[g] = cw, cs
    return w, s


def checkpoint(folder: CheckpointFolder, shard_stores, step: int, compact_every: int = 3) -> Manifest:
    """What a run does, every shard's part written by its own store (in the caller's thread)."""
    writer = CheckpointWriter(folder, compact_every, SPACE, background=False)
    target = writer.begin(step)
    snaps = [take_snapshot(st, target.everything) for st in shard_stores]
    S = len(shard_stores)
    writer.submit(
        target,
        {"step": step},
        lambda: [write_part(target.staging, sn, k, S, target.kind, target.base_reader()) for k, sn in enumerate(snaps)],
        0.0,
    )
    return Manifest.load(folder.root / f"step-{step:08d}")


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_full_checkpoint_reads_back_in_any_layout(tmp_path, shards):
    st = stores(shards)
    write_rows(st, np.array([0, 5, 36, 37, 99, 64]), 1.0)
    folder = CheckpointFolder(tmp_path)
    m = checkpoint(folder, st, 10)
    assert m.rows == 6 and m.bytes == 6 * ROW_BYTES + 2 * 128 * shards  # the rows written, not the 100 of the tables
    r = newest(folder).reader()
    w, s = r.arrays()
    tw, ts = truth(st)
    assert np.array_equal(w, tw) and np.array_equal(s, ts)
    for new_shards in (1, 2, 4):
        for k in range(new_shards):
            for local, cw, cs in r.shard_rows(k, new_shards, chunk_rows=7):
                g = local * new_shards + k
                assert np.array_equal(cw, tw[g]) and np.array_equal(cs, ts[g])


def test_deltas_hold_the_rows_written_since_and_compaction_starts_a_new_chain(tmp_path):
    st = stores(2)
    folder = CheckpointFolder(tmp_path)
    kinds = []
    written: set[int] = set()
    for step, rows in ((10, [1, 2, 3]), (20, [3, 40]), (30, [99]), (40, [0]), (50, [])):
        write_rows(st, np.array(rows, dtype=np.int64), float(step))
        written |= set(rows)
        m = checkpoint(folder, st, step, compact_every=3)
        kinds.append(m.kind)
        if m.kind == "delta":
            assert m.rows == len(rows)  # only what changed
        else:  # every row written since initialisation (step 40: merged from the chain), nothing else
            assert m.rows == len(written) and m.base is None
        assert m.bytes == m.rows * ROW_BYTES + 2 * 128 * len(m.parts)  # the rows, and two .npy headers a part
        w, s = newest(folder).reader().arrays()
        tw, ts = truth(st)
        assert np.array_equal(w, tw) and np.array_equal(s, ts), step
    assert kinds == ["full", "delta", "delta", "full", "delta"]
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))
    # the newest two (40 full, 50 delta on 40) are kept; 10-30 are no longer needed
    assert names == ["step-00000040", "step-00000050"]


def test_pruning_keeps_the_chain_under_the_kept_checkpoints(tmp_path):
    st = stores(1)
    folder = CheckpointFolder(tmp_path)
    for step in (10, 20, 30):  # full, delta, delta with compact_every 5
        write_rows(st, np.array([step]), float(step))
        checkpoint(folder, st, step, compact_every=5)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*"))
    assert names == ["step-00000010", "step-00000020", "step-00000030"]  # 30 rests on 20 on 10
    w, _ = newest(folder).reader().arrays()
    assert np.array_equal(w, truth(st)[0])


def test_an_uncommitted_checkpoint_never_counts(tmp_path):
    st = stores(1)
    folder = CheckpointFolder(tmp_path)
    checkpoint(folder, st, 10)
    staging = folder.begin(20)  # a writer dies here: parts written, no manifest
    write_part(staging, take_snapshot(st[0], True), 0, 1, "full")
    assert newest(folder).step == 10
    checkpoint(folder, st, 30)
    assert not staging.exists() and newest(folder).step == 30


def test_a_broken_chain_or_a_missing_part_is_one_line(tmp_path):
    st = stores(2)
    folder = CheckpointFolder(tmp_path)
    checkpoint(folder, st, 10, compact_every=5)
    write_rows(st, np.array([7]), 2.0)
    checkpoint(folder, st, 20, compact_every=5)
    (tmp_path / "checkpoints" / "step-00000010" / "full-1-of-2.npy").unlink()
    with pytest.raises(CheckpointError, match=r"full-1-of-2.npy: missing"):
        CheckpointReader(tmp_path / "checkpoints" / "step-00000020")
    import shutil

    shutil.rmtree(tmp_path / "checkpoints" / "step-00000010")
    with pytest.raises(CheckpointError, match=r"base checkpoint step-00000010 is missing"):
        CheckpointReader(tmp_path / "checkpoints" / "step-00000020")


@pytest.mark.parametrize("kind", ["memory", "disk", "full"])
def test_a_restore_loads_the_checkpoint_and_returns_later_rows_to_their_initial_value(tmp_path, kind):
    from bagpipe.train.backends import FullBackend

    st = stores(1)
    write_rows(st, np.array([3, 50, 77]), 1.0)
    folder = CheckpointFolder(tmp_path / "run")
    checkpoint(folder, st, 10)
    init = RowInitializer(SIZES, D, seed=SEED)
    target: MemoryStore | DiskStore | FullBackend
    if kind == "memory":
        target = MemoryStore(init, S_STATE)
    elif kind == "disk":
        target = DiskStore(init, S_STATE, tmp_path / "store")
    else:
        target = FullBackend(init, S_STATE)
    # the target trained on after the checkpoint: rows 50 (also in it) and 90 (not)
    target.load(np.array([50, 90]), np.full((2, D), 9.0, np.float32), np.full((2, 1), 9.0, np.float32))
    assert restore_rows(target, newest(folder).reader()) == 3
    tw, ts = truth(st)
    w, s = target.peek(np.arange(sum(SIZES)))
    assert np.array_equal(w, tw) and np.array_equal(s, ts)  # row 90 is its initial value again
    assert target.written_rows().tolist() == [3, 50, 77]


def _v2_checkpoint(root, step: int, w: np.ndarray, s: np.ndarray) -> None:
    """A version-2 full checkpoint as an older bagpipe wrote it: every row in rows-0-of-1.npy."""
    import json

    import torch

    folder = root / "checkpoints" / f"step-{step:08d}"
    folder.mkdir(parents=True)
    np.save(folder / "rows-0-of-1.npy", np.concatenate([w, s], axis=1))
    torch.save({"step": step}, folder / "dense.pt")
    part = {"shard": 0, "shards": 1, "kind": "full", "rows": len(w), "bytes": 0}
    manifest = {
        "format": "bagpipe.checkpoint",
        "version": 2,
        "step": step,
        "num_rows": len(w),
        "dim": D,
        "state_dim": S_STATE,
        "kind": "full",
        "base": None,
        "parts": [part],
        "chain": 0,
    }
    (folder / "MANIFEST.json").write_text(json.dumps(manifest))
    (root / "checkpoints" / "LATEST").write_text(folder.name + "\n")


def test_a_version_2_checkpoint_still_reads_also_under_a_version_4_delta(tmp_path):
    st = stores(1)
    write_rows(st, np.array([4, 60]), 1.0)
    _v2_checkpoint(tmp_path, 10, *truth(st))
    folder = CheckpointFolder(tmp_path)
    r = newest(folder).reader()
    assert np.array_equal(r.arrays()[0], truth(st)[0]) and r.manifest.version == 2
    st[0].take_dirty()  # what the restored run would have: nothing written since the restore
    write_rows(st, np.array([60, 61]), 2.0)
    m = checkpoint(folder, st, 20, compact_every=5)  # a resumed old run: a version-4 delta on it
    assert m.kind == "delta" and m.base == "step-00000010" and m.rows == 2
    w, s = newest(folder).reader().arrays()
    assert np.array_equal(w, truth(st)[0]) and np.array_equal(s, truth(st)[1])


def test_the_manifest_records_every_files_size_and_crc32_and_a_changed_byte_is_refused(tmp_path):
    import json
    import zlib

    from bagpipe.checkpoint import verify

    st = stores(2)
    write_rows(st, np.array([1, 2, 50]), 1.0)
    folder = CheckpointFolder(tmp_path)
    checkpoint(folder, st, 10)
    where = tmp_path / "checkpoints" / "step-00000010"
    m = json.loads((where / "MANIFEST.json").read_text())
    assert m["version"] == 5
    files = {name: s for p in m["parts"] for name, s in p["sums"].items()} | {"dense.pt": m["dense_sum"]}
    assert sorted(files) == sorted(p.name for p in where.iterdir() if p.name != "MANIFEST.json")
    for name, s in files.items():
        data = (where / name).read_bytes()
        assert s == {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"}, name
    path = where / "full-1-of-2.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    verify.forget()
    with pytest.raises(
        CheckpointError, match=rf"^{path}: damaged checkpoint file: expected CRC-32 {files[path.name]['crc32']}, found "
    ):
        newest(folder).reader()


@pytest.mark.parametrize("version", [1, 6])
def test_another_format_version_is_refused_in_one_line(tmp_path, version):
    import json

    from bagpipe.filesums import seal

    st = stores(1)
    folder = CheckpointFolder(tmp_path)
    checkpoint(folder, st, 10)
    path = tmp_path / "checkpoints" / "step-00000010" / "MANIFEST.json"
    path.write_text(json.dumps(seal(json.loads(path.read_text()) | {"version": version}, "manifest_crc32")))
    with pytest.raises(
        CheckpointError,
        match=rf"^{path}: not a bagpipe checkpoint of format version 2, 3, 4 or 5 \(it says 'bagpipe.checkpoint' version {version}\)$",
    ):
        folder.latest()


@pytest.mark.parametrize(
    "key,edit",
    [
        ("step", lambda m: m | {"step": m["step"] + 1}),
        ("seed", lambda m: m | {"init": m["init"] | {"seed": m["init"]["seed"] ^ 1}}),
        ("dim", lambda m: m | {"dim": m["dim"] + 1}),
        ("state_dim", lambda m: m | {"state_dim": m["state_dim"] ^ 1}),
        ("version", lambda m: m | {"version": 4}),  # '5' and '4' are one bit apart
        ("no sum", lambda m: {k: v for k, v in m.items() if k != "manifest_crc32"}),
    ],
)
def test_a_manifest_edited_but_still_valid_json_is_a_damaged_checkpoint_file(tmp_path, key, edit):
    import json
    import zlib

    st = stores(1)
    write_rows(st, np.array([1, 2, 50]), 1.0)
    folder = CheckpointFolder(tmp_path)
    checkpoint(folder, st, 10)
    path = tmp_path / "checkpoints" / "step-00000010" / "MANIFEST.json"
    written = json.loads(path.read_text())
    assert written["manifest_crc32"] == f"{zlib.crc32(canonical(written)):08x}"
    path.write_text(json.dumps(edit(written), indent=1))
    before = path.read_bytes()
    what = (
        "it says version 5, which carries the CRC-32 of its content (manifest_crc32), and has none"
        if key == "no sum"
        else f"its content does not match the CRC-32 it was written with (manifest_crc32 {written['manifest_crc32']}, "
        "the content's "
    )
    for opening in (folder.latest, lambda: CheckpointReader(path.parent)):
        with pytest.raises(CheckpointError) as e:
            opening()
        assert str(e.value).startswith(f"{path}: damaged checkpoint file: {what}"), str(e.value)
    assert folder.intact_before(None) is None  # never offered as an intact checkpoint
    assert path.read_bytes() == before  # nothing repaired or removed


def canonical(d: dict) -> bytes:
    import json

    return json.dumps(
        {k: v for k, v in d.items() if k != "manifest_crc32"}, sort_keys=True, separators=(",", ":")
    ).encode()


def test_a_version_4_manifest_without_its_own_sum_still_reads(tmp_path):
    import json

    st = stores(2)
    write_rows(st, np.array([1, 2, 50]), 1.0)
    folder = CheckpointFolder(tmp_path)
    checkpoint(folder, st, 10)
    path = tmp_path / "checkpoints" / "step-00000010" / "MANIFEST.json"
    m = json.loads(path.read_text())
    del m["manifest_crc32"]
    path.write_text(json.dumps(m | {"version": 4}, indent=1))  # as bagpipe wrote it before version 5
    r = newest(folder).reader()
    assert r.manifest.version == 4 and np.array_equal(r.arrays()[0], truth(st)[0])
    m["step"] = 11  # unsummed: what it says is what it reads
    path.write_text(json.dumps(m | {"version": 4}, indent=1))
    assert newest(folder).step == 11


def test_checkpoints_that_keep_not_fitting_are_said_once_then_counted(small_disk, tmp_path, caplog):
    """A disk full for a long stretch said 'checkpoint of step N not written' at every cut
    (74 lines in a 1,500-step run): the first is said, the rest counted once space returns
    or the run ends."""
    st = stores(1)
    disk = small_disk(tmp_path / "small", "256k")
    folder = CheckpointFolder(disk)
    write_rows(st, np.array([1, 2]), 1.0)
    checkpoint(folder, st, 10)
    small_disk.fill(disk)
    w = CheckpointWriter(folder, 3, SPACE, background=False)

    def cut(step: int) -> None:
        target = w.begin(step)
        snap = take_snapshot(st[0], target.everything)
        w.submit(target, {"step": step}, lambda: [write_part(target.staging, snap, 0, 1, target.kind)], 0.0)

    with caplog.at_level("WARNING", logger="bagpipe"):
        for step in (20, 30, 40):
            cut(step)
        (disk / "filler").unlink()
        cut(50)
        w.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[0].startswith("checkpoint of step 20 not written: no space left")
    assert lines[1] == (
        f"2 more checkpoint(s) (steps 30..40) not written for lack of space on the disk of {folder.root}; "
        "step 50 is written again"
    )
    assert newest(folder).step == 50


def test_a_checkpoint_that_does_not_fit_is_discarded_in_one_line_and_the_next_is_full(small_disk, tmp_path, caplog):
    st = stores(1)
    disk = small_disk(tmp_path / "small", "256k")
    folder = CheckpointFolder(disk)
    write_rows(st, np.array([1, 2]), 1.0)
    checkpoint(folder, st, 10)
    small_disk.fill(disk)  # the disk fills up (another program's file)
    filler = disk / "filler"
    write_rows(st, np.array([5]), 2.0)
    with caplog.at_level("WARNING", logger="bagpipe"):
        checkpoint_tried = CheckpointWriter(folder, 3, SPACE, background=False)
        target = checkpoint_tried.begin(20)
        snap = take_snapshot(st[0], target.everything)
        checkpoint_tried.submit(
            target, {"step": 20}, lambda: [write_part(target.staging, snap, 0, 1, target.kind)], 0.0
        )
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("checkpoint of step 20 not written: no space left on the disk of ")
    assert lines[0].endswith("its partial files are removed and step-00000010 stays the latest checkpoint")
    assert newest(folder).step == 10 and not target.staging.exists()
    assert checkpoint_tried.history[-1].failed is not None
    filler.unlink()  # space again: the next checkpoint holds every row written (row 5 is in no checkpoint yet)
    nxt = checkpoint_tried.begin(30)
    assert (nxt.kind, nxt.base) == ("full", None)
    snap = take_snapshot(st[0], nxt.everything)
    checkpoint_tried.submit(nxt, {"step": 30}, lambda: [write_part(nxt.staging, snap, 0, 1, nxt.kind)], 0.0)
    w, s = newest(folder).reader().arrays()
    assert newest(folder).step == 30 and np.array_equal(w, truth(st)[0]) and np.array_equal(s, truth(st)[1])


def test_a_signal_between_the_writes_thread_and_its_start_leaves_nothing_to_wait_for(tmp_path, monkeypatch):
    """SIGTERM (raised as an exception in the main thread) can land after ``submit`` made the
    write's thread and before it started: the run's abandon path then returns (it raised
    RuntimeError 'cannot join thread before it is started', a traceback instead of the
    one-line stop), the staged folder never counts, and the previous checkpoint stays the latest."""
    st = stores(1)
    folder = CheckpointFolder(tmp_path / "ckpts")
    write_rows(st, np.array([1, 2]), 1.0)
    checkpoint(folder, st, 10)
    w = CheckpointWriter(folder, 3, SPACE, background=True)
    target = w.begin(20)

    def signal_lands(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", signal_lands)
    with pytest.raises(KeyboardInterrupt):
        w.submit(target, {"step": 20}, lambda: [], 0.0)
    monkeypatch.undo()
    w.close(abandon=True)  # returns: nothing was started
    w.wait()
    assert folder.latest_name() == "step-00000010"
    assert not list(folder.root.glob(".tmp-*"))  # the staged folder is removed


def test_a_signal_during_the_cut_leaves_no_staging_folder(tmp_path):
    """SIGTERM can land while the cut copies its rows, after ``begin`` made the staging
    folder and before ``submit``: the abandon path removes that folder (the CI run of
    test_sigterm_says_where_to_continue found ``.tmp-step-00000020`` left there), and the
    previous checkpoint stays the latest."""
    st = stores(1)
    folder = CheckpointFolder(tmp_path / "ckpts")
    write_rows(st, np.array([1, 2]), 1.0)
    checkpoint(folder, st, 10)
    w = CheckpointWriter(folder, 3, SPACE, background=True)
    target = w.begin(20)
    assert target.staging.is_dir()
    w.close(abandon=True)
    assert not target.staging.exists() and folder.latest_name() == "step-00000010"
    assert sorted(p.name for p in folder.root.iterdir()) == ["LATEST", "step-00000010"]
