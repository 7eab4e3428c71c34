"""The typed, validated configuration of a training run, in seven sections.

Sources, later ones winning: the dataclass defaults, a TOML file (``--config``), the
command line. Every setting is declared once, below, with its type and a docstring;
``bagpipe train --help`` and the TOML keys are generated from these declarations
(:mod:`bagpipe.config`), so the option ``--batch-size`` is the key ``batch_size``,
at the top level of the file or in its section's table (``[data]``). Every bad value
raises ConfigError with one line at start-up.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from bagpipe.config import Section, build, flatten, need, read_toml, to_flat
from bagpipe.config.typed import finite
from bagpipe.models.config import ModelConfig, ModelName, RecipeName, recipe

Mode = Literal["full", "nocache", "lru", "lookahead", "fae", "hotline"]
Store = Literal["memory", "disk"]
CacheSync = Literal["partitioned", "replicated"]
OptimizerName = Literal["sgd", "adagrad"]


@dataclass(kw_only=True)
class DataConfig(Section):
    """data and batches"""

    data: str
    """Dataset directory (made by `bagpipe synth` or `bagpipe preprocess`)."""
    batch_size: int = 2048
    """B, samples per step (the global batch: N trainers take B/N each)."""
    block_size: int = 4096
    """Samples per shuffled block of the data stream (the shuffle's granularity)."""

    def validate(self) -> None:
        need(self.batch_size > 0, f"batch size must be > 0, got {self.batch_size}")
        need(self.block_size > 0, f"block size must be > 0, got {self.block_size}")


@dataclass(kw_only=True)
class ArchConfig(Section):
    """model"""

    model: ModelName = "dlrm"
    """The CTR model."""
    recipe: RecipeName = "debug"
    """Model size: debug (trains in seconds on a laptop) or kaggle (DLRM's Criteo Kaggle sizes)."""
    embedding_dim: int | None = None
    """D, overrides the recipe's embedding dimension."""

    def validate(self) -> None:
        need(self.embedding_dim is None or self.embedding_dim > 0, f"embedding dim must be > 0, got {self.embedding_dim}")

    def model_config(self) -> ModelConfig:
        """The recipe's architecture, with ``embedding_dim`` applied."""
        cfg = recipe(self.model, self.recipe)
        if self.embedding_dim is not None and self.embedding_dim != cfg.embedding_dim:
            changes: dict = {"embedding_dim": self.embedding_dim}
            if self.model == "dlrm":  # the bottom MLP must end in D
                changes["bottom_mlp"] = tuple(cfg.bottom_mlp[:-1]) + (self.embedding_dim,)
            cfg = dataclasses.replace(cfg, **changes)
        return cfg


@dataclass(kw_only=True)
class OptimConfig(Section):
    """optimisation"""

    optimizer: OptimizerName = "adagrad"
    """Row-wise for embedding rows, torch's for dense parameters."""
    lr: float = 0.05
    """Learning rate of both the dense and the sparse optimizer."""

    def validate(self) -> None:
        need(finite(self.lr) and self.lr > 0, f"learning rate must be > 0, got {self.lr}")


@dataclass(kw_only=True)
class CacheConfig(Section):
    """embedding placement"""

    mode: Mode = "full"
    """full: every table in memory (the reference); nocache, lru: a store and a cache
    (backward-looking baselines); lookahead: the oracle plans every fetch and eviction;
    fae, hotline: hot rows resident, cold rows read per batch (FAE), or read while the
    batch's all-hot inputs compute (Hotline)."""
    store: Store = "memory"
    """Where the non-full modes keep the tables."""
    store_dir: str | None = None
    """Directory of the disk store (default RUN/store)."""
    cache_rows: int = 0
    """C, slots of the trainer's cache (lru, lookahead); 0 picks 5% of all rows, at least
    one batch's worth."""
    lookahead: int = 8
    """L, batches the oracle looks ahead."""
    cache_budget_mb: float = 0.0
    """Memory budget of the cache in MiB (lru, lookahead): the auto-tuner picks the cache
    rows and, for lookahead, the largest L whose window fits; 0 is off. Excludes cache_rows."""

    def validate(self) -> None:
        need(self.cache_rows >= 0, f"cache rows must be >= 0, got {self.cache_rows}")
        need(self.lookahead >= 1, f"lookahead must be >= 1, got {self.lookahead}")
        need(
            finite(self.cache_budget_mb) and self.cache_budget_mb >= 0,
            f"cache budget must be a finite number of MiB >= 0, got {self.cache_budget_mb}",
        )
        need(
            not (self.cache_budget_mb > 0 and self.cache_rows > 0),
            "--cache-budget-mb and --cache-rows are mutually exclusive: give the cache's memory budget "
            "(the tuner picks rows and lookahead) or its rows, not both",
        )

    @property
    def planner(self) -> str:
        """The planner of the rows the hot tier does not hold: fae and hotline read them
        per batch, as nocache does."""
        return "nocache" if self.mode in ("fae", "hotline") else self.mode


@dataclass(kw_only=True)
class HotConfig(Section):
    """hot rows (a hot tier in front of the cache; FAE and Hotline)"""

    hot_budget_mb: float = 0.0
    """MiB for a hot tier (nocache, lru, lookahead, fae, hotline): the most accessed rows
    that fit with their optimizer state stay in the trainer for the whole run, and the
    planner handles only the other rows; chosen at start-up by profiling a sample of the
    train split. 0: none (fae and hotline then take FAE's default, 256)."""
    hot_rows: str | None = None
    """The hot rows from a file of `bagpipe profile --out FILE` (instead of profiling at start-up)."""
    hot_sample_rate: float = 0.05
    """Share of the train split profiled at start-up (FAE's default: 5%)."""
    fae_schedule: Literal["keep", "split"] = "keep"
    """fae: keep the data order (exact), or split each epoch into all-hot batches and the
    others as FAE does (changes the data order: an approximation)."""

    def validate(self) -> None:
        need(finite(self.hot_budget_mb) and self.hot_budget_mb >= 0,
             f"hot budget must be a finite number of MiB >= 0, got {self.hot_budget_mb}")
        need(0 < self.hot_sample_rate <= 1, f"hot sample rate must be in (0, 1], got {self.hot_sample_rate}")
        need(not (self.hot_budget_mb > 0 and self.hot_rows),
             "--hot-budget-mb and --hot-rows are mutually exclusive: profile at start-up for a budget, or read a file")

    @property
    def on(self) -> bool:
        """Whether a hot tier was asked for (fae and hotline always have one)."""
        return self.hot_budget_mb > 0 or bool(self.hot_rows)


@dataclass(kw_only=True)
class DistConfig(Section):
    """distributed (one machine: every role a process on loopback)"""

    trainers: int = 1
    """N, data-parallel trainer processes; each trains on 1/N of every global batch."""
    servers: int = 0
    """S, embedding server processes holding the rows (row g on server g % S); 0 keeps the
    store in the trainer. With S >= 1 the run is distributed: N trainers + S servers + 1 oracle."""
    cache_sync: CacheSync = "partitioned"
    """partitioned: rows one trainer uses and then drops are neither replicated nor
    synchronised; replicated: every trainer holds and synchronises every planned row."""
    plans_in_flight: int = 4
    """Plans the oracle may send a trainer ahead of what it has taken (back-pressure)."""

    def validate(self) -> None:
        need(self.trainers >= 1, f"trainers must be >= 1, got {self.trainers}")
        need(self.servers >= 0, f"servers must be >= 0, got {self.servers}")
        need(self.plans_in_flight >= 1, f"plans in flight must be >= 1, got {self.plans_in_flight}")

    @property
    def distributed(self) -> bool:
        return self.servers > 0 or self.trainers > 1


@dataclass(kw_only=True)
class RunConfig(Section):
    """run, evaluation, checkpoints"""

    out: str
    """Run directory: config.json, metrics.jsonl, checkpoints, summary.json."""
    steps: int = 1000
    """Training steps (batches); past the end of the train split a new epoch begins."""
    seed: int = 0
    """Seeds the model init, the embedding init and the data order."""
    eval_every: int = 0
    """Evaluate every N steps (0: only at the end)."""
    eval_samples: int = 0
    """Cap on evaluation samples (0: the whole eval split)."""
    checkpoint_every: int = 0
    """Write a checkpoint every N steps (0: only at the end)."""
    resume: bool = False
    """Continue from the run directory's latest checkpoint."""
    summary_json: str | None = None
    """Also write the summary JSON here."""
    threads: int = 0
    """torch intra-op threads (0: torch's choice; distributed roles split the cores)."""
    progress: bool = True
    """Show a progress bar."""
    warmup_steps: int = 0
    """Steps left out of samples_per_s and time_per_step_ms (benchmarks)."""
    final_checkpoint: bool = True
    """Write a checkpoint at the end (what `bagpipe eval` reads); benchmarks turn it off."""
    digest: bool = True
    """Compute params_sha256 at the end (reads every embedding row once)."""

    def validate(self) -> None:
        need(self.steps > 0, f"steps must be > 0, got {self.steps}")
        need(self.eval_every >= 0, f"eval_every must be >= 0, got {self.eval_every}")
        need(self.eval_samples >= 0, f"eval_samples must be >= 0, got {self.eval_samples}")
        need(self.checkpoint_every >= 0, f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        need(self.threads >= 0, f"threads must be >= 0, got {self.threads}")
        need(0 <= self.warmup_steps < self.steps, f"warmup steps must be in [0, steps), got {self.warmup_steps}")


@dataclass(kw_only=True)
class TrainConfig:
    """Every setting of ``bagpipe train``, by section."""

    data: DataConfig
    arch: ArchConfig
    optim: OptimConfig
    cache: CacheConfig
    hot: HotConfig
    dist: DistConfig
    run: RunConfig

    def __post_init__(self) -> None:
        mode = self.cache.mode
        need(not (self.hot.on and mode == "full"),
             "--mode full holds every row already: a hot tier (--hot-budget-mb, --hot-rows) needs a store mode")
        need(self.hot.fae_schedule == "keep" or mode == "fae", f"--fae-schedule applies to --mode fae, got --mode {mode}")
        d = self.dist
        if d.distributed:
            need(d.servers >= 1, f"{d.trainers} trainers need embedding servers to share the rows: add --servers S (S >= 1)")
            need(self.cache.mode == "lookahead", f"distributed runs (--trainers/--servers) use --mode lookahead, got --mode {self.cache.mode}")
            need(self.data.batch_size % d.trainers == 0,
                 f"the global batch ({self.data.batch_size}) must split evenly over {d.trainers} trainers")
            for name, flag in (("resume", "--resume"), ("checkpoint_every", "--checkpoint-every")):
                need(not getattr(self.run, name), f"{flag} is not supported in distributed runs yet")

    @property
    def distributed(self) -> bool:
        return self.dist.distributed

    @classmethod
    def of(cls, **settings) -> "TrainConfig":
        """A config from settings by name (``TrainConfig.of(data=..., out=..., steps=10)``)."""
        return build(cls, settings)

    def replace(self, **settings) -> "TrainConfig":
        """A copy with some settings changed (by name, whatever their section)."""
        return build(type(self), to_flat(self) | settings)

    def to_json(self) -> dict:
        """Nested by section: what RUN/config.json holds and :meth:`from_json` reads."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, values: dict, source: str = "config.json") -> "TrainConfig":
        return build(cls, flatten(cls, values, source), source)


def load_config(file: str | None, overrides: dict) -> TrainConfig:
    """Merge a TOML file (may be None) and command-line overrides (None values ignored).

    The file's keys are setting names, at the top level, in their section's table, or
    (as older files have them) inside a ``[train]`` table.
    """
    values: dict = {}
    source = "command line"
    if file:
        raw = read_toml(file)
        if set(raw) == {"train"} and isinstance(raw["train"], dict):
            raw = raw["train"]
        values = flatten(TrainConfig, raw, str(file))
        source = str(file)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return build(TrainConfig, values, source)
