"""Evaluation metrics (ROC AUC, log loss, normalized entropy, calibration, accuracy), plus resource readings.

Every metric takes 0/1 ``labels`` and predicted click probabilities ``probs`` of the
same samples (float arrays of any shape) and computes in float64.
"""

from __future__ import annotations

import numpy as np
import psutil


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
    return psutil.Process().memory_info().rss / (1024.0 * 1024.0)


def rss_breakdown_mb() -> dict:
    """Current anonymous (private heap) and file-backed resident memory, from /proc (Linux)."""
    out = {"anon": 0.0, "file": 0.0}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    out["anon"] = int(line.split()[1]) / 1024.0
                elif line.startswith("RssFile:"):
                    out["file"] = int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return out


class RssSampler:
    """Samples anonymous RSS in a background thread and keeps its peak (MiB).

    ``peak_rss_mb`` (ru_maxrss) also counts file pages a memory map touched, which the
    kernel can drop at will; the anonymous peak is the memory the process owns.
    """

    def __init__(self, interval_s: float = 0.05):
        import threading

        self.peak_anon_mb = rss_breakdown_mb()["anon"]
        self._stop = threading.Event()
        self._interval = interval_s
        self._t = threading.Thread(target=self._run, daemon=True, name="bagpipe-rss")
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak_anon_mb = max(self.peak_anon_mb, rss_breakdown_mb()["anon"])

    def stop(self) -> float:
        self._stop.set()
        self._t.join(timeout=1)
        self.peak_anon_mb = max(self.peak_anon_mb, rss_breakdown_mb()["anon"])
        return self.peak_anon_mb
