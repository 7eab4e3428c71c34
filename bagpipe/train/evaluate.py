"""Evaluation on a dataset's eval split: the one function every topology and ``bagpipe eval`` use.

The figures (:data:`EVAL_KEYS`): log loss, ROC AUC, normalized entropy (log loss over
the entropy of the observed CTR), calibration (mean predicted CTR over observed CTR)
and accuracy (threshold 0.5), over the whole eval split or its first ``max_samples``
samples, in file order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from bagpipe.data.batch import Batch
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.train.metrics import (
    accuracy,
    calibration,
    log_loss,
    normalized_entropy,
    roc_auc,
)
from bagpipe.train.step import forward_logits

#: ``lookup(rows (U,) int64) -> (U, D)`` current weights of global rows.
Lookup = Callable[[torch.Tensor], torch.Tensor]

EVAL_KEYS = ("eval_logloss", "eval_auc", "eval_ne", "eval_calibration", "eval_accuracy")


@torch.no_grad()
def batch_logits(model: torch.nn.Module, lookup: Lookup, batch: Batch) -> torch.Tensor:
    """(B,) logits of ``batch`` with the rows' weights from ``lookup`` (the model in eval
    mode), computed where the model's parameters are; on the host."""
    uniq, inverse = torch.unique(batch.rows, sorted=True, return_inverse=True)
    dev = next(model.parameters()).device
    return forward_logits(model, lookup(uniq).to(dev), inverse.to(dev), batch).cpu()


def scores(labels: np.ndarray, probs: np.ndarray) -> dict:
    """Every figure of :data:`EVAL_KEYS` plus ``eval_samples`` for predictions ``probs`` of ``labels``."""
    return {
        "eval_logloss": log_loss(labels, probs),
        "eval_auc": roc_auc(labels, probs),
        "eval_ne": normalized_entropy(labels, probs),
        "eval_calibration": calibration(labels, probs),
        "eval_accuracy": accuracy(labels, probs),
        "eval_samples": int(len(labels)),
    }


def no_eval() -> dict:
    """The figures of a dataset without an eval split: Nones, 0 samples."""
    return dict.fromkeys(EVAL_KEYS) | {"eval_samples": 0}


@torch.no_grad()
def evaluate(model: torch.nn.Module, lookup: Lookup, dataset: Dataset, batch_size: int, max_samples: int = 0) -> dict:
    """:func:`scores` over the eval split (its first ``max_samples`` samples if > 0), in
    file order; Nones (and 0 samples) when there is no eval split."""
    if not dataset.has_split("eval"):
        return no_eval()
    stream = BatchStream(dataset, "eval", batch_size, shuffle=False, drop_last=False)
    model.eval()
    labels, probs = [], []
    seen = 0
    for batch in stream.batches():
        labels.append(batch.labels.numpy())
        probs.append(torch.sigmoid(batch_logits(model, lookup, batch)).numpy())
        seen += batch.batch_size
        if max_samples and seen >= max_samples:
            break
    model.train()
    y, p = np.concatenate(labels), np.concatenate(probs)
    if max_samples:
        y, p = y[:max_samples], p[:max_samples]
    return scores(y, p)


def figure(v, fmt: str = ".4f") -> str:
    """A printed figure: ``n/a`` for one that is null in a run's files or NaN before it is
    written (an eval split of one class has no AUC), else ``v`` in ``fmt``."""
    return "n/a" if v is None or v != v else format(v, fmt)


def eval_line(ev: dict) -> str:
    """One line of an evaluation's figures (the progress note, ``bagpipe eval``)."""
    if not ev.get("eval_samples"):
        return "no eval split"

    def fig(key: str, fmt: str = ".4f") -> str:
        return figure(ev.get(key), fmt)

    return (
        f"eval logloss {fig('eval_logloss')}, eval AUC {fig('eval_auc')}, NE {fig('eval_ne')}, "
        f"calibration {fig('eval_calibration', '.3f')}, accuracy {fig('eval_accuracy')} "
        f"on {ev['eval_samples']:,} samples"
    )
