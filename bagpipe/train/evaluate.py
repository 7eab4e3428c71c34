"""Evaluation on a dataset's eval split: log loss and ROC AUC."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.train.metrics import log_loss, roc_auc
from bagpipe.train.step import forward_logits

#: ``lookup(rows (U,) int64) -> (U, D)`` current weights of global rows.
Lookup = Callable[[torch.Tensor], torch.Tensor]


@torch.no_grad()
def evaluate(model: torch.nn.Module, lookup: Lookup, dataset: Dataset, batch_size: int, max_samples: int = 0) -> dict:
    """``{"eval_logloss", "eval_auc", "eval_samples"}`` over the eval split (its first
    ``max_samples`` samples if > 0), in file order; Nones when there is no eval split."""
    if not dataset.has_split("eval"):
        return {"eval_logloss": None, "eval_auc": None, "eval_samples": 0}
    stream = BatchStream(dataset, "eval", batch_size, shuffle=False, drop_last=False)
    model.eval()
    labels, probs = [], []
    seen = 0
    for batch in stream.batches():
        uniq, inverse = torch.unique(batch.rows, sorted=True, return_inverse=True)
        logits = forward_logits(model, lookup(uniq), inverse, batch)
        labels.append(batch.labels.numpy())
        probs.append(torch.sigmoid(logits).numpy())
        seen += batch.batch_size
        if max_samples and seen >= max_samples:
            break
    model.train()
    y, p = np.concatenate(labels), np.concatenate(probs)
    if max_samples:
        y, p = y[:max_samples], p[:max_samples]
    return {"eval_logloss": log_loss(y, p), "eval_auc": roc_auc(y, p), "eval_samples": int(len(y))}
