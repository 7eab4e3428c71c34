"""A run's device memory budget (``--device-memory-budget-mb``): what the run keeps in
the device's own memory, and a one-line refusal, before anything is trained, when that
does not fit.

What lives on the device (docs/gpu.md, "What goes where"): ``--mode full``: every table
with its optimizer state; the cached modes: the (C, D) cache with its (C, S) state and
slot rows, the hot tier, the rows of the plans staged ahead; every mode: the dense model
with its gradients and optimizer state, and one step's pooled embeddings and (U, D) rows.
A step's other activations are left to the margin (:data:`bagpipe.budget.sizing.MARGIN`):
on CUDA the caching allocator is capped at the budget (:class:`bagpipe.device.cuda.CudaDevice`),
so a run that still outgrows it fails at the allocation instead of using more.
"""

from __future__ import annotations

from bagpipe.budget.estimate import MIB, Estimate, Part
from bagpipe.budget.shape import DENSE_STATES
from bagpipe.budget.sizing import MARGIN, need_mib
from bagpipe.config.train import TrainConfig
from bagpipe.data.schema import DatasetMeta
from bagpipe.errors import ConfigError
from bagpipe.optim.names import row_state_dim
from bagpipe.oracle.sizing import default_cache_rows

#: Plans whose rows are on the device at once beside the cache: the one the step
#: installs and the one staged behind it (the executors' upload ring holds no more).
STAGED_ON_DEVICE = 2


def device_estimate(cfg: TrainConfig, meta: DatasetMeta, dense_params: int, batch_size: int | None = None) -> Estimate:
    """Bytes the run ``cfg`` keeps in device memory, part by part (role ``device``).

    ``dense_params``: parameters of the dense model; ``batch_size``: this process's share
    of the batch (default the global batch). One-hot lookups bound a batch's rows (B*F)."""
    B = batch_size or cfg.data.batch_size
    D = cfg.arch.model_config().embedding_dim
    S = row_state_dim(cfg.optim.optimizer, D)
    R, F = meta.total_rows, meta.num_features
    rb = 4 * (D + S)
    lookups = B * F
    states = DENSE_STATES.get(cfg.optim.optimizer, 2)
    step = 4 * (B * F * D * 2 + lookups * D * 4)  # pooled (+ gradient); rows, gradient, update, state
    parts = [Part("dense model and a step", 4 * dense_params * (2 + states) + step, f"{dense_params:,} parameters")]
    spec = cfg.cache.spec
    if not spec.store:
        parts.append(Part("tables", R * rb, f"{R:,} rows with their optimizer state"))
        return Estimate("device", tuple(parts))
    c = cfg.cache
    if spec.sized_cache:
        if c.cache_rows:
            rows = c.cache_rows
        elif c.cache_budget_mb:
            rows = int(c.cache_budget_mb * MIB) // rb
        else:
            rows = default_cache_rows(R, lookups)
    else:
        rows = lookups  # one batch staged
    parts.append(Part("cache", rows * (rb + 8), f"{rows:,} slots"))
    hot_mb = cfg.hot.hot_budget_mb or (0.0 if cfg.hot.hot_rows else spec.hot_budget_mb)  # fae's default
    if hot_mb:
        parts.append(Part("hot tier", int(hot_mb * MIB), f"--hot-budget-mb {hot_mb:g}"))
    parts.append(Part("staged rows", STAGED_ON_DEVICE * lookups * rb, f"{STAGED_ON_DEVICE} plans' rows"))
    return Estimate("device", tuple(parts))


def check_device_budget(cfg: TrainConfig, est: Estimate) -> None:
    """Raise :class:`ConfigError` (one line naming what to change) when ``est`` does not
    fit ``--device-memory-budget-mb`` with the margin kept free; no budget: nothing."""
    mb = cfg.device.device_memory_budget_mb
    if not mb:
        return
    usable = int(mb * MIB * (1 - MARGIN))
    if est.total <= usable:
        return
    parts = ", ".join(f"{p.name} {p.mib:,.1f}" for p in sorted(est.parts, key=lambda p: -p.bytes))
    head = (
        f"--device-memory-budget-mb {mb:g} is too small: the run keeps {est.mib:,.1f} MiB on the device "
        f"({parts}), and the budget holds {usable / MIB:,.1f} with {MARGIN:.0%} kept free"
    )
    spec = cfg.cache.spec
    if not spec.store:
        fix = "use a mode with a store (--mode lookahead) to keep the tables in host memory or on disk"
    else:
        fix = "give a smaller --cache-rows or --hot-budget-mb"
    raise ConfigError(f"{head}: {fix}, or raise it to at least {need_mib(est.total):,}")
