"""What a finished run reports: the step meter and the one summary builder.

Every topology (one process, a data-parallel trainer) and the TorchRec peer of
``bagpipe bench peers`` time their steps with :class:`StepMeter` and report with
:func:`build_summary`, so ``summary.json`` has one schema and one meaning everywhere:

* ``samples_per_s`` and ``time_per_step_ms`` cover the *measured* steps: the steps of
  this run after the first ``warmup_steps`` (all of them when there is no warm-up);
* ``time_per_step_ms`` splits a step of the trainer's thread into ``wait_embeddings``
  (waiting for prefetched rows and installing them), ``forward``, ``backward``,
  ``optimizer`` (dense and row updates), ``sync_wait`` (completing deferred embedding
  synchronisation; 0 on one process) and ``writeback`` (copying rows out of the cache);
* ``io_per_step`` is the process's block-device bytes read and written and its major page
  faults per measured step (``/proc/self/io``, every thread: page cache misses of a disk
  store, faults through its memory map included);
* ``train_logloss`` is the mean loss of the last 50 steps (averaged over the trainers);
* ``eval_*`` are the final evaluation's figures (:mod:`bagpipe.train.evaluate`): log loss,
  AUC, normalized entropy, calibration, accuracy, and the samples they cover.
"""

from __future__ import annotations

import time
from typing import Callable

from bagpipe.train.metrics import current_rss_mb, peak_rss_mb

TIME_KEYS = ("wait_embeddings", "forward", "backward", "optimizer", "sync_wait", "writeback")
LOSS_WINDOW = 50  # steps the summary's train_logloss averages


class StepMeter:
    """Wall time, losses and per-phase seconds of a run's steps, warm-up excluded.

    Args:
        start: the first step of this run (a resumed run starts past 0).
        warmup: steps left out of the measured figures.
        batch_size: B, samples per (global) step.
        phases: cumulative seconds per phase kept elsewhere (the pipeline's waits, the
            row strategy's sync waits); added to the step's own :attr:`times`.
    """

    def __init__(self, *, start: int, warmup: int, batch_size: int, phases: Callable[[], dict] | None = None):
        self.start = self.step = start
        self.warmup = warmup
        self.batch_size = batch_size
        self.times = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}  # train_step adds to these
        self.losses: list[float] = []
        self._phases = phases or dict
        self.t_start = time.perf_counter()
        self._t_measure: float | None = None
        self._at_warmup: dict | None = None
        self._io_start = io_counters()
        self._io_end: dict | None = None
        self._t_end: float | None = None

    def seconds(self) -> dict:
        """Cumulative seconds per phase (every key of TIME_KEYS)."""
        extra = self._phases()
        return {k: self.times.get(k, 0.0) + extra.get(k, 0.0) for k in TIME_KEYS}

    def record(self, step: int, loss: float) -> None:
        """Step ``step`` (1-based count of steps done) ended with ``loss``."""
        self.losses.append(loss)
        self.step = step
        if step - self.start == self.warmup and self.warmup > 0:
            self._t_measure = time.perf_counter()
            self._at_warmup = self.seconds()
            self._io_start = io_counters()

    @property
    def trained(self) -> int:
        return self.step - self.start

    def samples_per_s(self) -> float:
        """Throughput since the start of this run (warm-up included): the progress line's figure."""
        return self.trained * self.batch_size / max(time.perf_counter() - self.t_start, 1e-9)

    def stop(self) -> None:
        """The last step is done: later work (evaluation, digest) is not timed."""
        self._t_end = time.perf_counter()
        self._io_end = io_counters()

    def result(self) -> dict:
        """seconds, steps_this_run, measured_steps, samples_per_s, time_per_step_ms."""
        t_end = self._t_end if self._t_end is not None else time.perf_counter()
        t0, at = self._t_measure, self._at_warmup
        if t0 is None:  # no warm-up, or a resumed run shorter than it
            t0, at = self.t_start, dict.fromkeys(TIME_KEYS, 0.0)
        measured = self.trained - (self.warmup if self.trained > self.warmup else 0)
        now = self.seconds()
        io_end = self._io_end or io_counters()
        return {
            "seconds": t_end - self.t_start,
            "steps_this_run": self.trained,
            "measured_steps": measured,
            "samples_per_s": measured * self.batch_size / max(t_end - t0, 1e-9),
            "time_per_step_ms": {k: 1000 * (now[k] - at[k]) / max(measured, 1) for k in TIME_KEYS},
            "io_per_step": {k: (io_end[k] - self._io_start[k]) / max(measured, 1) for k in io_end},
        }


def io_counters() -> dict:
    """This process's bytes read from and written to block devices (``/proc/self/io``: page
    cache misses, mapped-file faults included; every thread) and its major page faults.
    Zeros where /proc/self/io is not readable."""
    import resource

    out = {"read_bytes": 0, "write_bytes": 0}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in out:
                    out[k] = int(v)
    except OSError:
        pass
    out["major_faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    return out


def build_summary(
    *,
    mode: str,
    model: str,
    optimizer: str,
    batch_size: int,
    steps: int,
    timing: dict,
    train_logloss: float | None,
    evaluation: dict,
    params_sha256: str | None,
    peak_anon_rss_mb: float,
    total_rows: int,
    embedding_dim: int,
    cache: dict,
    distributed: dict | None,
    epochs: float | None = None,
    checkpoints: dict | None = None,
    approximation: dict | None = None,
) -> dict:
    """The summary.json of a run (see the module docstring for the meaning of each figure).

    ``checkpoints``: how many were written this run (full ones among them), seconds
    and bytes in all, and the step of the last. ``epochs`` is the steps as a multiple of the train split's batches (1.5: half way
    through the second epoch); ``timing`` is :meth:`StepMeter.result`; ``evaluation`` the result of
    :func:`bagpipe.train.evaluate.evaluate`; ``cache`` the embedding side's statistics
    (empty for full tables); ``distributed`` the data-parallel statistics, None on one process.
    ``approximation``: what an approximate run (``--skip-stale``, ``--cache-sync periodic:K``,
    ``--fae-schedule split``) left out, or None: the summary then says ``"exact": true``.
    An approximate run's ``params_sha256`` is written but is not that of ``--mode full``.
    """
    return {
        "mode": mode,
        "exact": approximation is None,
        "approximation": approximation,
        "model": model,
        "optimizer": optimizer,
        "steps": steps,
        "epochs": epochs,
        "steps_this_run": timing["steps_this_run"],
        "samples": timing["steps_this_run"] * batch_size,
        "batch_size": batch_size,
        "seconds": timing["seconds"],
        "measured_steps": timing["measured_steps"],
        "samples_per_s": timing["samples_per_s"],
        "train_logloss": train_logloss,
        "eval_logloss": evaluation.get("eval_logloss"),
        "eval_auc": evaluation.get("eval_auc"),
        "eval_ne": evaluation.get("eval_ne"),
        "eval_calibration": evaluation.get("eval_calibration"),
        "eval_accuracy": evaluation.get("eval_accuracy"),
        "eval_samples": evaluation.get("eval_samples", 0),
        "params_sha256": params_sha256,
        "peak_rss_mb": peak_rss_mb(),
        "peak_anon_rss_mb": peak_anon_rss_mb,
        "rss_mb": current_rss_mb(),
        "total_rows": total_rows,
        "embedding_dim": embedding_dim,
        "time_per_step_ms": timing["time_per_step_ms"],
        "io_per_step": timing.get("io_per_step"),
        "cache": cache,
        "distributed": distributed,
        "checkpoints": checkpoints,
    }
