"""Whether a run's cache mode pays for itself, in one line: before a run (``bagpipe plan``)
from its settings, after it (``summary.json``'s ``advice``) from what it measured.

The lookahead pipeline hides the store's latency behind the step; it cannot make a store
that answers at memory speed any faster, and its threads (the oracle, the fetches, the
write-backs) cost CPU beside the step. Where the store is as fast as the cache (the
memory store, no memory limit) ``lookahead``, ``lru`` and ``full`` train at about the same
speed (docs/pipeline.md); where the store is slow (a disk store, a memory limit, embedding
servers) the synchronous modes wait for it and ``lookahead`` does not. Exactness never
depends on the choice: every exact mode trains --mode full's model (hotline's differs
within float rounding, docs/accel.md).
"""

from __future__ import annotations

from bagpipe.config.modes import ModeSpec

#: A synchronous mode waiting this share of its step for rows would gain from lookahead.
WAIT_SHARE = 0.10


def slow_store(store: str, remote: bool) -> bool:
    """Whether rows come from a store slower than the cache: the disk store, or embedding
    servers (``remote``) whatever store they keep."""
    return remote or store == "disk"


def plan_advice(spec: ModeSpec, store: str, remote: bool) -> str | None:
    """The line ``bagpipe plan`` prints about the speed of mode ``spec`` on ``store`` (``remote``:
    behind embedding servers); None: nothing to say."""
    if not spec.store:  # --mode full: the tables are in the trainer
        return None
    slow = slow_store(store, remote)
    if spec.pipelined and not slow:
        return (
            f"speed: the rows live in process memory, as fast as the cache: --mode {spec.name} has no slow "
            "store to hide, so lru would train about as fast (lookahead pays off on a disk store, under "
            "a memory limit and with embedding servers; docs/pipeline.md)"
        )
    if not spec.pipelined and slow:
        where = "embedding servers" if remote else "the disk store"
        return (
            f"speed: --mode {spec.name} reads its misses from {where} on the step's own thread; --mode lookahead "
            "reads them ahead of the step and trains --mode full's model, bit for bit"
        )
    return None


def layout_advice(store: str, remote: bool, layout: str) -> str | None:
    """The line ``bagpipe plan`` prints about a one-process run's disk store in the identity
    row layout (:mod:`bagpipe.store.layout`); None: nothing to say."""
    if store != "disk" or remote or layout != "identity":
        return None
    return (
        "the identity layout keeps row g at slot g, so nearly every row read or written back is a page of its "
        "own; --store-layout frequency packs the rows the train split uses most at the front of the table file, "
        "where their pages stay in the page cache (the same model; docs/pipeline.md#row-layout)"
    )


def run_advice(
    spec: ModeSpec,
    slow: bool,
    step_ms: float,
    times_ms: dict,
    pipeline_s: dict,
    steps: int,
    remote: bool = False,
) -> str | None:
    """The summary's ``advice`` for a run of mode ``spec`` (one with a store) whose measured step took ``step_ms`` (wall),
    with its trainer-thread phases ``times_ms`` (ms per step) and its executor's cumulative
    ``pipeline_s`` over ``steps`` plans; ``slow``: :func:`slow_store` of its store,
    ``remote``: behind embedding servers (None: nothing to say)."""
    if step_ms <= 0 or not steps:
        return None
    if spec.pipelined:
        store_ms = 1000 * (pipeline_s.get("fetch_busy", 0.0) + pipeline_s.get("writeback_busy", 0.0)) / steps
        if slow and not remote and store_ms < WAIT_SHARE * step_ms:
            # a disk store whose pages stayed in the page cache (the frequency layout's hot rows): nothing slow
            return (
                f"the disk store's reads and writes took {store_ms:.1f} ms a step ({store_ms / step_ms:.0%} of "
                f"{step_ms:.0f} ms): its pages stayed in the page cache, little to hide, so --mode lru would train "
                "about as fast here; lookahead pays off where the store is slower (a memory limit, a larger table)"
            )
        if slow:
            return None
        return (
            f"the store is process memory: its reads and writes took {store_ms:.1f} ms a step "
            f"({store_ms / step_ms:.0%} of {step_ms:.0f} ms), nothing slow to hide, so --mode lru would train "
            "about as fast, without the lookahead pipeline's threads"
        )
    wait = times_ms.get("wait_embeddings", 0.0) + times_ms.get("writeback", 0.0)
    if wait > WAIT_SHARE * step_ms:
        return (
            f"the step waited {wait:.1f} ms ({wait / step_ms:.0%} of {step_ms:.0f} ms) for the store; "
            "--mode lookahead reads the rows ahead and writes them back behind the step (--mode full's model, bit for bit)"
        )
    return None
