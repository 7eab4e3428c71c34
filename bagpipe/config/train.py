"""The typed, validated configuration of a training run: its sections, and the checks
between them.

Sources, later ones winning: the dataclass defaults, a TOML file (``--config``), the
command line. Every setting is declared once, in its section (:mod:`bagpipe.config.sections`),
with its type and a docstring; ``bagpipe train --help`` and the TOML keys are generated
from these declarations (:mod:`bagpipe.config.options`), so the option ``--batch-size``
is the key ``batch_size``, at the top level of the file or in its section's table
(``[data]``). Every bad value raises ConfigError with one line at start-up, and so does a
setting the chosen mode, store, topology or schedule does not read (:func:`inapplicable`,
which reads the table of modes).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from bagpipe.config.modes import mode_spec, modes_with
from bagpipe.config.options import build, flatten, read_toml, sections, to_flat
from bagpipe.config.sections import (
    ApproxConfig,
    ArchConfig,
    CacheConfig,
    DataConfig,
    DeviceConfig,
    DistConfig,
    HotConfig,
    MemoryConfig,
    OptimConfig,
    RunConfig,
)
from bagpipe.config.typed import need
from bagpipe.errors import BagpipeError, ConfigError
from bagpipe.models.config import RECIPE_OPTIMIZER


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
    device: DeviceConfig
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
            self.device.device != "cuda" or spec.cuda,
            f"--device cuda runs --mode {modes_with('cuda')}, got --mode {mode} (it runs on --device cpu)",
        )
        need(
            self.device.device != "cuda" or not skip,
            "--skip-stale runs on --device cpu: its snapshots of the hot rows are not built for a GPU",
        )
        need(
            d.cache_sync != "owner" or d.trainers <= 64,
            f"--cache-sync owner supports up to 64 trainers (a row's users are a 64-bit mask), got --trainers {d.trainers}",
        )
        need(
            d.cache_sync != "owner" or not self.hot.on,
            "--cache-sync owner does not plan a hot tier's rows yet (every trainer holds them from the start): "
            "use --cache-sync partitioned with --hot-budget-mb / --hot-rows",
        )
        need(
            not d.sync_period or d.trainers >= 2,
            f"--cache-sync {d.cache_sync} averages the copies of several trainers: it needs --trainers N >= 2 (and --servers S)",
        )
        if self.approx.emulate_compute is not None:
            need(
                d.distributed,
                "--emulate-compute benchmarks a distributed job's data path (bagpipe bench cluster): "
                "one process has none; add --trainers N --servers S",
            )
            need(
                not self.run.digest,
                "--emulate-compute does not train, so there is no parameter digest to claim: add --no-digest",
            )
        _refuse_floor_above_rate(self)
        _refuse_inapplicable(self)

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
        if self.approx.emulate_compute is not None:  # not an approximation of training: none at all
            out.append(f"emulate-compute {self.approx.emulate_compute} (did not train)")
        return out

    @property
    def not_exact(self) -> list[str]:
        """Why this run's parameters are not those of plain synchronous training from the
        seed (``--mode full``'s params_sha256), one line each: its approximations by name, then
        :data:`ROUNDING_NOT_EXACT`, :data:`INIT_FROM_STORE_NOT_EXACT`, :data:`DATA_PARALLEL_NOT_EXACT`;
        empty: the run is exact."""
        out = list(self.approximations)
        if not self.cache.spec.bitwise:
            out.append(ROUNDING_NOT_EXACT.format(mode=self.cache.spec.name))
        if self.cache.init_from_store:
            out.append(INIT_FROM_STORE_NOT_EXACT)
        if self.dist.distributed and self.dist.trainers > 1:
            out.append(DATA_PARALLEL_NOT_EXACT.format(trainers=self.dist.trainers))
        return out

    @property
    def distributed(self) -> bool:
        return self.dist.distributed

    @classmethod
    def of(cls, **settings) -> TrainConfig:
        """A config from settings by name (``TrainConfig.of(data=..., out=..., steps=10)``)."""
        return with_run_length(build(cls, with_recipe_settings(settings)), settings)

    def replace(self, **settings) -> TrainConfig:
        """A copy with some settings changed (by name, whatever their section)."""
        return build(type(self), to_flat(self) | settings)

    def to_json(self) -> dict:
        """Nested by section: what RUN/config.json holds and :meth:`from_json` reads."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, values: dict, source: str = "config.json") -> TrainConfig:
        flat = flatten(cls, values, source)
        # a run's config.json from before --store-layout auto says "identity" (the default then)
        # whatever its store: where the setting does not apply, it was the default, not a choice
        if flat.get("store_layout") == "identity" and "store_layout" in dict(inapplicable(flat)):
            flat["store_layout"] = "auto"
        return build(cls, flat, source)


#: The summary's ``not_exact`` lines of the runs that are not approximations yet do not end
#: with ``--mode full``'s parameters (:attr:`TrainConfig.not_exact`).
ROUNDING_NOT_EXACT = "{mode}: equal to plain training within float rounding, not bitwise"  # hotline
INIT_FROM_STORE_NOT_EXACT = "init-from-store: started from the store's tables, not the seed's"
#: Data-parallel trainers all-reduce their gradients, which sums them in another order than one
#: process does (docs/distributed.md: within float tolerance; one trainer is bitwise).
DATA_PARALLEL_NOT_EXACT = (
    "{trainers} data-parallel trainers: equal to plain training within float tolerance "
    "(gradients summed in another order), not bitwise"
)

#: The settings only a store mode reads, and those only the disk store reads.
STORE_SETTINGS = ("store",)
DISK_SETTINGS = ("store_dir", "init_from_store", "store_layout")
#: The settings only a distributed run (--trainers/--servers) reads.
DIST_SETTINGS = (
    "cache_sync",
    "plans_in_flight",
    "ddp_bucket_mb",
    "rendezvous_timeout",
    "max_restarts",
    "spares",
    "secret_file",
    "server_memory_budget_mb",
)
#: The settings of the hot tier's start-up profile (not read when --hot-rows gives the rows).
PROFILE_SETTINGS = ("hot_sample_rate",)
#: The schedule terms each --lr-schedule reads.
SCHEDULE_TERMS: dict[str, tuple[str, ...]] = {
    "constant": (),
    "warmup-poly": ("lr_decay_power", "lr_min"),
    "step": ("lr_gamma", "lr_min"),
}


def _refuse_floor_above_rate(cfg: TrainConfig) -> None:
    """--lr-min floors a decaying rate (warmup-poly and step, once they decay): above the
    dense or the embedding rows' base rate it would raise that rate, not decay it."""
    o = cfg.optim
    if o.lr_schedule == "constant" or o.lr_decay_steps == 0:
        return  # the floor is not read: _refuse_inapplicable names it
    known = RECIPE_OPTIMIZER.get(cfg.arch.recipe, {})
    lr = f"--lr {o.lr:g}" + (
        f" (the {cfg.arch.recipe} recipe's)" if known == {"optimizer": o.optimizer, "lr": o.lr} else ""
    )
    flag, base = (
        (f"--embedding-lr {o.row_lr:g}", o.row_lr)
        if o.embedding_lr is not None and o.row_lr < o.lr
        else (lr + ("" if o.embedding_lr is not None else ", the embedding rows' rate too"), o.lr)
    )
    need(
        o.lr_min <= base,
        f"--lr-min {o.lr_min:g} exceeds {flag}: the decay's floor would raise the rate, not decay it; "
        f"give --lr-min at most {base:g} (0: no floor)",
    )


def _refuse_inapplicable(cfg: TrainConfig) -> None:
    """Every setting given a value that the chosen mode, store, topology or schedule
    does not read is refused in one line naming it, never silently ignored
    (``--mode full --store disk`` would train in memory; ``--mode fae --cache-rows``
    would size nothing). "Given" means other than its default, so a TOML file may state
    a default explicitly."""
    flat = to_flat(cfg)
    defaults = _defaults()
    for name, why in inapplicable(flat):
        value = flat[name]
        if name == "store_layout" and value == "identity" and not flat.get("init_from_store"):
            continue  # the layout every store but a one-process run's own disk store has (a file may say so)
        # a switch turned off is spelt --no-NAME on the command line
        flag = f"--{'no-' if value is False and defaults[name] is True else ''}{name.replace('_', '-')}"
        need(value == defaults[name], f"{flag} {why}")


def _defaults() -> dict:
    return {f.name: f.default for cls in sections(TrainConfig).values() for f in dataclasses.fields(cls)}


def inapplicable(flat: dict) -> list[tuple[str, str]]:
    """(setting, why) of every setting that the mode (its row of the table of modes),
    store, topology and schedule of the flat settings ``flat`` (missing ones at their
    defaults) do not read."""
    v = _defaults() | flat
    spec = mode_spec(v["mode"])
    out: list[tuple[str, str]] = []

    def add(names, why: str) -> None:
        out.extend((n, why) for n in names)

    if not spec.sized_cache:
        add(
            ("cache_rows", "cache_budget_mb"),
            f"does not apply to --mode {spec.name} (it sizes the cache of --mode {modes_with('sized_cache')})",
        )
    if not spec.looks_ahead:
        add(("lookahead",), f"does not apply to --mode {spec.name} (the window of --mode {modes_with('looks_ahead')})")
    if not spec.store:
        add(
            STORE_SETTINGS + DISK_SETTINGS,
            f"does not apply to --mode {spec.name}: every row is in this process's memory",
        )
    elif v["store"] == "memory":
        add(DISK_SETTINGS, "needs --store disk (the memory store keeps no files)")
    if spec.store and v["store"] == "disk" and (v["servers"] > 0 or v["trainers"] > 1):
        add(
            ("store_layout",),
            "applies to a one-process run's disk store (an embedding server's shard keeps the identity layout)",
        )
    if spec.store and v["store"] == "disk" and v["init_from_store"]:
        add(
            ("store_layout",),
            "applies to a store this run makes: the store of --init-from-store keeps the layout it was made with",
        )
    if not (v["servers"] > 0 or v["trainers"] > 1):
        periodic = str(v["cache_sync"]).startswith("periodic")  # has its own message (it needs --trainers N >= 2)
        add(
            [n for n in DIST_SETTINGS if not (n == "cache_sync" and periodic)],
            "applies to distributed runs (--trainers N --servers S), not one process",
        )
    profiled = (spec.has_hot_tier or v["hot_budget_mb"] > 0 or v["skip_stale"]) and not v["hot_rows"]
    if not profiled:
        add(
            PROFILE_SETTINGS,
            "applies when the hot rows are profiled at start-up (--hot-budget-mb, "
            f"or --mode {modes_with('has_hot_tier')} without --hot-rows)",
        )
    if v["device"] == "cpu":
        add(
            ("device_memory_budget_mb",),
            "applies to --device cuda or cpu-async (a device's own memory); --memory-budget-mb bounds the host's",
        )
    if v["device"] != "cuda":
        add(
            ("deterministic",),
            f"applies to --device cuda (torch's deterministic GPU algorithms); on --device {v['device']} "
            "every run is deterministic already, with or without it",
        )
    schedule = v["lr_schedule"]
    for name in ("lr_decay_power", "lr_gamma", "lr_min"):
        if name not in SCHEDULE_TERMS[schedule]:
            users = " or ".join(k for k, terms in SCHEDULE_TERMS.items() if name in terms)
            add([name], f"applies to --lr-schedule {users}, not {schedule}")
    if schedule == "warmup-poly" and v["lr_decay_steps"] == 0:
        add(
            ("lr_decay_start", "lr_decay_power", "lr_min"),
            "shapes warmup-poly's decay, which needs its length: give --lr-decay-steps N > 0 "
            "(without it the rate never decays)",
        )
    if schedule == "warmup-poly" and v["lr_warmup_steps"] == 0 and v["lr_decay_steps"] == 0:
        add(
            ("lr_schedule",),
            "warmup-poly without --lr-warmup-steps W or --lr-decay-steps N keeps the rate constant: "
            "give W and/or N (docs/optimizers.md), or drop --lr-schedule",
        )
    return out


def only_applicable(settings: dict) -> dict:
    """``settings`` without those their own mode, store, topology and schedule do not
    read: for code that runs several modes with shared settings (benchmarks, tests)."""
    drop = {name for name, _ in inapplicable(settings)}
    return {k: v for k, v in settings.items() if k not in drop}


def load_config(file: str | None, overrides: dict, defaults: dict | None = None) -> TrainConfig:
    """Merge a TOML file (may be None) and command-line overrides (None values ignored).

    The file's keys are setting names, at the top level, in their section's table, or
    (as older files have them) inside a ``[train]`` table. ``defaults``: values of
    settings that neither gives (``plan``'s stand-in for a required ``--out``).
    """
    values: dict = dict(defaults or {})
    source = "command line"
    from_file: dict = {}
    if file:
        raw = read_toml(file)
        if set(raw) == {"train"} and isinstance(raw["train"], dict):
            raw = raw["train"]
        from_file = flatten(TrainConfig, raw, str(file))
        values.update(from_file)
        source = str(file)
    given = {k: v for k, v in overrides.items() if v is not None}
    values.update(given)
    for mine, other in (("steps", "epochs"), ("epochs", "steps")):
        if mine in given and other in from_file and other not in given:
            del values[other]  # the command line's run length overrides the file's other one
    cfg = build(TrainConfig, with_recipe_settings(values), source)
    if "data" in from_file and "data" not in given:
        _toml_data_exists(cfg.data.data, str(file))
    return with_run_length(cfg, values)


def file_setting_note(message: str, file: str, overrides: dict) -> str:
    """The note for a refusal ``message`` that names an option (``--store does not apply to
    --mode full``) whose value came from the config ``file``, not the command line
    (``overrides``): the user typed no such option (newcomer round 22); "" for none. The
    command line adds it to every refusal of train, plan and worker."""
    try:
        raw = read_toml(file)
        if set(raw) == {"train"} and isinstance(raw["train"], dict):
            raw = raw["train"]
        from_file = flatten(TrainConfig, raw, str(file))
    except BagpipeError:
        return ""
    given = {k for k, v in overrides.items() if v is not None}
    named = []  # (where the message names it first, key, value): the earliest is what it is about
    for key, value in from_file.items():
        flag = re.escape("--" + key.replace("_", "-"))  # --lr ..., or a range error's "lr must be ..."
        found = re.search(rf"(?<![\w-]){flag}(?![\w-])|^{re.escape(key)}(?= )", message)
        if key not in given and found:
            named.append((found.start(), key, value))
    for _, key, value in sorted(named, key=lambda n: n[0])[:1]:
        flag = "--" + key.replace("_", "-")
        if isinstance(value, float) and not math.isfinite(value):
            shown = str(value)  # TOML's own spelling: inf, -inf, nan
        elif isinstance(value, (str, int, float, bool)):
            shown = json.dumps(value, allow_nan=False)
        else:
            shown = repr(value)
        instead = (
            f"give {flag} another value"
            if not isinstance(value, bool)
            else f"give {flag if not value else '--no-' + flag[2:]}"
        )
        return f" ({key} = {shown} is from {file}, not the command line: change it there, or {instead} on the command line)"
    return ""


def _toml_data_exists(data: str, file: str) -> None:
    """A relative ``data`` of a TOML file is relative to the working directory, not the
    file's folder (docs/runs.md): where it names nothing, say so, and where it came from."""
    if Path(data).is_absolute() or Path(data).exists():
        return
    beside = Path(file).parent / data
    hint = f"; {beside} exists: give that path" if Path(file).parent != Path() and beside.exists() else ""
    raise ConfigError(
        f"{data}: no such dataset directory (data = {json.dumps(data, allow_nan=False)} in {file}, relative to the working "
        f"directory {Path.cwd()}, not to the file's folder{hint})"
    )


def with_run_length(cfg: TrainConfig, given: dict) -> TrainConfig:
    """``cfg`` with its number of steps: ``--steps`` as given, else ``--epochs`` E (default
    1) whole epochs of the data set's train split, E x (train samples // batch size) steps
    (the train stream drops the last partial batch). ``given``: the settings given (file
    and command line), where ``--steps`` and ``--epochs`` exclude each other."""
    run = cfg.run
    need(
        given.get("steps") != 0,
        "steps must be > 0, got 0 (leave --steps out for one epoch, or give --epochs E)",
    )
    need(
        not (given.get("steps") and given.get("epochs") is not None),
        f"--epochs {given.get('epochs')} and --steps {given.get('steps')} both give the run's length: "
        "give one of them (--epochs E runs E x the train split's batches)",
    )
    if run.steps:
        return cfg
    return cfg.replace(steps=(run.epochs or 1) * epoch_steps(cfg.data))


def epoch_steps(data: DataConfig) -> int:
    """Steps of one epoch of ``data``'s train split at its batch size, from its meta.json
    (read here as JSON: bagpipe.data imports the config, not the other way round; the
    data set's own checks run when the run opens it)."""
    meta = Path(data.data) / "meta.json"
    try:
        train = json.loads(meta.read_text(encoding="utf-8"))["splits"]["train"]
        n = sum(int(x) for x in train["shard_sizes"])  # num_samples is derived from them; the data set checks both
    except FileNotFoundError:
        if not Path(data.data).exists():  # the same words as with --steps (bagpipe.data.schema)
            raise ConfigError(f"{data.data}: no such dataset directory") from None
        raise ConfigError(
            f"{data.data}: not a finished bagpipe dataset (no meta.json), so one epoch's steps are unknown"
        ) from None
    except NotADirectoryError:
        raise ConfigError(
            f"{data.data}: a file, not a dataset directory (raw logs become one with `bagpipe preprocess`)"
        ) from None
    except KeyError:
        raise ConfigError(f"{meta}: the data set has no train split to train on") from None
    except (OSError, ValueError, TypeError) as e:
        raise ConfigError(
            f"{meta}: unreadable ({e}); `bagpipe check {shlex.quote(data.data)}` checks the data set"
        ) from None
    need(isinstance(n, int) and n >= 0, f"{meta}: splits.train.num_samples must be a count, got {n!r}")
    need(
        n >= data.batch_size,
        f"--batch-size {data.batch_size} exceeds the {n:,} samples of the train split of {data.data}: "
        "give a smaller --batch-size",
    )
    return n // data.batch_size


def with_recipe_settings(values: dict) -> dict:
    """``values`` with the optimizer settings its recipe is known to train with
    (:data:`bagpipe.models.config.RECIPE_OPTIMIZER`) where they are not given; a run that
    names another optimizer gets none of them (the recipe's rate is that optimizer's)."""
    known = RECIPE_OPTIMIZER.get(str(values.get("recipe", "")))
    if not known or values.get("optimizer", known["optimizer"]) != known["optimizer"]:
        return values
    return known | values
