"""The table of modes: what ``--mode NAME`` is made of, one frozen row per mode.

Every other module asks a mode's :class:`ModeSpec` what it needs (``cfg.cache.spec``)
instead of comparing the mode's name: which planner decides where rows sit, which
executor moves them, which step function trains, whether rows live in a store, what hot
tier it has by default, and which options and topologies apply to it. Adding a mode is
adding a row below (its planner, step and executor must exist in their registries:
:data:`bagpipe.oracle.planners.PLANNERS`, :data:`bagpipe.train.steps.STEPS`,
:data:`bagpipe.cache.EXECUTORS`); ``tests/unit/test_codebase.py`` checks that no
module outside this one compares a mode's name.

This module imports nothing of bagpipe, so the config (and ``--help``) stays light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

PlannerName = Literal["nocache", "lru", "lookahead"]
StepName = Literal["plain", "hotline"]
ExecutorName = Literal["sync", "deferred", "pipelined"]

#: FAE's default hot-embedding budget (MiB): the hot tier of fae and hotline unless told.
FAE_BUDGET_MB = 256.0


@dataclass(frozen=True)
class ModeSpec:
    """One mode: its parts and the options that apply to it."""

    name: str
    summary: str
    """One line for ``--help`` and the docs."""
    planner: PlannerName | None
    """The planner of the rows a hot tier does not hold; None: every table in trainer
    memory (the reference), no store, no cache, no plans."""
    executor: ExecutorName = "sync"
    """How plans are executed (:mod:`bagpipe.cache.executor`): ``sync`` in the trainer's
    thread; ``deferred``: a step's misses are read on a reader thread while the step
    starts; ``pipelined``: planner, fetch and write-back threads run ahead (needs a planner
    whose ``fetch_after`` lets fetches run ahead, i.e. one that looks ahead)."""
    step: StepName = "plain"
    """The step function (:data:`bagpipe.train.steps.STEPS`)."""
    hot_budget_mb: float = 0.0
    """MiB of the hot tier it has when neither --hot-budget-mb nor --hot-rows is given."""
    sized_cache: bool = False
    """Whether C is a setting (--cache-rows, --cache-budget-mb); otherwise the cache stages
    exactly one batch's rows."""
    looks_ahead: bool = False
    """Whether L (--lookahead) is a setting: the planner reads L batches ahead."""
    distributed: bool = False
    """Whether a job of embedding servers and data-parallel trainers runs it."""
    skip_stale: bool = False
    """Whether Slipstream's --skip-stale works with it."""
    fae_schedule: bool = False
    """Whether --fae-schedule split (FAE's regrouped data order) applies."""
    cuda: bool = True
    """Whether it runs on --device cuda (the model and the cache on a GPU)."""
    bitwise: bool = True
    """Whether its parameters equal ``--mode full``'s bit for bit (its params_sha256 is
    full's); False: within float rounding (another summation order, docs/accel.md)."""

    @property
    def store(self) -> bool:
        """Whether the rows live in a store (memory or disk, or embedding servers)."""
        return self.planner is not None

    @property
    def pipelined(self) -> bool:
        return self.executor == "pipelined"

    @property
    def has_hot_tier(self) -> bool:
        """Whether it always has a hot tier (FAE, Hotline)."""
        return self.hot_budget_mb > 0


MODE_TABLE: tuple[ModeSpec, ...] = (
    ModeSpec(
        "full", "every table in trainer memory: the reference, plain pooled lookups", planner=None, skip_stale=True
    ),
    ModeSpec(
        "nocache",
        "a store; fetch the batch's rows, train, write them all back (synchronous)",
        planner="nocache",
        distributed=True,
    ),
    ModeSpec(
        "lru",
        "a store + a C-row LRU cache, misses fetched synchronously (what FBGEMM/TorchRec caches do)",
        planner="lru",
        sized_cache=True,
        distributed=True,
    ),
    ModeSpec(
        "lookahead",
        "a store + a C-row cache; the oracle plans ahead, prefetch and write-back overlap compute",
        planner="lookahead",
        executor="pipelined",
        sized_cache=True,
        looks_ahead=True,
        distributed=True,
        skip_stale=True,
    ),
    ModeSpec(
        "fae",
        "FAE: hot rows stay in the trainer, each batch's cold rows are read and written back (synchronous)",
        planner="nocache",
        hot_budget_mb=FAE_BUDGET_MB,
        fae_schedule=True,
    ),
    ModeSpec(
        "hotline",
        "Hotline: each batch's all-hot inputs train while its cold rows are read, then the rest; one optimizer step",
        planner="nocache",
        executor="deferred",
        step="hotline",
        hot_budget_mb=FAE_BUDGET_MB,
        cuda=False,  # its micro-batch split indexes the step's tensors on the host
        bitwise=False,  # two micro-batches' gradients summed: another summation order
    ),
)

#: mode name -> its row.
MODES: dict[str, ModeSpec] = {m.name: m for m in MODE_TABLE}

if TYPE_CHECKING:
    Mode = str
else:  # the config's field type: one of the table's names (checked, listed in --help)
    Mode = Literal[tuple(MODES)]


def mode_spec(name: str) -> ModeSpec:
    """The row of mode ``name`` (a KeyError names an unknown one; configs check names first)."""
    return MODES[name]


def modes_with(flag: str) -> str:
    """The names of the modes whose ``flag`` is set, as a message lists them ("full or lookahead")."""
    return " or ".join(m.name for m in MODE_TABLE if getattr(m, flag))
