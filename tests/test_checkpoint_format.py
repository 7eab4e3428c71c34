"""The checkpoint format (``bagpipe/checkpoint/``), checked on hand-made stores.

* A full checkpoint written by S shards reads back, bit for bit, as every row in
  order, and as the rows of any shard of any other S' (re-partitioning).
* Delta checkpoints hold exactly the rows written since the previous checkpoint; a
  chain of deltas on a full base reads back as the latest values; every
  ``compact_every``-th checkpoint is full again.
* A checkpoint counts only once committed: a staged folder without its manifest is
  never the latest, a later commit removes it, and pruning keeps the newest
  checkpoints and every checkpoint their chains rest on.
* A broken chain or a missing part is a one-line CheckpointError.
"""

from __future__ import annotations

import numpy as np
import pytest

from bagpipe.checkpoint import CheckpointFolder, CheckpointReader, Manifest, write_part
from bagpipe.distributed.server import ShardInit
from bagpipe.errors import CheckpointError
from bagpipe.store.init import RowInitializer
from bagpipe.store.memory import MemoryStore

pytestmark = pytest.mark.unit

SIZES = [37, 11, 52]  # 100 rows
D, S_STATE = 4, 1


def stores(shards: int) -> list[MemoryStore]:
    init = RowInitializer(SIZES, D, seed=3)
    return [MemoryStore(ShardInit(init, k, shards) if shards > 1 else init, S_STATE) for k in range(shards)]


def write_rows(shard_stores: list[MemoryStore], rows: np.ndarray, tag: float) -> None:
    """Write global ``rows`` (values derived from ``tag``) into the shards that own them."""
    S = len(shard_stores)
    for k, st in enumerate(shard_stores):
        mine = rows[rows % S == k]
        if len(mine):
            st.write(mine // S, np.full((len(mine), D), tag, np.float32) + mine[:, None], np.full((len(mine), 1), -tag, np.float32))


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
    staging = folder.begin(step)
    kind, base, chain = folder.next_kind(compact_every)
    parts = [write_part(staging, st, k, len(shard_stores), kind) for k, st in enumerate(shard_stores)]
    folder.write_dense(staging, {"step": step})
    m = Manifest(step=step, num_rows=sum(SIZES), dim=D, state_dim=S_STATE, kind=kind, base=base, parts=parts, chain=chain)
    folder.commit(staging, m)
    return m


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_full_checkpoint_reads_back_in_any_layout(tmp_path, shards):
    st = stores(shards)
    write_rows(st, np.array([0, 5, 36, 37, 99, 64]), 1.0)
    folder = CheckpointFolder(tmp_path)
    checkpoint(folder, st, 10)
    r = folder.latest().reader()
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
    for step, rows in ((10, [1, 2, 3]), (20, [3, 40]), (30, [99]), (40, [0]), (50, [])):
        write_rows(st, np.array(rows, dtype=np.int64), float(step))
        m = checkpoint(folder, st, step, compact_every=3)
        kinds.append(m.kind)
        if m.kind == "delta":
            assert sum(p.rows for p in m.parts) == len(rows)  # only what changed
        w, s = folder.latest().reader().arrays()
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
    w, _ = folder.latest().reader().arrays()
    assert np.array_equal(w, truth(st)[0])


def test_an_uncommitted_checkpoint_never_counts(tmp_path):
    st = stores(1)
    folder = CheckpointFolder(tmp_path)
    checkpoint(folder, st, 10)
    staging = folder.begin(20)  # a writer dies here: parts written, no manifest
    write_part(staging, st[0], 0, 1, "full")
    assert folder.latest().step == 10
    checkpoint(folder, st, 30)
    assert not staging.exists() and folder.latest().step == 30


def test_a_broken_chain_or_a_missing_part_is_one_line(tmp_path):
    st = stores(2)
    folder = CheckpointFolder(tmp_path)
    checkpoint(folder, st, 10, compact_every=5)
    write_rows(st, np.array([7]), 2.0)
    checkpoint(folder, st, 20, compact_every=5)
    (tmp_path / "checkpoints" / "step-00000010" / "rows-1-of-2.npy").unlink()
    with pytest.raises(CheckpointError, match=r"rows-1-of-2.npy: missing"):
        CheckpointReader(tmp_path / "checkpoints" / "step-00000020")
    import shutil

    shutil.rmtree(tmp_path / "checkpoints" / "step-00000010")
    with pytest.raises(CheckpointError, match=r"base checkpoint step-00000010 is missing"):
        CheckpointReader(tmp_path / "checkpoints" / "step-00000020")
