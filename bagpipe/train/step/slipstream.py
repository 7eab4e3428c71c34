"""Slipstream's stale-row skip (``--skip-stale``): an opt-in approximation.

Slipstream (Maboud et al., VLDB 2024) observes that many hot rows stop changing early
("saturate"), and leaves out of training the inputs whose lookups are such stale rows.
Here, on one process (``--mode full``, or ``lookahead`` with a hot tier):

1. **Watch.** The watched rows are the hot rows: the hot tier's (``lookahead``), or for
   ``full`` the rows the profiler picks for ``--hot-budget-mb`` (FAE's 256 MiB unless told)
   -- :func:`bagpipe.accel.hot.hot_set_for`.
2. **Snapshot** their values before step ``s`` (``--stale-start``) and again after the
   sampling phase (``--stale-sampling-share`` of an epoch's steps, at least one step). A
   row's drift is its largest change over its D values; a row is *stale* when its drift
   is below a threshold T. Rows that are not watched are never stale.
3. **Search T** by bisection on a sample of the inputs that follow (``--stale-sample-rate``
   of an epoch's inputs, the batches right after the sampling phase) so that the share of
   inputs with at least alpha stale lookups (``--stale-alpha``; 0: all their lookups) is
   the target D within its tolerance (``--stale-target``, ``--stale-tolerance``). An input
   is skippable at T exactly when its *key* -- the alpha-th smallest drift among its
   lookups -- is below T, so the share is a step function of T and bisection over
   [0, largest key] finds it (:func:`find_threshold`).
4. **Skip.** From then on, each batch's inputs with at least alpha stale lookups are left
   out of forward and backward (:meth:`StaleSkip.wrap`): the step runs the ordinary step on
   the kept inputs (the mean loss over them), and only the rows they look up are updated;
   a row looked up only by skipped inputs is not touched. The cache's plans are not
   changed: the rows of skipped inputs are still fetched and written back, unchanged.

Every decision is a function of the seed (the rows' values are those of an exact run
until the decision; the sample is batches of the seeded stream), so two runs with the
same seed skip the same inputs. The digest of such a run is still written, but the run
is marked ``"exact": false`` and never compared with ``--mode full``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F

from bagpipe.accel.hot import hot_set_for
from bagpipe.accel.profile import HotSet, profile
from bagpipe.config.modes import FAE_BUDGET_MB, ModeSpec
from bagpipe.config.sections import ApproxConfig, HotConfig
from bagpipe.data.batch import Batch, select_samples
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.oracle.unique import unique_inverse
from bagpipe.train.protocols import Backend, StepInput
from bagpipe.train.step.plain import forward_logits

log = logging.getLogger(__name__)

MAX_BISECTIONS = 60


def _lookup_samples(batch: Batch) -> np.ndarray | None:
    """(N,) the input of every lookup of ``batch``, or None when it is one id per bag (the
    (F, B) grid of one-hot data)."""
    B, Fn = batch.batch_size, batch.num_features
    offsets = batch.offsets.numpy()
    if len(batch.rows) == Fn * B and np.array_equal(offsets, np.arange(Fn * B + 1)):
        return None
    bag = np.repeat(np.arange(Fn * B, dtype=np.int64), np.diff(offsets))
    return bag % B


def input_keys(batch: Batch, lookup_drift: np.ndarray, alpha: int) -> np.ndarray:
    """(B,) each input's key: the ``alpha``-th smallest drift among its lookups (alpha 0:
    the largest), inf when it has fewer than alpha lookups or none. An input is skippable
    at threshold T exactly when its key < T. ``lookup_drift`` (N,): the drift of the row of
    every lookup (inf for rows that are not watched)."""
    B = batch.batch_size
    sample = _lookup_samples(batch)
    if sample is None:  # one-hot: an (F, B) grid
        grid = np.sort(lookup_drift.reshape(batch.num_features, B), axis=0)
        k = grid.shape[0] if alpha == 0 else alpha
        return grid[k - 1] if k <= grid.shape[0] else np.full(B, np.inf)
    order = np.lexsort((lookup_drift, sample))
    counts = np.bincount(sample, minlength=B)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    need = counts if alpha == 0 else np.full(B, alpha)
    ok = (need >= 1) & (need <= counts)
    keys = np.full(B, np.inf)
    keys[ok] = lookup_drift[order][first[ok] + need[ok] - 1]
    return keys


def find_threshold(keys: np.ndarray, target: float, tolerance: float) -> tuple[float, float, int]:
    """Bisection for T with ``mean(keys < T)`` within ``tolerance`` of ``target``.

    Returns (T, the share skippable at T, bisection steps). When even the largest key
    cannot reach the target (too few inputs made only of watched rows), T is just above
    the largest finite key: every input that can be skipped is. When no T lands within the
    tolerance (the share jumps past it at one key), the T whose share is closest is taken.
    """
    keys = np.asarray(keys, dtype=np.float64)
    if len(keys) == 0 or not np.isfinite(keys).any():
        return 0.0, 0.0, 0

    def share(t: float) -> float:
        return float(np.mean(keys < t))

    top = float(keys[np.isfinite(keys)].max())
    hi = np.nextafter(top, np.inf)
    if share(hi) <= target + tolerance:
        return float(hi), share(hi), 0
    lo, hi = 0.0, top
    best = (abs(share(hi) - target), float(hi))
    for i in range(1, MAX_BISECTIONS + 1):
        mid = (lo + hi) / 2
        s = share(mid)
        best = min(best, (abs(s - target), mid))
        if abs(s - target) <= tolerance:
            return float(mid), s, i
        if s < target:
            lo = mid
        else:
            hi = mid
    return best[1], share(best[1]), MAX_BISECTIONS


def skip_mask(batch: Batch, stale: HotSet, alpha: int) -> np.ndarray:
    """(B,) bool: the inputs of ``batch`` with at least ``alpha`` lookups of ``stale`` rows
    (alpha 0: all their lookups, and at least one)."""
    B = batch.batch_size
    hit = stale.contains(batch.rows.numpy())
    sample = _lookup_samples(batch)
    if sample is None:
        count = hit.reshape(batch.num_features, B).sum(axis=0)
        need = np.full(B, batch.num_features if alpha == 0 else alpha)
    else:
        count = np.bincount(sample[hit], minlength=B)
        need = np.bincount(sample, minlength=B) if alpha == 0 else np.full(B, alpha)
    return (need >= 1) & (count >= need)


def keep_inputs(inp: StepInput, keep: np.ndarray) -> StepInput:
    """The step's input restricted to the inputs ``keep`` (B,) bool: the sub-batch, and
    only the unique rows those inputs look up (ascending row, as the step expects)."""
    sub, pos = select_samples(inp.batch, np.flatnonzero(keep))
    upos, inverse = unique_inverse(inp.inverse.numpy()[pos])
    return dataclasses.replace(
        inp, batch=sub, index=inp.index[torch.from_numpy(upos)], inverse=torch.from_numpy(inverse)
    )


class StaleSkip:
    """Slipstream's snapshots, threshold search and input skip for one run (module docstring).

    Args:
        watched: (H,) the watched (hot) rows, ascending global rows.
        read_watched: a copy of their current values, (H, D), in the order of ``watched``.
        num_rows: R, the row space (for the stale rows' bitmap).
        batches_per_epoch: the train split's steps per epoch.
        sample_batches: ``(a, b) ->`` batches a..b-1 of the run's stream (the search's sample).
        say: one-line notices (the decision).
    """

    def __init__(
        self,
        settings,
        watched: np.ndarray,
        read_watched: Callable[[], torch.Tensor],
        num_rows: int,
        batches_per_epoch: int,
        sample_batches: Callable[[int, int], Iterable[Batch]],
    ):
        a = settings
        self.alpha, self.target, self.tolerance = int(a.stale_alpha), float(a.stale_target), float(a.stale_tolerance)
        self.watched, self.read_watched, self.num_rows = (
            np.asarray(watched, dtype=np.int64),
            read_watched,
            int(num_rows),
        )
        self.bpe = int(batches_per_epoch)
        self.start = int(a.stale_start)
        self.decide_at = self.start + max(1, math.ceil(a.stale_sampling_share * self.bpe))
        self.sample_steps = max(1, math.ceil(a.stale_sample_rate * self.bpe))
        self.sample_batches = sample_batches
        self.first: torch.Tensor | None = None
        self.stale: HotSet | None = None
        self.decision: dict = {}
        self.epochs: dict[int, list[int]] = {}  # epoch -> [inputs, skipped]
        self.step_s = {"before": [0.0, 0], "after": [0.0, 0]}  # seconds and steps of the step function

    def decide(self, second: torch.Tensor) -> None:
        """Drift of every watched row since the first snapshot, T by bisection, the stale rows."""
        t0 = time.perf_counter()
        drift = (second - self.first).abs().amax(dim=1).numpy().astype(np.float64) if len(self.watched) else np.zeros(0)
        self.first = None
        watched = HotSet(self.watched, self.num_rows)
        parts = []
        for batch in self.sample_batches(self.decide_at, self.decide_at + self.sample_steps):
            rows = batch.rows.numpy()
            is_w = watched.contains(rows)
            d = np.full(len(rows), np.inf)
            d[is_w] = drift[watched.position(rows[is_w])]
            parts.append(input_keys(batch, d, self.alpha))
        keys = np.concatenate(parts) if parts else np.zeros(0)
        T, share, iters = find_threshold(keys, self.target, self.tolerance)
        stale = drift < T
        self.stale = HotSet(self.watched[stale], self.num_rows)
        self.decision = {
            "threshold": T,
            "decided_at_step": self.decide_at,
            "first_snapshot_step": self.start,
            "watched_rows": int(len(self.watched)),
            "stale_rows": int(stale.sum()),
            "sample_inputs": int(len(keys)),
            "sample_skippable_share": share,
            "bisection_steps": iters,
            "target": self.target,
            "tolerance": self.tolerance,
            "alpha": self.alpha or "all",
            "decision_s": time.perf_counter() - t0,
        }
        log.info(
            f"skip-stale: from step {self.decide_at + 1}, T = {T:.3g}: {int(stale.sum()):,} of "
            f"{len(self.watched):,} hot rows stale, {share:.1%} of {len(keys):,} sampled inputs skippable "
            f"(target {self.target:.0%} +- {self.tolerance:.0%})"
        )

    def wrap(self, step_fn):
        """``step_fn`` (a :class:`~bagpipe.train.protocols.StepFn`) with the snapshots
        taken before steps ``s`` and ``s + phase``, and the stale inputs left out after."""

        def step(model, dense_opt, rows, inp: StepInput, times: dict) -> float:
            if inp.step == self.start:
                self.first = self.read_watched()
            if inp.step == self.decide_at and self.first is not None:
                self.decide(self.read_watched())
            B = inp.batch.batch_size
            skip = skip_mask(inp.batch, self.stale, self.alpha) if self.stale is not None else np.zeros(B, dtype=bool)
            count = self.epochs.setdefault(inp.step // self.bpe, [0, 0])
            count[0] += B
            count[1] += int(skip.sum())
            t0 = time.perf_counter()
            if not skip.any():
                loss = step_fn(model, dense_opt, rows, inp, times)
            elif skip.all():  # nothing trains: the loss is only reported
                inp.ready()
                with torch.no_grad():
                    logits = forward_logits(model, inp.weights.index_select(0, inp.index), inp.inverse, inp.batch)
                    loss = float(F.binary_cross_entropy_with_logits(logits, inp.batch.labels))
            else:
                loss = step_fn(model, dense_opt, rows, keep_inputs(inp, ~skip), times)
            phase = self.step_s["after" if self.stale is not None else "before"]
            if inp.step not in (self.start, self.decide_at):  # the snapshot steps pay for the snapshots
                phase[0] += time.perf_counter() - t0
                phase[1] += 1
            return loss

        return step

    def report(self) -> dict:
        """The summary's ``approximation.skip_stale``: T and the decision, the share of
        inputs skipped per epoch, and the step's own speed-up after the decision."""
        (sb, nb), (sa, na) = self.step_s["before"], self.step_s["after"]
        before, after = (1000 * sb / nb if nb else None), (1000 * sa / na if na else None)
        total, skipped = (sum(v[i] for v in self.epochs.values()) for i in (0, 1))
        return {
            **({"threshold": None, "decided_at_step": self.decide_at} if not self.decision else self.decision),
            "skipped_inputs": skipped,
            "skipped_share": skipped / max(total, 1),
            "per_epoch": [
                {"epoch": e + 1, "inputs": n, "skipped": k, "skipped_share": k / max(n, 1)}
                for e, (n, k) in sorted(self.epochs.items())
            ],
            "step_ms_before": before,
            "step_ms_after": after,
            "step_speedup": (before / after) if before and after else None,
        }


def stale_skip_for(
    approx: ApproxConfig,
    spec: ModeSpec,
    hot: HotConfig,
    backend: Backend,
    dataset: Dataset,
    stream: BatchStream,
    dim: int,
    state_dim: int,
    seed: int,
) -> StaleSkip | None:
    """The run's :class:`StaleSkip` (None without ``--skip-stale``): the watched rows are the
    hot tier's (modes with a store) or, for the full tables, those of ``--hot-budget-mb`` /
    ``--hot-rows``, else FAE's 256 MiB profiled at start-up. ``stream`` is a train stream of
    its own (it samples batches ahead of the training loop's)."""
    if not approx.skip_stale:
        return None
    if spec.store:  # the hot tier's rows (the config asks for one with a store)
        rows = backend.hot
        assert rows is not None, f"--skip-stale with --mode {spec.name} needs a hot tier"
    else:
        rows = hot_set_for(hot, spec, dataset, dim, state_dim, seed)
        if rows is None:
            rows = profile(
                dataset, FAE_BUDGET_MB, dim=dim, state_dim=state_dim, sample_rate=hot.hot_sample_rate, seed=seed
            )
            log.info(rows.line())
    read = backend.watched(rows.rows)
    return StaleSkip(approx, rows.rows, read, sum(dataset.meta.table_sizes), stream.batches_per_epoch, stream.batches)
