"""The typed, validated configuration of a training run.

Sources, later ones winning: the dataclass defaults, a TOML file (``--config``), the
command line. Every field is documented; every bad value raises ConfigError with a
one-line message at start-up.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from bagpipe.errors import ConfigError

MODES = ("full", "nocache", "lru", "lookahead")
STORES = ("memory", "disk")
CACHE_SYNCS = ("partitioned", "replicated")


@dataclass(kw_only=True)
class TrainConfig:
    data: str
    """Dataset directory (made by ``bagpipe synth`` or ``bagpipe preprocess``)."""
    out: str
    """Run directory: config, metrics.jsonl, checkpoints, summary."""
    model: str = "dlrm"
    """Model: dlrm, deepfm, wide_deep or dcn."""
    recipe: str = "debug"
    """Model size recipe: debug (seconds on a laptop) or kaggle (DLRM's Criteo Kaggle sizes)."""
    embedding_dim: int | None = None
    """D; None keeps the recipe's value."""
    steps: int = 1000
    """Training steps (batches)."""
    batch_size: int = 2048
    """B, samples per step."""
    optimizer: str = "adagrad"
    """sgd or adagrad (row-wise for embeddings, torch's for dense parameters)."""
    lr: float = 0.05
    """Learning rate of both the dense and the sparse optimizer."""
    seed: int = 0
    """Seeds the model init, embedding init and data order."""
    mode: str = "full"
    """full (tables in memory, the reference), nocache, lru, or lookahead (the oracle)."""
    store: str = "memory"
    """Where the non-full modes keep the tables: memory or disk."""
    store_dir: str | None = None
    """Directory of the disk store; default RUN/store."""
    cache_rows: int = 0
    """C, rows of the trainer's cache (lru, lookahead); 0 picks 5% of all rows, at least one batch's worth."""
    lookahead: int = 8
    """L, batches the oracle looks ahead."""
    cache_budget_mb: float = 0.0
    """Memory budget of the cache in MiB (lru, lookahead); > 0 lets the auto-tuner pick the
    cache rows and L (bagpipe.oracle.autotune). 0: off. Excludes an explicit cache_rows."""
    eval_every: int = 0
    """Evaluate every N steps (0: only at the end)."""
    eval_samples: int = 0
    """Cap on evaluation samples (0: the whole eval split)."""
    checkpoint_every: int = 0
    """Write a checkpoint every N steps (0: only at the end)."""
    resume: bool = False
    """Continue from the run directory's latest checkpoint."""
    summary_json: str | None = None
    """Also write the summary here."""
    threads: int = 0
    """torch intra-op threads (0: torch's default)."""
    progress: bool = True
    """Show a progress bar."""
    block_size: int = 4096
    """Samples per shuffled block of the data stream."""
    warmup_steps: int = 0
    """Steps excluded from the throughput figure (samples_per_s), for benchmarks."""
    save_final: bool = True
    """Write a checkpoint at the end (bagpipe eval reads it); benchmarks turn it off."""
    digest: bool = True
    """Compute params_sha256 at the end (reads every row once)."""
    trainers: int = 1
    """N, data-parallel trainer processes; each trains on 1/N of every global batch."""
    servers: int = 0
    """S, embedding server processes holding the rows (row g on server g % S); 0: in-process store.
    With S >= 1 the run is distributed: N trainers + S servers + 1 oracle process."""
    cache_sync: str = "partitioned"
    """Distributed cache: partitioned (rows used by one trainer and then expired are neither
    replicated nor synchronised) or replicated (every trainer holds and syncs every planned row)."""
    plans_in_flight: int = 4
    """Distributed: plans the oracle may send a trainer ahead of what it has taken (back-pressure)."""

    @property
    def distributed(self) -> bool:
        return self.servers > 0 or self.trainers > 1

    def __post_init__(self) -> None:
        self._check_types()
        from bagpipe.models import MODEL_NAMES, RECIPE_SIZES
        from bagpipe.optim import OPTIMIZER_NAMES

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        need(self.model in MODEL_NAMES, f"unknown model {self.model!r} (choose from {', '.join(MODEL_NAMES)})")
        need(self.recipe in RECIPE_SIZES, f"unknown recipe {self.recipe!r} (choose from {', '.join(RECIPE_SIZES)})")
        need(self.optimizer in OPTIMIZER_NAMES, f"unknown optimizer {self.optimizer!r} (choose from {', '.join(OPTIMIZER_NAMES)})")
        need(self.mode in MODES, f"unknown mode {self.mode!r} (choose from {', '.join(MODES)})")
        need(self.store in STORES, f"unknown store {self.store!r} (choose from {', '.join(STORES)})")
        need(self.steps > 0, f"steps must be > 0, got {self.steps}")
        need(self.batch_size > 0, f"batch size must be > 0, got {self.batch_size}")
        need(self.lr > 0, f"learning rate must be > 0, got {self.lr}")
        need(self.embedding_dim is None or self.embedding_dim > 0, f"embedding dim must be > 0, got {self.embedding_dim}")
        need(self.cache_rows >= 0, f"cache rows must be >= 0, got {self.cache_rows}")
        need(self.lookahead >= 1, f"lookahead must be >= 1, got {self.lookahead}")
        need(
            math.isfinite(self.cache_budget_mb) and self.cache_budget_mb >= 0,
            f"cache budget must be a finite number of MiB >= 0, got {self.cache_budget_mb}",
        )
        need(
            not (self.cache_budget_mb > 0 and self.cache_rows > 0),
            "--cache-budget-mb and --cache-rows are mutually exclusive: give the cache's memory budget "
            "(the tuner picks rows and lookahead) or its rows, not both",
        )
        need(self.eval_every >= 0, f"eval_every must be >= 0, got {self.eval_every}")
        need(self.eval_samples >= 0, f"eval_samples must be >= 0, got {self.eval_samples}")
        need(self.checkpoint_every >= 0, f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        need(self.threads >= 0, f"threads must be >= 0, got {self.threads}")
        need(self.block_size > 0, f"block size must be > 0, got {self.block_size}")
        need(0 <= self.warmup_steps < self.steps, f"warmup steps must be in [0, steps), got {self.warmup_steps}")
        need(self.trainers >= 1, f"trainers must be >= 1, got {self.trainers}")
        need(self.servers >= 0, f"servers must be >= 0, got {self.servers}")
        need(self.cache_sync in CACHE_SYNCS, f"unknown cache sync {self.cache_sync!r} (choose from {', '.join(CACHE_SYNCS)})")
        need(self.plans_in_flight >= 1, f"plans in flight must be >= 1, got {self.plans_in_flight}")
        if self.distributed:
            need(self.servers >= 1, f"{self.trainers} trainers need embedding servers to share the rows: add --servers S (S >= 1)")
            need(self.mode == "lookahead", f"distributed runs (--trainers/--servers) use --mode lookahead, got --mode {self.mode}")
            need(self.batch_size % self.trainers == 0,
                 f"the global batch ({self.batch_size}) must split evenly over {self.trainers} trainers")
            for name, flag in (("resume", "--resume"), ("checkpoint_every", "--checkpoint-every"),
                               ("eval_every", "--eval-every"), ("cache_budget_mb", "--cache-budget-mb")):
                need(not getattr(self, name), f"{flag} is not supported in distributed runs yet")

    def _check_types(self) -> None:
        """Values from a TOML file arrive untyped: check each against its annotation."""
        kinds = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            ann = str(f.type).replace(" ", "")
            optional = ann.endswith("|None")
            base = ann.removesuffix("|None")
            if value is None and optional:
                continue
            ok = isinstance(value, kinds[base]) and not (base in ("int", "float") and isinstance(value, bool))
            if not ok:
                raise ConfigError(f"{f.name} must be {'an' if base == 'int' else 'a'} {base}, got {value!r}")
            if base == "float":
                setattr(self, f.name, float(value))

    def model_config(self):
        from bagpipe.models import recipe

        cfg = recipe(self.model, self.recipe)
        if self.embedding_dim is not None and self.embedding_dim != cfg.embedding_dim:
            changes = {"embedding_dim": self.embedding_dim}
            if self.model == "dlrm":  # the bottom MLP must end in D
                changes["bottom_mlp"] = tuple(cfg.bottom_mlp[:-1]) + (self.embedding_dim,)
            cfg = dataclasses.replace(cfg, **changes)
        return cfg

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


def load_config(file: str | None, overrides: dict) -> TrainConfig:
    """Merge a TOML file (may be None) and command-line overrides (None values ignored)."""
    values: dict = {}
    if file:
        path = Path(file)
        if not path.exists():
            raise ConfigError(f"{file}: config file not found")
        try:
            values = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{file}: {e}") from None
        values = values.get("train", values)
        unknown = sorted(set(values) - set(TrainConfig.field_names()))
        if unknown:
            raise ConfigError(f"{file}: unknown setting(s) {', '.join(unknown)}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    for key in ("data", "out"):
        if not values.get(key):
            raise ConfigError(f"--{key} is required (on the command line or in the config file)")
    try:
        return TrainConfig(**values)
    except TypeError as e:
        raise ConfigError(str(e)) from None
