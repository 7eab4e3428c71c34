"""Slipstream's stale-row skip (``bagpipe/train/step/slipstream.py``) on hand-made cases.

* **Threshold search.** Four watched rows with known drifts (0, 0.1, 0.5, 2.0) and a
  sample of ten inputs of two lookups each (one of them on an unwatched row in three
  inputs): with alpha = all lookups the inputs' keys are 0, 0.1, 0.1, 0.5, 0.5, 2, 2,
  inf, inf, inf, so the share skippable is 0.3 exactly for T in (0.1, 0.5]; bisection from
  [0, 2] stops at T = 0.5 (2 -> 1 -> 0.5), rows 0 and 1 are stale, inputs 0, 1, 2 are
  skipped. Keys with alpha = 1 and of multi-hot inputs worked out by hand; a target
  that the sample cannot reach takes every skippable input.
* **A skipped input changes no parameter.** One step with input j skipped ends bitwise
  equal to one step on the batch without input j (row-wise Adam, whose momentum would
  move a row given a zero gradient), and the rows only input j looks up keep their
  values and optimizer state; a step whose inputs are all skipped changes nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bagpipe.accel.profile import HotSet
from bagpipe.config.sections import ApproxConfig
from bagpipe.data.batch import Batch, make_batch, select_samples
from bagpipe.data.schema import FeatureSpec
from bagpipe.models import build_model, recipe
from bagpipe.optim.build import build_dense_optimizer, build_sparse_optimizer
from bagpipe.train.protocols import StepInput
from bagpipe.train.step import LocalRowUpdate, train_step
from bagpipe.train.step.slipstream import StaleSkip, find_threshold, input_keys, keep_inputs, skip_mask

pytestmark = pytest.mark.unit

NUM_ROWS = 12
FEATS = [FeatureSpec("a", 10), FeatureSpec("b", 2)]
# ten inputs, two lookups each (rows of a 10-row table; 9 is not watched); the second table is unused here
PAIRS = [(0, 0), (0, 1), (1, 1), (0, 2), (2, 2), (1, 3), (3, 3), (0, 9), (9, 9), (2, 9)]
DRIFT = np.array([0.0, 0.1, 0.5, 2.0])


def one_hot(pairs, tables=(0, 0)) -> Batch:
    """Inputs of two one-hot lookups each, both into table ``a`` (global rows 0..9)."""
    feats = [FeatureSpec("a", 10), FeatureSpec("a2", 10)]
    offs = np.array([0, 0, 10])  # both features read the same 10 rows
    B = len(pairs)
    return make_batch(feats, offs, np.arange(B) % 2, np.zeros((B, 1)), np.array(pairs))


def lookup_drift(batch: Batch) -> np.ndarray:
    rows = batch.rows.numpy()
    return np.where(rows < 4, DRIFT[np.minimum(rows, 3)], np.inf)


def test_keys_threshold_and_skips_by_hand():
    batch = one_hot(PAIRS)
    keys = input_keys(batch, lookup_drift(batch), alpha=0)
    assert keys.tolist() == [0.0, 0.1, 0.1, 0.5, 0.5, 2.0, 2.0, np.inf, np.inf, np.inf]
    T, share, steps = find_threshold(keys, 0.3, 0.08)
    assert (T, share, steps) == (0.5, 0.3, 2)
    stale = HotSet(np.flatnonzero(DRIFT < T), 10)
    assert stale.rows.tolist() == [0, 1]
    assert skip_mask(batch, stale, 0).tolist() == [True] * 3 + [False] * 7
    # alpha = 1: one stale lookup is enough; the key is the smaller drift
    assert input_keys(batch, lookup_drift(batch), alpha=1).tolist() == [
        0.0,
        0.0,
        0.1,
        0.0,
        0.5,
        0.1,
        2.0,
        0.0,
        np.inf,
        0.5,
    ]
    assert skip_mask(batch, stale, 1).tolist() == [True, True, True, True, False, True, False, True, False, False]
    # a target the sample cannot reach: T just above the largest finite key, every skippable input
    T, share, steps = find_threshold(keys, 0.9, 0.05)
    assert T > 2.0 and share == 0.7 and steps == 0


def test_search_from_snapshots_by_hand():
    """The whole decision: two snapshots of the watched rows 0..3, the drifts above."""
    first = torch.zeros(4, 2)
    second = torch.tensor([[0.0, 0.0], [0.1, -0.05], [-0.5, 0.2], [2.0, 1.0]])
    snaps = iter([first, second])
    settings = ApproxConfig(skip_stale=True, stale_start=0, stale_sampling_share=0.5, stale_sample_rate=0.25)
    sk = StaleSkip(settings, np.arange(4), lambda: next(snaps), 10, 4, lambda a, b: [one_hot(PAIRS)])
    assert (sk.start, sk.decide_at, sk.sample_steps) == (0, 2, 1)
    sk.first = sk.read_watched()
    sk.decide(sk.read_watched())
    d = sk.decision
    assert (d["threshold"], d["stale_rows"], d["sample_inputs"], d["sample_skippable_share"]) == (0.5, 2, 10, 0.3)
    assert sk.stale is not None and sk.stale.rows.tolist() == [0, 1]


def test_multi_hot_keys_by_hand():
    feats = [FeatureSpec("m", 10, multi_hot=True)]
    # input 0: rows 0, 1 (drifts 0, 0.1); input 1: no lookups; input 2: rows 2, 9, 3 (0.5, inf, 2)
    values, lengths = np.array([0, 1, 2, 9, 3]), np.array([2, 0, 3])
    batch = make_batch(
        feats,
        np.array([0, 10]),
        np.zeros(3),
        np.zeros((3, 1)),
        np.zeros((3, 0), np.int64),
        multihot={"m": (values, lengths)},
    )
    d = lookup_drift(batch)
    assert input_keys(batch, d, 0).tolist() == [0.1, np.inf, np.inf]
    assert input_keys(batch, d, 2).tolist() == [0.1, np.inf, 2.0]
    stale = HotSet(np.array([0, 1, 2]), 10)
    assert skip_mask(batch, stale, 0).tolist() == [True, False, False]
    assert skip_mask(batch, stale, 1).tolist() == [True, False, True]


def _setup(seed: int = 3):
    torch.manual_seed(seed)
    mcfg = recipe("dlrm", "debug")
    D = mcfg.embedding_dim
    model = build_model(mcfg, 1, 2)
    dense = build_dense_optimizer("adam", 0.01, model.parameters())
    rows_opt = build_sparse_optimizer("adam", 0.01, D)
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(NUM_ROWS, D, generator=g)
    state = torch.zeros(NUM_ROWS, rows_opt.state_dim)
    # a first step with every input, so the Adam moments of the rows are not zero
    return model, dense, rows_opt, weights, state


def _inp(step: int, batch: Batch, weights, state) -> StepInput:
    uniq, inverse = torch.unique(batch.rows, sorted=True, return_inverse=True)
    return StepInput(step, batch, weights, state, uniq, inverse)


def _batch() -> Batch:
    rng = np.random.default_rng(0)
    B = 8
    sparse = np.stack([rng.integers(0, 8, B), rng.integers(0, 2, B)], axis=1)
    sparse[5] = [9, 1]  # input 5 alone looks up row 9 of table a
    return make_batch(FEATS, np.array([0, 10, 12]), np.array([1, 0] * 4), rng.normal(size=(B, 1)), sparse)


def _params(model, weights, state) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()] + [weights.clone(), state.clone()]


def _run(skip_rows: list[int] | None, drop: int | None):
    """Two steps (every input, then the batch with ``skip_rows`` stale or input ``drop`` removed)."""
    model, dense, rows_opt, weights, state = _setup()
    batch = _batch()
    times = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    train_step(model, dense, LocalRowUpdate(rows_opt), _inp(0, batch, weights, state), times)
    step = train_step
    if skip_rows is not None:
        sk = StaleSkip(
            ApproxConfig(skip_stale=True, stale_start=100),
            np.array(skip_rows),
            lambda: None,
            NUM_ROWS,
            50,
            lambda a, b: [],
        )
        sk.stale = HotSet(np.array(skip_rows), NUM_ROWS)
        step = sk.wrap(train_step)
    if drop is not None:
        batch, _ = select_samples(batch, np.delete(np.arange(batch.batch_size), drop))
    before = _params(model, weights, state)
    step(model, dense, LocalRowUpdate(rows_opt), _inp(1, batch, weights, state), times)
    return before, _params(model, weights, state)


def test_skipped_input_changes_no_parameter():
    # input 5 is [row 9, row 11]: rows 9 and 11 stale make it (alone) skippable with alpha = all
    batch = _batch()
    assert skip_mask(batch, HotSet(np.array([9, 11]), NUM_ROWS), 0).tolist() == [i == 5 for i in range(8)]
    _, skipped = _run([9, 11], None)
    _, without = _run(None, 5)
    for a, b in zip(skipped, without):
        assert torch.equal(a, b)
    before, _ = _run(None, None)
    assert torch.equal(skipped[-2][9], before[-2][9]) and torch.equal(
        skipped[-1][9], before[-1][9]
    )  # row 9: only input 5


def test_all_inputs_skipped_changes_nothing():
    before, after = _run(list(range(NUM_ROWS)), None)
    for a, b in zip(before, after):
        assert torch.equal(a, b)


def test_keep_inputs_gathers_only_the_kept_rows():
    batch = _batch()
    w = torch.arange(NUM_ROWS, dtype=torch.float32)[:, None].repeat(1, 2)
    inp = _inp(0, batch, w, torch.zeros(NUM_ROWS, 1))
    keep = np.ones(8, dtype=bool)
    keep[5] = False
    sub = keep_inputs(inp, keep)
    assert 9 not in sub.index.tolist() and sub.index.tolist() == sorted(sub.index.tolist())
    assert torch.equal(sub.index[sub.inverse], sub.batch.rows)
