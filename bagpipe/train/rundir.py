"""The run directory: the one place that writes a run's files.

Layout of ``RUN/``::

    config.json     the run's settings (by section) and model architecture; what
                    `bagpipe eval` rebuilds the model from
    metrics.jsonl   one JSON object per line: {"step", "loss", "samples_per_s", "lr",
                    "embedding_lr"} every few steps (the rates of the step just done),
                    {"step", "eval_logloss", "eval_auc", "eval_ne", "eval_calibration",
                    "eval_accuracy", "eval_samples"} at each evaluation
    summary.json    the finished run (:func:`bagpipe.train.summary.build_summary`)
    checkpoints/    :mod:`bagpipe.train.checkpoint`

Every topology writes these through :class:`RunDir` (in a distributed run, trainer 0
does), so their schema is the same everywhere. The digest (``params_sha256``) is
computed here too: one sha256 over every dense parameter by name, then every embedding
row's weights and optimizer state in global row order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from bagpipe.files import atomic_write_text

Rows = Iterator[tuple[int, np.ndarray, np.ndarray]]


class MetricsLog:
    """Appends one JSON object per line to RUN/metrics.jsonl (flushed per record)."""

    def __init__(self, path: Path):
        self.f = open(path, "a")

    def write(self, **record) -> None:
        self.f.write(json.dumps(record) + "\n")
        self.f.flush()

    def close(self) -> None:
        self.f.close()


class RunDir:
    """The files of one run under ``path``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def config_file(self) -> Path:
        return self.path / "config.json"

    @property
    def summary_file(self) -> Path:
        return self.path / "summary.json"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    def write_config(self, train: dict, model) -> None:
        """RUN/config.json: ``{"train": settings by section, "model": the architecture}``."""
        self.create()
        atomic_write_text(self.config_file, json.dumps({"train": train, "model": dataclasses.asdict(model)}, indent=2))

    def read_config(self) -> dict:
        from bagpipe.data.schema import read_json

        return read_json(self.config_file)

    def metrics(self) -> MetricsLog:
        self.create()
        return MetricsLog(self.metrics_file)

    def write_summary(self, summary: dict, also: str | None = None) -> None:
        """RUN/summary.json, and ``also`` (--summary-json) if given."""
        text = json.dumps(summary, indent=2)
        atomic_write_text(self.summary_file, text)
        if also:
            Path(also).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(also, text)


def dense_digest(model: torch.nn.Module):
    """A sha256 started over every dense parameter (by name); feed it the rows with :func:`hashed`."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h


def hashed(rows: Rows, h) -> Rows:
    """Pass (start, weights, state) chunks through while adding them to digest ``h``."""
    for a, w, s in rows:
        h.update(np.ascontiguousarray(w, dtype=np.float32).tobytes())
        h.update(np.ascontiguousarray(s, dtype=np.float32).tobytes())
        yield a, w, s


def digest_and_save(model: torch.nn.Module, rows: Rows, *, digest: bool, save: Callable[[Rows], None] | None) -> str | None:
    """One pass over every (start, weights, state) chunk of ``rows`` feeds both
    params_sha256 (if ``digest``) and a checkpoint (``save(rows)``, if given);
    returns the digest or None."""
    h = dense_digest(model) if digest else None
    rows = rows if h is None else hashed(rows, h)
    if save is not None:
        save(rows)
    elif h is not None:
        for _ in rows:
            pass
    return h.hexdigest() if h is not None else None
