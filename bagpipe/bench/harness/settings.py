"""The settings every benchmark scenario shares, declared once.

Each scenario's config is a keyword-only :class:`~bagpipe.config.Section` subclass of
the classes below (their fields, documented where they are declared, become the
scenario's ``bagpipe bench SCENARIO --OPTION`` options); it adds only its own fields,
overrides the defaults that differ, and states its ``--quick`` size once in ``QUICK``::

    BenchConfig                      out, profile, scale                 every scenario
    └── TrainBench                   model, recipe, batch_size, ...      runs are `bagpipe train` processes
        └── Throughput (+ Repeated)  warmup (+ reps)                     modes, peers, distributed, sweep
    Repeated (mixin)                 reps                                oracle + Throughput
    CachePoint (mixin)               cache_fraction, lookahead           modes, peers, distributed, convergence
    OnDevice (mixin)                 device                              modes, mlperf
    Loaded (mixin)                   background_load                     modes, scale

Validation messages name the option (``--reps must be >= 1, got 0``), so a bad value
on the command line is a one-line error that says which option to fix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from bagpipe.config import Section, need
from bagpipe.config.options import flag
from bagpipe.config.typed import field_types, strip_optional
from bagpipe.data.profiles import PROFILES
from bagpipe.models import MODEL_NAMES, RECIPE_SIZES

if TYPE_CHECKING:  # the names are known at run time only: a type checker sees strings
    Profile = str
    Model = str
    Recipe = str
else:
    Profile = Literal[tuple(PROFILES)]
    Model = Literal[MODEL_NAMES]
    Recipe = Literal[RECIPE_SIZES]


def show(value: Any) -> str:
    """A setting's value as it is typed on the command line."""
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(kw_only=True)
class Checked(Section):
    """A settings section whose checks name the option: ``--NAME RULE, got VALUE``."""

    def check(self, name: str, ok: bool, rule: str) -> None:
        """Raise the one-line ConfigError ``--NAME RULE, got VALUE`` unless ``ok``."""
        need(ok, f"{flag(name)} {rule}, got {show(getattr(self, name))}")

    def check_subset(self, name: str, allowed: tuple[str, ...]) -> None:
        """A comma-separated list setting must name at least one of ``allowed`` and nothing else."""
        values = getattr(self, name)
        ok = bool(values) and all(v in allowed for v in values)
        self.check(name, ok, f"must be a comma-separated subset of {','.join(allowed)}")


@dataclass(kw_only=True)
class BenchConfig(Checked):
    """Settings of every scenario."""

    name: ClassVar[str] = ""
    """The scenario's name (``bagpipe bench NAME``); subclasses set it."""
    QUICK: ClassVar[dict[str, Any]] = {}
    """The scenario's ``--quick`` size: settings that replace the defaults (seconds to about
    two minutes on 2 cores)."""

    out: str | None = None
    """Output folder: results.json, results.md, the PNG plots and the generated data (default bench-out/SCENARIO)."""
    profile: Profile = "criteo-kaggle"
    """Table shapes and skew of the generated data (bagpipe synth --profile)."""
    scale: float = 1.0
    """Table cardinality factor of the generated data (criteo-kaggle at 1.0: 33.8M rows)."""

    def __post_init__(self) -> None:
        if self.out is None:
            self.out = f"bench-out/{self.name}"
        super().__post_init__()

    @property
    def out_dir(self) -> Path:
        """The output folder (``out``, set by then)."""
        return Path(self.out or f"bench-out/{self.name}")

    @classmethod
    def quick(cls, **values):
        """The scenario at its ``--quick`` size; ``values`` override it."""
        return cls(**{**cls.QUICK, **values})

    def validate(self) -> None:
        super().validate()
        self.check("scale", self.scale > 0, "must be > 0")

    @classmethod
    def option_strings(cls) -> dict[str, bool]:
        """Every ``bagpipe bench NAME`` option of the settings -> whether it takes a value
        (a switch is ``--name`` and ``--no-name``)."""
        out = {}
        for f in dataclasses.fields(cls):
            switch = strip_optional(field_types(cls)[f.name]) is bool
            out[flag(f.name)] = not switch
            if switch:
                out["--no-" + flag(f.name)[2:]] = False
        return out

    @classmethod
    def own_fields(cls) -> tuple[str, ...]:
        """The fields this scenario adds to the ones it shares with others."""
        inherited = {
            f.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)
        }
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in inherited)


@dataclass(kw_only=True)
class Repeated(Checked):
    """Scenarios that measure each configuration several times (a mixin of BenchConfig subclasses)."""

    reps: int = 2
    """Repetitions of every measurement; their median and spread are reported (training
    scenarios interleave the configurations, so machine noise hits them alike)."""

    def validate(self) -> None:
        super().validate()
        self.check("reps", self.reps >= 1, "must be >= 1")


def cache_slots(rows: int, total_rows: int, *, at_least: int = 0) -> int:
    """``rows`` cache slots, raised to ``at_least`` (one batch's lookups) and capped at
    ``total_rows``: a bench run never asks ``bagpipe train`` for more slots than the
    tables have rows (it refuses ``--cache-rows`` above them), so a small data set
    (``--profile tiny``) caches every row instead."""
    return min(max(rows, at_least), total_rows)


@dataclass(kw_only=True)
class CachePoint(Checked):
    """Scenarios that run the cache at one size and one window (a mixin of BenchConfig subclasses)."""

    cache_fraction: float = 0.05
    """Cache slots (lru, lookahead) as a fraction of all rows; raised to what one batch needs."""
    lookahead: int = 20
    """L, batches the lookahead oracle reads ahead."""

    def cache_rows(self, total_rows: int, at_least: int) -> int:
        """The cache's slots: ``cache_fraction`` of ``total_rows``, at least ``at_least``
        (one batch's lookups), at most ``total_rows`` (tables smaller than a batch: every row)."""
        return cache_slots(int(self.cache_fraction * total_rows), total_rows, at_least=at_least)

    def validate(self) -> None:
        super().validate()
        self.check("cache_fraction", 0 < self.cache_fraction <= 1, "must be in (0, 1]")
        self.check("lookahead", self.lookahead >= 1, "must be >= 1")


@dataclass(kw_only=True)
class Loaded(Checked):
    """Scenarios that can measure a busy machine (a mixin of TrainBench subclasses)."""

    background_load: int = 0
    """CPU-bound processes the benchmark starts beside its runs and stops after them
    (bagpipe.testbed.load): 1 on a 2-core machine takes half of it from the runs."""

    def validate(self) -> None:
        super().validate()
        self.check("background_load", self.background_load >= 0, "must be >= 0")


@dataclass(kw_only=True)
class OnDevice(Checked):
    """Scenarios whose training processes may compute on a GPU (a mixin of TrainBench subclasses)."""

    device: Literal["cpu", "cuda"] = "cpu"
    """Where the training processes compute (bagpipe train --device): cuda puts the model
    and the cache on the GPU (--mode full: every table), the store stays in host memory or on disk."""

    def validate(self) -> None:
        super().validate()
        if self.device == "cuda":
            from bagpipe.device.cuda import cuda_unavailable_reason

            reason = cuda_unavailable_reason()
            need(reason is None, f"--device cuda: {reason}; use --device cpu")


@dataclass(kw_only=True)
class CriteoSample(Checked):
    """Scenarios that also run on the real Criteo Kaggle sample in ../shared/data (a mixin
    of BenchConfig subclasses; 9,000 train lines: 70 batches of 128 per epoch)."""

    criteo: bool = True
    """Also run on the real Criteo Kaggle sample when ../shared/data has it."""
    criteo_steps: int = 280
    """Steps on the Criteo sample."""
    criteo_batch_size: int = 128
    """Batch size on the Criteo sample."""
    criteo_eval_every: int = 20
    """Evaluate every N steps on the Criteo sample."""
    shared_data: str | None = None
    """Folder of the real data samples (default: ../shared/data next to the repository)."""

    def validate(self) -> None:
        super().validate()
        for name in ("criteo_steps", "criteo_batch_size", "criteo_eval_every"):
            self.check(name, getattr(self, name) >= 1, "must be >= 1")


@dataclass(kw_only=True)
class TrainBench(BenchConfig):
    """Settings of the scenarios whose runs are ``bagpipe train`` processes (see
    :func:`bagpipe.bench.harness.runner.train_args`)."""

    model: Model = "dlrm"
    """Model (bagpipe train --model)."""
    recipe: Recipe = "kaggle"
    """Model sizes: kaggle (DLRM's Criteo Kaggle sizes), debug (small MLPs) or dcn-mlperf (--model dcn: MLPerf's DLRM-DCNv2)."""
    batch_size: int = 2048
    """Samples per step."""
    optimizer: Literal["sgd", "adagrad", "adam"] = "adagrad"
    """Row-wise sparse and dense optimizer (adam: its 2D state values per row are zeros
    at the start, which makes a table file cheap to write)."""
    lr: float = 0.05
    """Learning rate."""
    steps: int = 60
    """Training steps per run (warm-up included)."""
    eval_samples: int = 20000
    """Eval samples each run evaluates on at its end (0: the whole eval split)."""
    threads: int = 0
    """torch threads per training process (0: torch's choice)."""
    run_timeout_s: float = 0.0
    """Bound on one training process, in seconds (0: none)."""

    def validate(self) -> None:
        super().validate()
        self.check("batch_size", self.batch_size >= 1, "must be >= 1")
        self.check("steps", self.steps >= 1, "must be >= 1")
        self.check("lr", self.lr > 0, "must be > 0")
        self.check("eval_samples", self.eval_samples >= 0, "must be >= 0")
        self.check("threads", self.threads >= 0, "must be >= 0")
        self.check("run_timeout_s", self.run_timeout_s >= 0, "must be >= 0")


@dataclass(kw_only=True)
class Throughput(Repeated, TrainBench):
    """Training scenarios that measure throughput: repetitions, warm-up steps left out."""

    warmup: int = 10
    """Warm-up steps left out of the throughput (bagpipe train --warmup-steps)."""

    def validate(self) -> None:
        super().validate()
        self.check("warmup", 0 <= self.warmup < self.steps, f"must be >= 0 and below --steps ({self.steps})")
