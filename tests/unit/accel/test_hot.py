"""The hot tier's parts against independent expectations, in this process.

* The profiler (``bagpipe.accel.profile``) on a hand-made dataset of six inputs (two
  one-hot tables and a multi-hot one with an empty bag): access counts, the rows chosen
  for a budget (ties to the lower row, never an unseen row), the share of lookups they
  serve and of inputs whose lookups are all hot, per table and overall -- each worked
  out by hand below; a hot-row file round-trips and a file for other tables is refused.
* ``HotSplit`` around the lookahead oracle: every merged plan holds the batch's unique
  rows in ascending order with the full inverse map (what ``--mode full`` gathers), hot
  rows at slots C + i, cold ones in [0, C); only cold rows are fetched; ``popular`` is
  exactly the inputs whose lookups are all hot; a hot row's next use is the next step
  exactly when the next batch uses it.
* FAE's regrouped schedule: all-hot batches hold only all-hot inputs, no input appears
  twice in an epoch, and the plain stream's inputs are all there but for less than two
  batches' worth.
* ``select_samples`` cuts a batch into micro-batches whose lookups are the batch's.
"""

from __future__ import annotations

import numpy as np
import pytest

from bagpipe.accel.hot import HotSplit
from bagpipe.accel.profile import HotSet, count_accesses, profile, sample_blocks
from bagpipe.accel.schedule import FaeSchedule
from bagpipe.data.batch import select_samples
from bagpipe.data.schema import FeatureSpec
from bagpipe.data.shards import Dataset, ShardWriter
from bagpipe.data.stream import BatchStream
from bagpipe.errors import ConfigError
from bagpipe.oracle.lookahead import LookaheadOracle

pytestmark = pytest.mark.unit

# six inputs; global rows: table A 0..3, table B 4..6, multi-hot table M 7..11
A = [0, 1, 0, 2, 0, 3]
B = [2, 2, 2, 1, 0, 2]
M = [[0, 4], [], [4], [1, 4, 4], [4], [2]]
ROW_MIB = 4 / 2**20  # one row of D = 1 weight and no state (sgd)


@pytest.fixture(scope="module")
def hand_data(tmp_path_factory) -> Dataset:
    out = tmp_path_factory.mktemp("hand") / "ds"
    feats = [FeatureSpec("A", 4), FeatureSpec("B", 3), FeatureSpec("M", 5, multi_hot=True)]
    w = ShardWriter(out, ["d"], feats)
    values = np.array([v for bag in M for v in bag])
    lengths = np.array([len(bag) for bag in M])
    w.append("train", np.zeros(6), np.zeros((6, 1)), np.array([A, B]).T, multihot={"M": (values, lengths)})
    w.close()
    return Dataset(out)


def test_counts_match_a_hand_count(hand_data):
    blocks, _ = sample_blocks(hand_data, "train", 1.0, 0)
    counts, inputs = count_accesses(hand_data, "train", blocks)
    #                    A: 0  1  2  3   B: 0  1  2   M: 0  1  2  3  4
    assert counts.tolist() == [3, 1, 1, 1, 1, 1, 4, 1, 1, 1, 0, 5]
    assert inputs == 6


def test_profile_picks_the_most_accessed_rows_and_reports_their_coverage(hand_data):
    hot = profile(hand_data, 3 * ROW_MIB, dim=1, state_dim=0, sample_rate=1.0)
    assert hot.rows.tolist() == [0, 6, 11]  # counts 3, 4, 5
    r = hot.report
    assert r["capacity_rows"] == 3 and r["coverage_sample"] == "in-sample"  # nothing held out at rate 1
    assert r["coverage_inputs"] == 6 and r["coverage_lookups"] == 20
    assert r["lookup_share"] == pytest.approx((3 + 4 + 5) / 20)
    # inputs all hot per table: A {0, 2, 4}; B {0, 1, 2, 5}; M {1 (empty bag), 2, 4}; all three: {2}
    assert [t["input_share"] for t in r["tables"]] == pytest.approx([3 / 6, 4 / 6, 3 / 6])
    assert [t["lookup_share"] for t in r["tables"]] == pytest.approx([3 / 6, 4 / 6, 5 / 8])
    assert [t["hot_rows"] for t in r["tables"]] == [1, 1, 1]
    assert r["input_share"] == pytest.approx(1 / 6)


def test_ties_go_to_the_lower_row_and_unseen_rows_are_never_hot(hand_data):
    assert profile(hand_data, 4 * ROW_MIB, dim=1, state_dim=0, sample_rate=1.0).rows.tolist() == [0, 1, 6, 11]
    every = profile(hand_data, 100 * ROW_MIB, dim=1, state_dim=0, sample_rate=1.0)
    assert 10 not in every.rows.tolist() and len(every) == 11  # row 10 (M id 3) is never looked up
    assert every.report["lookup_share"] == 1.0 and every.report["input_share"] == 1.0


def test_hot_row_file_round_trip_and_refusals(hand_data, tmp_path):
    hot = profile(hand_data, 3 * ROW_MIB, dim=1, state_dim=0, sample_rate=1.0)
    hot.save(tmp_path / "hot.npz")
    back = HotSet.load(tmp_path / "hot.npz", hand_data.meta.table_sizes)
    assert back.rows.tolist() == hot.rows.tolist() and back.report["lookup_share"] == hot.report["lookup_share"]
    assert back.contains(np.arange(12)).tolist() == [r in (0, 6, 11) for r in range(12)]
    with pytest.raises(ConfigError, match="another dataset"):
        HotSet.load(tmp_path / "hot.npz", [4, 3, 6])
    with pytest.raises(ConfigError, match="no such hot-row file"):
        HotSet.load(tmp_path / "missing.npz", [4, 3, 5])
    # `profile --out -` writes one to standard output; `--hot-rows -` says to write it to a file (round 16)
    with pytest.raises(ConfigError, match=r"^-: a hot-row file is not read from standard input .* --hot-rows hot.npz$"):
        HotSet.load("-", [4, 3, 5])
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(ConfigError, match="not a hot-row file"):
        HotSet.load(tmp_path / "junk.npz", [4, 3, 5])
    with pytest.raises(ConfigError, match="distinct, ascending"):
        HotSet(np.array([3, 1]), 12)


@pytest.fixture(scope="module")
def tiny_hot(tiny_data) -> tuple[Dataset, HotSet]:
    ds = Dataset(tiny_data)
    return ds, profile(ds, 600 * 36 / 2**20, dim=8, state_dim=1, sample_rate=1.0)  # 600 rows of 36 bytes


def test_hot_split_plans_what_full_gathers_and_fetches_only_cold_rows(tiny_hot):
    ds, hot = tiny_hot
    assert len(hot) == 600
    C, L = 3000, 4
    stream = BatchStream(ds, "train", 64, seed=2)
    split = HotSplit(hot, C)
    plans = list(split.plans(LookaheadOracle(ds.meta.total_rows, C, L), stream, 0, 30))
    assert [p.step for p in plans] == list(range(30))
    for k, p in enumerate(plans):
        rows = stream.batch(k).rows.numpy()
        assert np.array_equal(p.rows, np.unique(rows)) and np.array_equal(p.rows[p.inverse], rows)
        is_hot = hot.contains(p.rows)
        assert np.array_equal(p.hot, is_hot)
        assert np.array_equal(p.slots[is_hot], C + np.searchsorted(hot.rows, p.rows[is_hot]))
        assert (p.slots[~is_hot] < C).all() and len(np.unique(p.slots)) == len(p.slots)
        assert not hot.contains(p.fetch_rows).any() and not hot.contains(p.evict_after_rows).any()
        B, F = 64, ds.meta.num_features
        lookup_hot = hot.contains(rows).reshape(F, B)  # one-hot: feature-major lookups
        assert np.array_equal(p.popular, lookup_hot.all(axis=0))
        if k + 1 < len(plans):
            nxt = set(plans[k + 1].rows[plans[k + 1].hot].tolist())
            want = [k + 1 if r in nxt else -1 for r in p.rows[is_hot].tolist()]
            assert p.next_use[is_hot].tolist() == want
    s = split.report()
    assert s["lookups"] == 30 * 64 * ds.meta.num_features
    assert s["hot_lookups"] == sum(int(hot.contains(stream.batch(k).rows.numpy()).sum()) for k in range(30))
    assert s["popular_inputs_per_step"]["mean"] == pytest.approx(np.mean([p.popular.sum() for p in plans]))


def test_fae_schedule_regroups_the_epoch(tiny_hot):
    ds, _ = tiny_hot
    B = 32
    plain = BatchStream(ds, "train", B, seed=1)
    hot = profile(ds, 2000 * 36 / 2**20, dim=8, state_dim=1, sample_rate=1.0)  # many inputs all hot
    sched = FaeSchedule(plain, hot)
    assert sched.hot_batches > 0 and sched.other_batches > 0
    assert plain.batches_per_epoch - 1 <= sched.batches_per_epoch <= plain.batches_per_epoch
    parts = []
    n_all_hot = 0
    for k in range(sched.batches_per_epoch):
        b = sched.batch(k)
        lookup_hot = hot.contains(b.rows.numpy()).reshape(ds.meta.num_features, B)
        n_all_hot += bool(lookup_hot.all())
        parts.append(np.column_stack([b.labels.numpy(), b.dense.numpy()]))
    assert n_all_hot >= sched.hot_batches  # every hot batch is all hot (others may be by chance)
    seen = np.concatenate(parts)
    assert len(np.unique(seen, axis=0)) == len(seen)  # no input twice (dense features tell them apart)
    want = np.concatenate([np.column_stack([b.labels.numpy(), b.dense.numpy()]) for b in plain.batches(0)])
    assert len(seen) > len(want) - 2 * B
    kept = {r.tobytes() for r in want}
    assert all(r.tobytes() in kept for r in seen)
    first = sched.batch(sched.batches_per_epoch)  # the next epoch: another order
    assert sched.batch(sched.batches_per_epoch).rows.equal(first.rows)  # a pure function of k


def test_select_samples_cuts_micro_batches(hand_data):
    batch = BatchStream(hand_data, "train", 6, seed=0, shuffle=False).batch(0)
    sub, pos = select_samples(batch, np.array([1, 3]))
    # input 1: A 1, B 2, M [] ; input 3: A 2, B 1, M [1, 4, 4]
    assert sub.rows.tolist() == [1, 2, 4 + 2, 4 + 1, 7 + 1, 7 + 4, 7 + 4]
    assert sub.offsets.tolist() == [0, 1, 2, 3, 4, 4, 7]
    assert batch.rows[pos].tolist() == sub.rows.tolist()
