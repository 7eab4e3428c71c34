"""The headline metric, checked against independent computations.

:func:`bagpipe.train.metrics.roc_auc` ranks the scores once (average ranks for ties) and
uses the rank-sum formula. Here it is compared with (a) a case computed by hand, ties
included, and (b) the definition itself -- the Mann-Whitney U statistic counted pair by
pair: AUC = P(score of a positive > score of a negative) + 1/2 P(equal) -- on random
inputs with many ties. Also the normalised entropy against its definition.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bagpipe.train.metrics import log_loss, normalized_entropy, roc_auc


def mann_whitney_auc(labels: list[int], scores: list[float]) -> float:
    """The AUC by its definition: over every (positive, negative) pair, 1 when the positive
    scores higher, 1/2 when they tie, 0 otherwise; the mean of that."""
    pos = [s for y, s in zip(labels, scores) if y == 1]
    neg = [s for y, s in zip(labels, scores) if y == 0]
    u = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return u / (len(pos) * len(neg))


@pytest.mark.unit
def test_roc_auc_of_a_case_computed_by_hand_with_ties():
    # positives score 0.9, 0.5, 0.5; negatives 0.5, 0.1.
    # pairs (pos, neg): (0.9,0.5)=1 (0.9,0.1)=1 (0.5,0.5)=1/2 (0.5,0.1)=1 (0.5,0.5)=1/2 (0.5,0.1)=1
    # U = 5, pairs = 6: AUC = 5/6
    labels = np.array([1, 0, 1, 1, 0])
    scores = np.array([0.9, 0.5, 0.5, 0.5, 0.1])
    assert roc_auc(labels, scores) == pytest.approx(5 / 6, abs=1e-15)


@pytest.mark.unit
def test_roc_auc_extremes_and_one_class():
    y = np.array([0, 0, 1, 1])
    assert roc_auc(y, np.array([0.1, 0.2, 0.3, 0.4])) == 1.0
    assert roc_auc(y, np.array([0.4, 0.3, 0.2, 0.1])) == 0.0
    assert roc_auc(y, np.full(4, 0.7)) == 0.5  # every pair ties
    assert math.isnan(roc_auc(np.ones(3), np.array([0.1, 0.2, 0.3])))
    assert math.isnan(roc_auc(np.zeros(3), np.array([0.1, 0.2, 0.3])))


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 1), st.integers(0, 6)),  # few distinct scores: many ties
        min_size=2,
        max_size=60,
    ).filter(lambda xs: 0 < sum(y for y, _ in xs) < len(xs))
)
def test_roc_auc_equals_the_mann_whitney_statistic(pairs):
    labels = [y for y, _ in pairs]
    scores = [s / 7 for _, s in pairs]
    assert roc_auc(np.array(labels), np.array(scores)) == pytest.approx(mann_whitney_auc(labels, scores), abs=1e-12)


@pytest.mark.unit
@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.floats(0.01, 0.99)), min_size=2, max_size=40))
def test_normalized_entropy_is_log_loss_over_the_base_rate_entropy(pairs):
    labels = np.array([y for y, _ in pairs], dtype=np.float64)
    probs = np.array([p for _, p in pairs])
    ctr = labels.mean()
    if ctr in (0.0, 1.0):
        assert math.isnan(normalized_entropy(labels, probs))
        return
    by_hand = -np.mean(labels * np.log(probs) + (1 - labels) * np.log(1 - probs))
    base = -(ctr * math.log(ctr) + (1 - ctr) * math.log(1 - ctr))
    assert log_loss(labels, probs) == pytest.approx(by_hand, rel=1e-12)
    assert normalized_entropy(labels, probs) == pytest.approx(by_hand / base, rel=1e-12)
