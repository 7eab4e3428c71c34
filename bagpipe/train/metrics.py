"""Evaluation metrics (ROC AUC, log loss, normalized entropy, calibration, accuracy), plus resource readings.

Every metric takes 0/1 ``labels`` and predicted click probabilities ``probs`` of the
same samples (float arrays of any shape) and computes in float64.
"""

from __future__ import annotations

import numpy as np


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve via the rank-sum formula (ties get average ranks).

    Returns NaN when only one class is present.
    """
    labels = np.asarray(labels, dtype=np.float64).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    pos = labels > 0.5
    n_pos = int(pos.sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # average rank of each group of tied scores (ranks are 1-based)
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg_rank = first + (counts + 1) / 2.0
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(avg_rank, counts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def log_loss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities ``probs`` against 0/1 ``labels``."""
    labels = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), eps, 1 - eps)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def entropy(p: float) -> float:
    """Binary entropy (nats) of a click rate ``p``: the log loss of always predicting ``p``."""
    if not 0.0 < p < 1.0:
        return 0.0
    return float(-(p * np.log(p) + (1 - p) * np.log(1 - p)))


def normalized_entropy(labels: np.ndarray, probs: np.ndarray) -> float:
    """Log loss divided by the entropy of the observed click rate (He et al., 2014):
    1.0 is no better than predicting the base CTR, lower is better. NaN with one class."""
    h = entropy(float(np.mean(np.asarray(labels, dtype=np.float64))))
    return log_loss(labels, probs) / h if h > 0 else float("nan")


def calibration(labels: np.ndarray, probs: np.ndarray) -> float:
    """Mean predicted CTR / observed CTR: 1.0 is calibrated, > 1 over-predicts clicks. NaN without clicks."""
    clicks = float(np.sum(np.asarray(labels, dtype=np.float64)))
    return float(np.sum(np.asarray(probs, dtype=np.float64)) / clicks) if clicks > 0 else float("nan")


def accuracy(labels: np.ndarray, probs: np.ndarray, threshold: float = 0.5) -> float:
    """Share of samples whose prediction (click when p > ``threshold``) equals the label."""
    y = np.asarray(labels, dtype=np.float64).ravel() > 0.5
    return float(np.mean((np.asarray(probs, dtype=np.float64).ravel() > threshold) == y))


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux ru_maxrss is KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    """Resident set size of this process now, in MiB."""
    try:
        import psutil
    except ImportError:  # a bare GPU machine may lack it (make gpu-check installs nothing): Linux's own figure
        import os

        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1024.0 * 1024.0)
    return psutil.Process().memory_info().rss / (1024.0 * 1024.0)
