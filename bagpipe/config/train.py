"""The typed, validated configuration of a training run: its sections, and the checks
between them.

Sources, later ones winning: the dataclass defaults, a TOML file (``--config``), the
command line. Every setting is declared once, in its section (:mod:`bagpipe.config.sections`),
with its type and a docstring; ``bagpipe train --help`` and the TOML keys are generated
from these declarations (:mod:`bagpipe.config.options`), so the option ``--batch-size``
is the key ``batch_size``, at the top level of the file or in its section's table
(``[data]``). Every bad value raises ConfigError with one line at start-up.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from bagpipe.config.modes import modes_with
from bagpipe.config.options import build, flatten, read_toml, to_flat
from bagpipe.config.sections import (
    ApproxConfig,
    ArchConfig,
    CacheConfig,
    DataConfig,
    DistConfig,
    HotConfig,
    MemoryConfig,
    OptimConfig,
    RunConfig,
)
from bagpipe.config.typed import need


@dataclass(kw_only=True)
class TrainConfig:
    """Every setting of ``bagpipe train``, by section."""

    data: DataConfig
    arch: ArchConfig
    optim: OptimConfig
    cache: CacheConfig
    hot: HotConfig
    memory: MemoryConfig
    dist: DistConfig
    approx: ApproxConfig
    run: RunConfig

    def __post_init__(self) -> None:
        mode, spec = self.cache.mode, self.cache.spec
        skip = self.approx.skip_stale
        need(
            not (self.hot.on and not spec.store) or skip,
            f"--mode {mode} holds every row already: a hot tier (--hot-budget-mb, --hot-rows) needs a store mode",
        )
        if skip:
            need(
                not self.dist.distributed,
                "--skip-stale runs on one process: distributed trainers would all have to skip the same inputs, "
                "which is not built; drop --trainers/--servers or --skip-stale",
            )
            need(spec.skip_stale, f"--skip-stale works with --mode {modes_with('skip_stale')}, got --mode {mode}")
            need(
                not spec.store or self.hot.on,
                f"--skip-stale with --mode {mode} watches the hot tier's rows: add --hot-budget-mb M or --hot-rows FILE",
            )
            need(
                not self.run.resume,
                "--skip-stale runs cannot be resumed (the rows' snapshots are not checkpointed): "
                "start the run again without --resume",
            )
        need(
            self.hot.fae_schedule == "keep" or spec.fae_schedule,
            f"--fae-schedule applies to --mode {modes_with('fae_schedule')}, got --mode {mode}",
        )
        d = self.dist
        if d.distributed:
            need(
                d.servers >= 1,
                f"{d.trainers} trainers need embedding servers to share the rows: add --servers S (S >= 1)",
            )
            need(
                spec.distributed,
                f"distributed runs (--trainers/--servers) use --mode {modes_with('distributed')}, got --mode {mode}",
            )
            need(
                self.data.batch_size % d.trainers == 0,
                f"the global batch ({self.data.batch_size}) must split evenly over {d.trainers} trainers",
            )
        need(
            not d.sync_period or d.trainers >= 2,
            f"--cache-sync {d.cache_sync} averages the copies of several trainers: it needs --trainers N >= 2 (and --servers S)",
        )

    @property
    def approximations(self) -> list[str]:
        """The approximations this run makes (empty: exact, the result of synchronous training)."""
        out = []
        if self.approx.skip_stale:
            out.append("skip-stale")
        if self.dist.sync_period:
            out.append(f"cache-sync {self.dist.cache_sync}")
        if self.hot.fae_schedule == "split":
            out.append("fae-schedule split")
        return out

    @property
    def distributed(self) -> bool:
        return self.dist.distributed

    @classmethod
    def of(cls, **settings) -> TrainConfig:
        """A config from settings by name (``TrainConfig.of(data=..., out=..., steps=10)``)."""
        return build(cls, settings)

    def replace(self, **settings) -> TrainConfig:
        """A copy with some settings changed (by name, whatever their section)."""
        return build(type(self), to_flat(self) | settings)

    def to_json(self) -> dict:
        """Nested by section: what RUN/config.json holds and :meth:`from_json` reads."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, values: dict, source: str = "config.json") -> TrainConfig:
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
