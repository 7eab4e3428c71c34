"""The shard format and the batch stream give back exactly what was written, in a
deterministic, replayable order.

What this proves:
* ShardWriter/Dataset round trip: samples appended in uneven chunks (including an empty
  one) that straddle shard boundaries, interleaved over two splits, come back exactly
  (labels, dense, one-hot ids, multi-hot values and offsets) through ``Dataset.shard``;
  ``meta.json`` records format_version (and the CRC-32 of its content), per-split shard_sizes/num_samples, the features
  and id_dtype; it is written by ``close()`` only, into a staging folder beside the
  target that is swapped in then (an unfinished directory is rejected by ``Dataset`` as
  "not a finished" dataset); a finished dataset is refused without ``overwrite`` and
  replaced with it, staying whole until the new one is complete; out-of-range ids and inconsistent multi-hot input
  raise DataError.
* BatchStream: the same seed gives identical batches, another seed another order;
  ``batch(k)`` equals the k-th batch of sequential iteration (random access = replay)
  across epoch boundaries; each epoch is a fresh permutation of whole blocks (file order
  inside a block) over the same samples, and with ``drop_last=False`` one epoch covers
  every sample exactly once; ``rows`` are global (table offset + id) and feature-major,
  with ``offsets = arange(F*B + 1)`` for one-hot data and the right bags (empty ones
  included) for multi-hot data; an eval stream reads in file order with a final partial
  batch; a batch larger than the split (or <= 0) raises ConfigError.

Every sample of the hand-made datasets here carries its own index in dense column 0 and
ids computed from it, so each batch can be checked sample by sample.
"""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest
import torch

from bagpipe.data.batch import Batch
from bagpipe.data.schema import FORMAT_VERSION, META_FILE, DatasetMeta, FeatureSpec
from bagpipe.data.shards import Dataset, ShardWriter
from bagpipe.data.stream import BatchStream
from bagpipe.errors import ConfigError, DataError

pytestmark = pytest.mark.unit

DENSE = ["d0", "d1", "d2"]
ONEHOT = [FeatureSpec("a", 7), FeatureSpec("b", 1000)]
MULTIHOT = [FeatureSpec("a", 7), FeatureSpec("seq", 50, multi_hot=True), FeatureSpec("b", 1000)]
ROWS_PER_SHARD = 230
N_TRAIN, N_EVAL = 1000, 170
# (split, number of samples) in append order: uneven, straddling shard boundaries, interleaved
CHUNKS = [("train", 3), ("eval", 100), ("train", 250), ("train", 1), ("train", 0), ("train", 400),
          ("eval", 70), ("train", 346)]  # fmt: skip


# --------------------------------------------------------------------------- sample maker


def seq_lengths(idx: np.ndarray) -> np.ndarray:
    return idx % 4  # 0..3 ids per bag, empty bags included


def seq_values(i: int) -> list[int]:
    return [(i * 7 + k) % 50 for k in range(i % 4)]


def samples(lo: int, hi: int, multi_hot: bool):
    """labels, dense, sparse (one-hot, schema order), multihot of samples lo..hi-1."""
    idx = np.arange(lo, hi, dtype=np.int64)
    labels = (idx % 3 == 0).astype(np.float32)
    dense = np.stack([idx, idx * 0.5, -idx], axis=1).astype(np.float32)
    sparse = np.stack([idx % 7, (idx * 13) % 1000], axis=1)
    mh = None
    if multi_hot:
        values = np.array([v for i in idx for v in seq_values(int(i))], dtype=np.int64)
        mh = {"seq": (values, seq_lengths(idx))}
    return labels, dense, sparse, mh


def expected_ids(i: int, features) -> list[list[int]]:
    """The ids of sample i, one list per feature in schema order."""
    one = {"a": [i % 7], "b": [(i * 13) % 1000]}
    return [seq_values(i) if f.multi_hot else one[f.name] for f in features]


def write_dataset(out, multi_hot: bool, **kw) -> DatasetMeta:
    features = MULTIHOT if multi_hot else ONEHOT
    w = ShardWriter(out, DENSE, features, rows_per_shard=ROWS_PER_SHARD, **kw)
    pos = {"train": 0, "eval": N_TRAIN}  # eval samples are numbered after the train ones
    for split, n in CHUNKS:
        labels, dense, sparse, mh = samples(pos[split], pos[split] + n, multi_hot)
        w.append(split, labels, dense, sparse, multihot=mh)
        pos[split] += n
    assert pos == {"train": N_TRAIN, "eval": N_TRAIN + N_EVAL}
    return w.close(source={"tool": "test"})


def read_split(ds: Dataset, split: str):
    shards = [ds.shard(split, i) for i in range(len(ds.shard_sizes(split)))]
    labels = np.concatenate([np.asarray(s.labels) for s in shards])
    dense = np.concatenate([np.asarray(s.dense) for s in shards])
    sparse = np.concatenate([np.asarray(s.sparse) for s in shards])
    mh = {}
    for f in ds.meta.multihot_features:
        values = np.concatenate([np.asarray(s.multihot[f.name][0]) for s in shards])
        lengths = np.concatenate([np.diff(np.asarray(s.multihot[f.name][1])) for s in shards])
        mh[f.name] = (values, lengths)
    return labels, dense, sparse, mh


@pytest.fixture(scope="module")
def onehot_dir(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("onehot") / "ds"
    write_dataset(out, multi_hot=False)
    return str(out)


@pytest.fixture(scope="module")
def multihot_dir(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("multihot") / "ds"
    write_dataset(out, multi_hot=True)
    return str(out)


# --------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("multi_hot", [False, True], ids=["onehot", "multihot"])
def test_round_trip_is_exact(tmp_path, multi_hot):
    out = tmp_path / "ds"
    write_dataset(out, multi_hot)
    ds = Dataset(out)
    assert ds.shard_sizes("train") == [230, 230, 230, 230, 80]
    assert ds.shard_sizes("eval") == [170]
    for split, (lo, hi) in {"train": (0, N_TRAIN), "eval": (N_TRAIN, N_TRAIN + N_EVAL)}.items():
        labels, dense, sparse, mh = read_split(ds, split)
        e_labels, e_dense, e_sparse, e_mh = samples(lo, hi, multi_hot)
        np.testing.assert_array_equal(labels, e_labels)
        np.testing.assert_array_equal(dense, e_dense)
        np.testing.assert_array_equal(sparse, e_sparse)
        assert labels.dtype == np.float32 and dense.dtype == np.float32
        assert sparse.dtype == np.int64 and sparse.shape == (hi - lo, 2)
        if multi_hot:
            np.testing.assert_array_equal(mh["seq"][0], e_mh["seq"][0])
            np.testing.assert_array_equal(mh["seq"][1], e_mh["seq"][1])
        else:
            assert mh == {}
    if multi_hot:  # per shard, offsets start at 0 and end at the shard's number of values
        sh = ds.shard("train", 1)
        values, offsets = (np.asarray(a) for a in sh.multihot["seq"])
        assert offsets[0] == 0 and offsets[-1] == len(values) and len(offsets) == 231
        assert offsets.dtype == np.int64


def test_int32_ids_round_trip(tmp_path):
    w = ShardWriter(tmp_path / "ds", DENSE, MULTIHOT, id_dtype="int32", rows_per_shard=64)
    labels, dense, sparse, mh = samples(0, 100, True)
    w.append("train", labels, dense, sparse, multihot=mh)
    meta = w.close()
    assert meta.id_dtype == "int32"
    ds = Dataset(tmp_path / "ds")
    assert ds.meta.id_dtype == "int32"
    got = read_split(ds, "train")
    assert got[2].dtype == np.int32 and got[3]["seq"][0].dtype == np.int32
    np.testing.assert_array_equal(got[2], sparse)
    np.testing.assert_array_equal(got[3]["seq"][0], mh["seq"][0])


def test_meta_json_fields(multihot_dir):
    d = json.loads((Dataset(multihot_dir).dir / META_FILE).read_text())
    assert d["format_version"] == FORMAT_VERSION == 2 and len(d["meta_crc32"]) == 8
    assert d["splits"]["train"] == {"shard_sizes": [230, 230, 230, 230, 80], "num_samples": 1000}
    assert d["splits"]["eval"] == {"shard_sizes": [170], "num_samples": 170}
    assert d["features"] == [
        {"name": "a", "num_rows": 7, "multi_hot": False},
        {"name": "seq", "num_rows": 50, "multi_hot": True},
        {"name": "b", "num_rows": 1000, "multi_hot": False},
    ]
    assert d["dense_names"] == DENSE
    assert d["id_dtype"] == "int64"
    assert d["source"] == {"tool": "test"}
    meta = DatasetMeta.load(multihot_dir)
    assert meta.table_sizes == [7, 50, 1000] and meta.total_rows == 1057
    assert meta.num_samples("train") == 1000 and meta.num_samples("eval") == 170
    assert [f.name for f in meta.multihot_features] == ["seq"]
    with pytest.raises(DataError, match="no split 'test'"):
        meta.split("test")


def test_meta_json_is_written_by_close_only(tmp_path):
    out = tmp_path / "ds"
    w = ShardWriter(out, DENSE, ONEHOT, rows_per_shard=10)
    labels, dense, sparse, _ = samples(0, 35, False)
    w.append("train", labels, dense, sparse)
    assert (w.dir / "train" / "00002" / "labels.npy").exists()  # three full shards are on disk, beside out
    assert not (w.dir / META_FILE).exists() and not out.exists()
    with pytest.raises(DataError, match="not a finished"):
        Dataset(w.dir)
    w.close()
    assert not w.dir.exists()  # swapped in
    assert (out / META_FILE).exists()
    assert Dataset(out).shard_sizes("train") == [10, 10, 10, 5]
    with pytest.raises(DataError, match="already closed"):
        w.close()


def test_dataset_rejects_missing_directory(tmp_path):
    with pytest.raises(DataError, match="no such dataset directory"):
        Dataset(tmp_path / "nope")


def test_existing_dataset_needs_overwrite(tmp_path):
    out = tmp_path / "ds"
    write_dataset(out, multi_hot=False)
    with pytest.raises(DataError, match="already holds a dataset"):
        ShardWriter(out, DENSE, ONEHOT)
    assert Dataset(out).meta.num_samples("train") == N_TRAIN  # left intact
    w = ShardWriter(out, DENSE, ONEHOT, rows_per_shard=50, overwrite=True)
    assert Dataset(out).meta.num_samples("train") == N_TRAIN  # the old one stays whole until the new one is
    labels, dense, sparse, _ = samples(0, 60, False)
    w.append("train", labels, dense, sparse)
    w.close()
    ds = Dataset(out)
    assert list(ds.meta.splits) == ["train"] and ds.shard_sizes("train") == [50, 10]
    np.testing.assert_array_equal(read_split(ds, "train")[1], dense)


def test_unrelated_directory_is_not_wiped(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious")
    try:
        ShardWriter(out, DENSE, ONEHOT)
    except DataError:
        pass
    assert (out / "notes.txt").exists()


@pytest.mark.parametrize(
    "bad",
    [
        {"sparse": np.array([[7, 0]])},  # a: 7 rows, ids 0..6
        {"sparse": np.array([[-1, 0]])},
        {"sparse": np.array([[0, 1000]])},  # b: 1000 rows
        {"mh": {"seq": (np.array([50]), np.array([1]))}},  # seq: 50 rows
        {"mh": {"seq": (np.array([-3]), np.array([1]))}},
        {"mh": {"seq": (np.array([1, 2]), np.array([1]))}},  # lengths do not add up
        {"mh": {}},  # the multi-hot feature is missing
        {"mh": {"seq": (np.array([1]), np.array([1])), "other": (np.array([1]), np.array([1]))}},
    ],
    ids=[
        "onehot-high",
        "onehot-negative",
        "onehot-second",
        "mh-high",
        "mh-negative",
        "mh-lengths",
        "mh-missing",
        "mh-extra",
    ],
)
def test_bad_ids_raise_data_error(tmp_path, bad):
    w = ShardWriter(tmp_path / "ds", DENSE, MULTIHOT)
    sparse = bad.get("sparse", np.array([[0, 0]]))
    mh = bad.get("mh", {"seq": (np.array([3]), np.array([1]))})
    with pytest.raises(DataError):
        w.append("train", np.zeros(1), np.zeros((1, 3)), sparse, multihot=mh)


def test_int32_refuses_ids_that_do_not_fit(tmp_path):
    big = FeatureSpec("big", 1 << 32)
    with pytest.raises(DataError):
        w = ShardWriter(tmp_path / "ds", ["d"], [big], id_dtype="int32")
        w.append("train", np.zeros(2), np.zeros((2, 1)), np.array([[5], [(1 << 31) + 5]]))
        w.close()


def test_writer_argument_errors(tmp_path):
    with pytest.raises(DataError, match="rows_per_shard"):
        ShardWriter(tmp_path / "a", DENSE, ONEHOT, rows_per_shard=0)
    with pytest.raises(DataError, match="id_dtype"):
        ShardWriter(tmp_path / "b", DENSE, ONEHOT, id_dtype="float32")
    with pytest.raises(DataError, match="num_rows"):
        FeatureSpec("z", 0)
    with pytest.raises(DataError, match="no samples"):
        ShardWriter(tmp_path / "c", DENSE, ONEHOT).close()


# --------------------------------------------------------------------------- batch stream

B, BLOCK = 96, 64


def ids_of(batch: Batch) -> np.ndarray:
    """The sample numbers of a batch (dense column 0)."""
    return batch.dense[:, 0].numpy().astype(np.int64)


def assert_batches_equal(a: Batch, b: Batch) -> None:
    assert a.num_features == b.num_features
    for name in ("labels", "dense", "rows", "offsets"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name


def epoch_order(stream: BatchStream, epoch: int) -> np.ndarray:
    per = stream.batches_per_epoch
    return np.concatenate([ids_of(b) for b in stream.batches(epoch * per, (epoch + 1) * per)])


def test_same_seed_same_batches_other_seed_other_order(onehot_dir):
    ds = Dataset(onehot_dir)
    a = BatchStream(ds, "train", B, seed=5, block_size=BLOCK)
    b = BatchStream(Dataset(onehot_dir), "train", B, seed=5, block_size=BLOCK)
    c = BatchStream(ds, "train", B, seed=6, block_size=BLOCK)
    n = 2 * a.batches_per_epoch + 2
    for x, y in zip(a.batches(0, n), b.batches(0, n)):
        assert_batches_equal(x, y)
    assert not np.array_equal(epoch_order(a, 0), epoch_order(c, 0))
    assert sorted(epoch_order(a, 0)) != list(range(len(epoch_order(a, 0))))  # actually shuffled


def test_random_access_equals_replay(onehot_dir):
    ds = Dataset(onehot_dir)
    seq = BatchStream(ds, "train", B, seed=3, block_size=BLOCK)
    per = seq.batches_per_epoch
    assert per == N_TRAIN // B == 10
    replay = list(seq.batches(0, 3 * per + 4))  # into the fourth epoch
    rnd = BatchStream(Dataset(onehot_dir), "train", B, seed=3, block_size=BLOCK)
    order = [3 * per + 3, per, per - 1, 0, 2 * per + 1, per + 1, 7, 3 * per, 2 * per - 1]
    for k in order:
        assert_batches_equal(rnd.batch(k), replay[k])
    for k, b in zip(range(per - 2, per + 3), rnd.batches(per - 2, per + 3)):  # start mid-stream
        assert_batches_equal(b, replay[k])
    with pytest.raises(ValueError):
        rnd.batch(-1)


def test_batches_default_stop_is_one_epoch_past_start(onehot_dir):
    s = BatchStream(Dataset(onehot_dir), "train", B, seed=3, block_size=BLOCK)
    per = s.batches_per_epoch
    got = list(s.batches(per - 2))
    assert len(got) == per
    assert_batches_equal(got[-1], s.batch(2 * per - 3))


def _block_runs_ok(order: np.ndarray, shard_sizes: list[int], block: int) -> bool:
    """order is a concatenation of whole blocks, each in file order."""
    starts = np.concatenate([[0], np.cumsum(shard_sizes)])
    i = 0
    while i < len(order):
        g = int(order[i])
        s = int(np.searchsorted(starts, g, side="right")) - 1
        local = g - starts[s]
        if local % block:
            return False
        n = min(block, shard_sizes[s] - local)
        if not np.array_equal(order[i : i + n], np.arange(g, g + n)):
            return False
        i += n
    return True


def test_each_epoch_is_a_new_permutation_of_all_samples(onehot_dir):
    ds = Dataset(onehot_dir)
    s = BatchStream(ds, "train", B, seed=11, drop_last=False, block_size=BLOCK)
    per = s.batches_per_epoch
    assert per == -(-N_TRAIN // B) == 11
    assert s.batch(per - 1).batch_size == N_TRAIN - (per - 1) * B  # the epoch's partial batch
    assert s.batch(per).batch_size == B
    e0, e1 = epoch_order(s, 0), epoch_order(s, 1)
    np.testing.assert_array_equal(np.sort(e0), np.arange(N_TRAIN))  # every sample exactly once
    np.testing.assert_array_equal(np.sort(e1), np.arange(N_TRAIN))
    assert not np.array_equal(e0, e1)
    for order in (e0, e1):
        assert _block_runs_ok(order, ds.shard_sizes("train"), BLOCK)
    # drop_last: each epoch has B-sized batches of distinct samples, the tail is dropped
    d = BatchStream(ds, "train", B, seed=11, block_size=BLOCK)
    assert d.batches_per_epoch == N_TRAIN // B
    for e in (0, 1):
        order = epoch_order(d, e)
        assert len(order) == d.batches_per_epoch * B and len(set(order.tolist())) == len(order)
    assert all(b.batch_size == B for b in d.batches(0, 3 * d.batches_per_epoch))


def test_onehot_rows_are_global_and_feature_major(onehot_dir):
    s = BatchStream(Dataset(onehot_dir), "train", B, seed=1, block_size=BLOCK)
    assert s.table_offsets.tolist() == [0, 7, 1007]
    for k in (0, 13):
        b = s.batch(k)
        F = b.num_features
        assert F == 2 and b.batch_size == B
        assert b.rows.dtype == torch.int64 and b.offsets.dtype == torch.int64
        assert torch.equal(b.offsets, torch.arange(F * B + 1))
        rows = b.rows.view(F, B)
        for j, i in enumerate(ids_of(b)):
            a_id, b_id = (x[0] for x in expected_ids(int(i), ONEHOT))
            assert rows[0, j] == a_id and rows[1, j] == 7 + b_id
        np.testing.assert_array_equal(b.labels.numpy(), (ids_of(b) % 3 == 0).astype(np.float32))
        assert b.labels.dtype == torch.float32 and b.dense.shape == (B, 3)


def test_multihot_rows_and_offsets(multihot_dir):
    s = BatchStream(Dataset(multihot_dir), "train", B, seed=2, block_size=BLOCK)
    offs = [0, 7, 57]  # table offsets of a, seq, b
    for k in (0, 4, s.batches_per_epoch + 1):
        b = s.batch(k)
        F = b.num_features
        assert F == 3 and len(b.offsets) == F * B + 1
        assert b.offsets[0] == 0 and b.offsets[-1] == len(b.rows)
        assert bool((b.offsets[1:] >= b.offsets[:-1]).all())
        sample = ids_of(b)
        for f in range(F):
            for j in range(B):
                bag = f * B + j
                got = b.rows[b.offsets[bag] : b.offsets[bag + 1]].tolist()
                want = [offs[f] + v for v in expected_ids(int(sample[j]), MULTIHOT)[f]]
                assert got == want, (f, j)
        # empty bags exist (sample % 4 == 0) and are empty
        assert any(int(i) % 4 == 0 for i in sample)


def test_eval_stream_reads_file_order_with_partial_batch(onehot_dir):
    ds = Dataset(onehot_dir)
    s = BatchStream(ds, "eval", 64, shuffle=False, drop_last=False)
    batches = list(s.batches())
    assert [b.batch_size for b in batches] == [64, 64, 42]
    np.testing.assert_array_equal(np.concatenate([ids_of(b) for b in batches]), np.arange(N_TRAIN, N_TRAIN + N_EVAL))
    assert torch.equal(batches[-1].offsets, torch.arange(2 * 42 + 1))
    # the train split in file order too, across its uneven shards
    t = BatchStream(ds, "train", 300, shuffle=False, drop_last=False)
    np.testing.assert_array_equal(np.concatenate([ids_of(b) for b in t.batches()]), np.arange(N_TRAIN))
    # the seed does not matter when not shuffling
    u = BatchStream(ds, "eval", 64, seed=99, shuffle=False, drop_last=False)
    for x, y in zip(batches, u.batches()):
        assert_batches_equal(x, y)
    # an eval batch larger than the split is the whole split
    whole = list(BatchStream(ds, "eval", 10_000, shuffle=False, drop_last=False).batches())
    assert len(whole) == 1 and whole[0].batch_size == N_EVAL


def test_bad_batch_size_raises_config_error(onehot_dir):
    ds = Dataset(onehot_dir)
    with pytest.raises(ConfigError, match="exceeds"):
        BatchStream(ds, "train", N_TRAIN + 1)
    with pytest.raises(ConfigError):
        BatchStream(ds, "eval", N_EVAL + 1, shuffle=False)  # drop_last would leave no batch
    with pytest.raises(ConfigError):
        BatchStream(ds, "train", 0)
    with pytest.raises(ConfigError):
        BatchStream(ds, "train", B, block_size=0)
    with pytest.raises(DataError, match="no split"):
        BatchStream(ds, "test", B)
    assert BatchStream(ds, "train", N_TRAIN).batches_per_epoch == 1


def test_synthetic_stream_rows_stay_in_their_tables(tiny_data):
    ds = Dataset(tiny_data)
    s = BatchStream(ds, "train", 512, seed=0)
    sizes = np.array(ds.meta.table_sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for b in s.batches(0, 3):
        rows = b.rows.view(b.num_features, b.batch_size).numpy()
        assert (rows >= starts[:-1, None]).all() and (rows < starts[1:, None]).all()
        assert set(np.unique(b.labels.numpy())) <= {0.0, 1.0}


def test_a_damaged_file_names_a_check_command_that_pastes_into_a_shell(tmp_path):
    """The refusal of a damaged shard suggests `bagpipe check DIR` with DIR quoted for a shell,
    so a path with a space or a quote pastes as it is."""
    out = tmp_path / "ti ny é's"
    write_dataset(out, multi_hot=False)
    shard = next((out / "train").glob("*/sparse.npy"))
    shard.write_bytes(shard.read_bytes()[:-8])  # cut short: found when the data set is opened
    with pytest.raises(DataError) as e:
        Dataset(out)
    assert str(e.value).endswith(f"(`bagpipe check {shlex.quote(str(out))}` checks every file)"), str(e.value)
    assert shlex.split(str(e.value).rsplit("`", 2)[1]) == ["bagpipe", "check", str(out)]
