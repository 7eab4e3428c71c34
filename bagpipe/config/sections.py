"""The sections of a training run's configuration, one typed dataclass per component.

Each section is what one component reads (the data stream, the model, the optimizers, the
embedding placement, the hot tier, the distributed job, the approximations, the run), so a
function below ``bagpipe.train`` takes the sections it reads, not the whole
:class:`~bagpipe.config.train.TrainConfig`. Every setting is declared once, with its type
and a docstring; ``bagpipe train --help`` and the TOML keys are generated from these
declarations (:mod:`bagpipe.config.options`). Every bad value raises ConfigError with one
line at start-up. The module is long because every setting of `bagpipe train` is declared
here, each with its docstring (the option's help) and its checks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from bagpipe.config.modes import Mode, ModeSpec, mode_spec
from bagpipe.config.typed import Section, finite, need
from bagpipe.files import dash_is_stdout
from bagpipe.models.config import ModelConfig, ModelName, RecipeName, recipe
from bagpipe.optim.names import ADAM_FAMILY, OptimizerName, ScheduleName

Store = Literal["memory", "disk"]
DeviceName = Literal["cpu", "cuda", "cpu-async"]  # the keys of bagpipe.device.DEVICES
MAX_DIM = 1 << 16  # D beyond this is a typo, not a model (a row of 256 KiB)
MAX_THREADS = 4096
MAX_DDP_BUCKET_MB = 1024.0  # a bucket beyond 1 GiB is a typo (DDP buffers every bucket twice)


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
    """Model size: debug (trains in seconds on a laptop), kaggle (DLRM's Criteo Kaggle sizes;
    adagrad at --lr 0.002, measured in docs/optimizers.md) or dcn-mlperf (--model dcn only:
    MLPerf's DLRM-DCNv2, D = 128, for the criteo-1tb profile; MLPerf's adagrad at --lr 0.005).
    A recipe's rate applies unless --lr or another --optimizer is given."""
    embedding_dim: int | None = None
    """D, overrides the recipe's embedding dimension."""

    def validate(self) -> None:
        need(
            self.embedding_dim is None or 0 < self.embedding_dim <= MAX_DIM,
            f"embedding dim must be in [1, {MAX_DIM}], got {self.embedding_dim}",
        )

    def model_config(self) -> ModelConfig:
        """The recipe's architecture, with ``embedding_dim`` applied."""
        cfg = recipe(self.model, self.recipe)
        if self.embedding_dim is not None and self.embedding_dim != cfg.embedding_dim:
            changes: dict = {"embedding_dim": self.embedding_dim}
            if self.model == "dlrm" or cfg.dcn_stacked:  # the bottom MLP must end in D
                changes["bottom_mlp"] = tuple(cfg.bottom_mlp[:-1]) + (self.embedding_dim,)
            cfg = dataclasses.replace(cfg, **changes)
        return cfg


@dataclass(kw_only=True)
class OptimConfig(Section):
    """optimisation (docs/optimizers.md)"""

    optimizer: OptimizerName = "adagrad"
    """Row-wise for embedding rows (FBGEMM's sgd, rowwise adagrad, adam, partial_rowwise_adam),
    torch's for dense parameters (Adam for both Adam variants)."""
    lr: float = 0.05
    """Learning rate of the dense parameters, and of the embedding rows unless --embedding-lr
    is given; the base rate a schedule scales. The kaggle and dcn-mlperf recipes bring their
    own (see --recipe)."""
    embedding_lr: float | None = None
    """Learning rate of the embedding rows (default: --lr)."""
    beta1: float = 0.9
    """Adam's first-moment decay (adam, partial_rowwise_adam)."""
    beta2: float = 0.999
    """Adam's second-moment decay (adam, partial_rowwise_adam)."""
    eps: float = 1e-8
    """Adam's denominator term (adam, partial_rowwise_adam)."""
    weight_decay: float = 0.0
    """Decoupled weight decay: every updated weight also moves by -lr * weight_decay * w
    (adam, partial_rowwise_adam; FBGEMM's rule, torch's AdamW)."""
    lr_schedule: ScheduleName = "constant"
    """constant; warmup-poly: MLPerf DLRM's linear warm-up, then polynomial decay; step:
    warm-up, then times --lr-gamma every --lr-decay-steps. Scales both rates."""
    lr_warmup_steps: int = 0
    """W: the rate ramps linearly from lr/W at step 1 to lr at step W (warmup-poly, step)."""
    lr_decay_start: int = 0
    """S: the step (counted from 1) where the decay starts (warmup-poly, step); >= W."""
    lr_decay_steps: int = 0
    """N: warmup-poly decays to 0 over N steps from S; step multiplies by --lr-gamma every N steps."""
    lr_decay_power: float = 2.0
    """p of warmup-poly's decay factor ((N - (t - S)) / N) ** p (MLPerf DLRM: 2)."""
    lr_gamma: float = 0.1
    """Factor of each step of the step schedule."""
    lr_min: float = 0.0
    """Floor of both rates once the decay has started (MLPerf DLRM: 1e-7)."""

    def validate(self) -> None:
        need(finite(self.lr) and self.lr > 0, f"learning rate must be > 0, got {self.lr}")
        e = self.embedding_lr
        need(e is None or (finite(e) and e > 0), f"embedding learning rate must be > 0, got {e}")
        need(
            0 <= self.beta1 < 1 and 0 <= self.beta2 < 1,
            f"Adam betas must be in [0, 1), got {self.beta1} and {self.beta2}",
        )
        need(finite(self.eps) and self.eps > 0, f"eps must be > 0, got {self.eps}")
        need(
            finite(self.weight_decay) and self.weight_decay >= 0, f"weight decay must be >= 0, got {self.weight_decay}"
        )
        adam = (self.beta1, self.beta2, self.eps, self.weight_decay)
        need(
            self.optimizer in ADAM_FAMILY or adam == (0.9, 0.999, 1e-8, 0.0),
            f"--beta1, --beta2, --eps and --weight-decay apply to adam and partial_rowwise_adam, not {self.optimizer}",
        )
        W, S, N = self.lr_warmup_steps, self.lr_decay_start, self.lr_decay_steps
        need(min(W, S, N) >= 0, f"schedule steps must be >= 0, got warm-up {W}, decay start {S}, decay steps {N}")
        need(finite(self.lr_min) and self.lr_min >= 0, f"lr-min must be >= 0, got {self.lr_min}")
        need(
            finite(self.lr_decay_power) and self.lr_decay_power > 0,
            f"lr-decay-power must be > 0, got {self.lr_decay_power}",
        )
        need(finite(self.lr_gamma) and 0 < self.lr_gamma <= 1, f"lr-gamma must be in (0, 1], got {self.lr_gamma}")
        if self.lr_schedule == "constant":
            need(
                W == S == N == 0,
                "--lr-warmup-steps, --lr-decay-start and --lr-decay-steps need --lr-schedule warmup-poly or step",
            )
        elif N > 0:
            need(S >= W, f"the decay must start after the warm-up: --lr-decay-start {S} < --lr-warmup-steps {W}")
        if self.lr_schedule == "step":
            need(N > 0, "--lr-schedule step needs --lr-decay-steps N > 0 (steps between two decays)")

    def schedule(self):
        """The :class:`~bagpipe.optim.schedule.LRSchedule` of these settings."""
        from bagpipe.optim.schedule import LRSchedule

        return LRSchedule(
            kind=self.lr_schedule,
            warmup_steps=self.lr_warmup_steps,
            decay_start=self.lr_decay_start,
            decay_steps=self.lr_decay_steps,
            power=self.lr_decay_power,
            gamma=self.lr_gamma,
            lr_min=self.lr_min,
        )

    @property
    def row_lr(self) -> float:
        """The embedding rows' base learning rate."""
        return self.lr if self.embedding_lr is None else self.embedding_lr

    def sparse_optimizer(self, dim: int):
        """The row-wise optimizer for rows of D = ``dim``, with the schedule."""
        from bagpipe.optim.build import build_sparse_optimizer

        return build_sparse_optimizer(
            self.optimizer,
            self.row_lr,
            dim,
            betas=(self.beta1, self.beta2),
            eps=self.eps,
            weight_decay=self.weight_decay,
            schedule=self.schedule(),
        )

    def dense_optimizer(self, params):
        """torch's optimizer for the dense parameters ``params`` (the loop sets its rate each step)."""
        from bagpipe.optim.build import build_dense_optimizer

        return build_dense_optimizer(
            self.optimizer,
            self.lr,
            params,
            betas=(self.beta1, self.beta2),
            eps=self.eps,
            weight_decay=self.weight_decay,
        )


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
    """Directory of the disk store (default RUN/store, emptied at start). A directory that
    already holds a store is refused unless init_from_store is on."""
    init_from_store: bool = False
    """Start from the rows --store-dir already holds instead of the initial tables (the
    run is then no longer comparable with --mode full)."""
    store_layout: Literal["auto", "identity", "frequency"] = "auto"
    """Where the disk store this run makes keeps each row in its file: identity (row g at
    slot g), or frequency -- the rows the train split uses most (counted over the whole
    split before training, at most 4M of them) packed at the front of the file, so that
    the pages of the rows a run reads and writes back hold many such rows and stay in the
    page cache (docs/pipeline.md#row-layout). auto: frequency when the run trains at least
    half an epoch, making the layout takes at most 2 GiB at its peak (Criteo Kaggle's tables:
    1.4 GiB), the memory budget holds it without shrinking the cache or read-ahead and the
    disk holds its row log, else identity; plan and the summary say which and why. The
    trained model is the same."""
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
            not self.init_from_store or (self.store == "disk" and self.store_dir is not None),
            "--init-from-store needs --store disk and the --store-dir to start from",
        )
        need(
            not (self.cache_budget_mb > 0 and self.cache_rows > 0),
            "--cache-budget-mb and --cache-rows are mutually exclusive: give the cache's memory budget "
            "(the tuner picks rows and lookahead) or its rows, not both",
        )

    @property
    def spec(self) -> ModeSpec:
        """The mode's row of the table of modes (:mod:`bagpipe.config.modes`)."""
        return mode_spec(self.mode)


@dataclass(kw_only=True)
class HotConfig(Section):
    """hot rows (a hot tier in front of the cache; FAE and Hotline)"""

    hot_budget_mb: float = 0.0
    """MiB for a hot tier (nocache, lru, lookahead, fae, hotline): the most accessed rows
    that fit with their optimizer state stay in the trainer for the whole run, and the
    planner handles only the other rows; chosen at start-up by profiling a sample of the
    train split. 0: none (fae and hotline then take FAE's default, 256). With --mode full and
    --skip-stale: the rows Slipstream watches (default 256)."""
    hot_rows: str | None = None
    """The hot rows from a file of `bagpipe profile --out FILE` (instead of profiling at start-up)."""
    hot_sample_rate: float = 0.05
    """Share of the train split profiled at start-up (FAE's default: 5%)."""
    fae_schedule: Literal["keep", "split"] = "keep"
    """fae: keep the data order (exact), or split each epoch into all-hot batches and the
    others as FAE does (changes the data order: an approximation)."""

    def validate(self) -> None:
        need(
            finite(self.hot_budget_mb) and self.hot_budget_mb >= 0,
            f"hot budget must be a finite number of MiB >= 0, got {self.hot_budget_mb}",
        )
        need(0 < self.hot_sample_rate <= 1, f"hot sample rate must be in (0, 1], got {self.hot_sample_rate}")
        need(
            not (self.hot_budget_mb > 0 and self.hot_rows),
            "--hot-budget-mb and --hot-rows are mutually exclusive: profile at start-up for a budget, or read a file",
        )

    @property
    def on(self) -> bool:
        """Whether a hot tier was asked for (fae and hotline always have one)."""
        return self.hot_budget_mb > 0 or bool(self.hot_rows)


@dataclass(kw_only=True)
class MemoryConfig(Section):
    """memory budget (docs/beyond-memory.md#memory-budgets; `bagpipe plan` prints the estimate)"""

    memory_budget_mb: float | None = None
    """MiB of memory (page cache included) the run may use. What it bounds: a one-process
    run, that process; a local job (`train --trainers N --servers S`: every role started
    on this machine by the launcher), the whole job: the launcher, every trainer and server
    and the oracle together must fit it (and the memory cgroup's limit where that is
    smaller), or `train` and `plan` refuse before any role starts, and each trainer is
    sized to it alone; a role started by torchrun or by hand (`bagpipe worker`), that
    process alone. Default: the limit of the memory cgroup it runs in (v2 memory.max, v1
    memory.limit_in_bytes, found through /proc/self/cgroup), none without one; 0: no
    budget. A trainer sizes the plans it reads ahead, the disk store's I/O buffers and
    dirty pages, a default hot tier and a default cache to fit it with 15% kept free, and
    stops before training, naming the smallest budget that works, when even its smallest
    configuration does not fit."""
    server_memory_budget_mb: float | None = None
    """Each embedding server's own budget (--servers), applied the same way to its store;
    default: the limit of the server's own memory cgroup."""

    def validate(self) -> None:
        for name in ("memory_budget_mb", "server_memory_budget_mb"):
            v = getattr(self, name)
            need(
                v is None or (finite(v) and v >= 0),
                f"--{name.replace('_', '-')} must be a finite number of MiB >= 0 (0: no budget), got {v}",
            )


EXACT_SYNCS = ("partitioned", "owner", "replicated")
"""The --cache-sync values that keep the result of one process on the global batch."""


@dataclass(kw_only=True)
class DistConfig(Section):
    """distributed (one machine: every role a process on loopback)"""

    trainers: int = 1
    """N, data-parallel trainer processes; each trains on 1/N of every global batch."""
    servers: int = 0
    """S, embedding server processes holding the rows (row g on server g % S); 0 keeps the
    store in the trainer. With S >= 1 the run is distributed: N trainers + S servers + 1 oracle."""
    cache_sync: str = "partitioned"
    """partitioned: rows one trainer uses and then drops are neither replicated nor
    synchronised, the others are all-reduced over every trainer; owner: each row of a step
    has one owning trainer that sums its users' gradients and sends the row only to the
    trainers that use it next (fewer bytes on every link, the same exact result; with
    8 trainers about a third of the row transfers, docs/distributed.md); replicated:
    every trainer holds and synchronises every planned row; periodic:K (cDLRM, an approximation): each trainer updates its own copies of the
    shared rows, averaged over the trainers every K steps and before a row leaves the
    cache (docs/approximations.md)."""
    plans_in_flight: int = 4
    """Plans the oracle may send a trainer ahead of what it has taken (back-pressure)."""
    ddp_bucket_mb: float = 0.0
    """MiB of dense gradients the trainers all-reduce at a time (DDP's bucket_cap_mb; 0:
    torch's default, a first bucket of 1 MiB and then 25 MiB). A bucket is all-reduced while
    the rest of the backward runs, so smaller buckets hide more of the dense sync behind
    the backward (the DLRM Kaggle recipe's ~2 MB in 0.25 MiB buckets: all but the last),
    at one message more per bucket."""
    rendezvous_timeout: float = 300.0
    """Seconds a role waits for the job's other processes to start before it gives up."""
    max_restarts: int = 0
    """When a role dies, stop the others and restart every role from the latest complete
    checkpoint, up to this many times (the local launcher; torchrun has its own)."""
    spares: bool = True
    """With --max-restarts: keep one pre-started process per role, its imports done, so a
    restart starts no interpreter (each costs its imports' CPU once and ~300 MiB)."""
    secret_file: str | None = None
    """File holding the job's secret (mode 0600), which every role proves it holds before
    the others talk to it (torchrun and hand-started roles; default $BAGPIPE_JOB_SECRET,
    else the file $BAGPIPE_JOB_SECRET_FILE). The local launcher makes a new one itself."""

    def validate(self) -> None:
        need(self.trainers >= 1, f"trainers must be >= 1, got {self.trainers}")
        need(self.servers >= 0, f"servers must be >= 0, got {self.servers}")
        need(self.plans_in_flight >= 1, f"plans in flight must be >= 1, got {self.plans_in_flight}")
        need(self.max_restarts >= 0, f"max restarts must be >= 0, got {self.max_restarts}")
        need(
            finite(self.ddp_bucket_mb) and 0 <= self.ddp_bucket_mb <= MAX_DDP_BUCKET_MB,
            f"--ddp-bucket-mb must be MiB in [0, {MAX_DDP_BUCKET_MB:g}] (0: torch's default), got {self.ddp_bucket_mb}",
        )
        need(
            finite(self.rendezvous_timeout) and self.rendezvous_timeout > 0,
            f"rendezvous timeout must be a number of seconds > 0, got {self.rendezvous_timeout}",
        )
        _ = self.sync_period  # checks the --cache-sync value

    @property
    def sync_period(self) -> int:
        """K of ``--cache-sync periodic:K``; 0 for the exact caches (partitioned, owner, replicated)."""
        v = self.cache_sync
        if v in EXACT_SYNCS:
            return 0
        kind, _, k = v.partition(":")
        need(
            kind == "periodic" and k.isdigit() and int(k) >= 1,
            f"--cache-sync must be partitioned, owner, replicated or periodic:K with K >= 1 steps, got {v!r}",
        )
        return int(k)

    @property
    def distributed(self) -> bool:
        return self.servers > 0 or self.trainers > 1


@dataclass(kw_only=True)
class DeviceConfig(Section):
    """device (where the model and the cache compute; docs/gpu.md)"""

    device: DeviceName = "cpu"
    """cpu; cuda: the dense model, the cache (C, D) and its optimizer state on the GPU, the
    store in host memory or on disk, the oracle on the CPU (--mode full: every table on the
    GPU); a distributed trainer takes GPU LOCAL_RANK. cpu-async: the CPU, with every copy
    between host buffers and the cache run late and out of order on a worker thread, as a
    GPU may (a missing wait then shows as a wrong result; for tests)."""
    deterministic: bool = True
    """cuda: torch's deterministic algorithms, which make every cached mode bitwise equal to
    --mode full on the GPU (off: may be faster; results then differ in the last bits)."""
    device_memory_budget_mb: float = 0.0
    """MiB of device memory this run may use (cuda, cpu-async; 0: no budget). The run is
    refused at start, naming what to change, when what it keeps on the device (--mode full:
    every table; else the cache, the hot tier, the staged rows, the dense model) does not
    fit with 15% kept free; on cuda torch's caching allocator is also capped there, so an
    allocation past it fails. Makes a table of a few GiB "larger than the GPU"."""

    def validate(self) -> None:
        v = self.device_memory_budget_mb
        need(
            finite(v) and v >= 0,
            f"--device-memory-budget-mb must be a finite number of MiB >= 0 (0: no budget), got {v}",
        )


@dataclass(kw_only=True)
class ApproxConfig(Section):
    """approximations, opt-in (docs/approximations.md)"""

    skip_stale: bool = False
    """Slipstream (an approximation): watch the hot rows, and once the sampling phase has
    shown which of them barely change, leave out of forward and backward the inputs whose
    lookups are such stale rows (--mode full or lookahead with a hot tier; one process). Its
    checkpoints serve eval and export, but such a run cannot be resumed (the rows'
    snapshots are not checkpointed)."""
    stale_start: int = 0
    """s: the step after which the hot rows are first snapshotted."""
    stale_sampling_share: float = 0.015
    """Length of the sampling phase, as a share of an epoch's steps (at least one step);
    the rows' second snapshot ends it and skipping starts."""
    stale_target: float = 0.3
    """D: the share of inputs the threshold search aims to make skippable."""
    stale_tolerance: float = 0.08
    """The search stops once the share is within this of D."""
    stale_alpha: int = 0
    """Stale lookups an input needs to be skipped (0: all its lookups)."""
    stale_sample_rate: float = 0.01
    """Share of an epoch's inputs (the batches after the sampling phase) the threshold search counts."""
    emulate_compute: str | None = None
    """Benchmarks only (bagpipe bench cluster): replace each trainer's forward and backward
    by a delay -- 25ms a step, 12us/sample, or the profile v100-dlrm-kaggle, each optionally
    *K (K times slower) -- while the batches, plans, fetches, write-backs, the dense
    all-reduce (DDP, real gradient sizes) and the row sync stay real. The run does not
    train: its summary says so (exact false); distributed runs with --no-digest only."""

    def validate(self) -> None:
        need(self.stale_start >= 0, f"stale start must be a step >= 0, got {self.stale_start}")
        need(
            finite(self.stale_sampling_share) and 0 < self.stale_sampling_share <= 1,
            f"stale sampling share must be in (0, 1], got {self.stale_sampling_share}",
        )
        need(
            finite(self.stale_target) and 0 < self.stale_target < 1,
            f"stale target must be in (0, 1), got {self.stale_target}",
        )
        need(
            finite(self.stale_tolerance) and 0 < self.stale_tolerance < 1,
            f"stale tolerance must be in (0, 1), got {self.stale_tolerance}",
        )
        need(self.stale_alpha >= 0, f"stale alpha must be >= 0 lookups (0: all of an input's), got {self.stale_alpha}")
        need(
            finite(self.stale_sample_rate) and 0 < self.stale_sample_rate <= 1,
            f"stale sample rate must be in (0, 1], got {self.stale_sample_rate}",
        )
        if self.emulate_compute is not None:
            from bagpipe.config.compute import parse_compute

            parse_compute(self.emulate_compute)
        changed = [
            f.name
            for f in dataclasses.fields(self)
            if f.name not in ("skip_stale", "emulate_compute") and getattr(self, f.name) != f.default
        ]
        need(
            self.skip_stale or not changed,
            f"--{changed[0].replace('_', '-') if changed else ''} applies to --skip-stale, which is off",
        )


@dataclass(kw_only=True)
class RunConfig(Section):
    """run, evaluation, checkpoints"""

    out: str
    """Run directory: config.json, metrics.jsonl, checkpoints, summary.json."""
    steps: int = 0
    """Training steps (batches); past the end of the train split a new epoch begins.
    Not given (0): one epoch of the train split, or --epochs E."""
    epochs: int | None = None
    """E: train for E epochs, E x (train samples // batch size) steps; excludes --steps.
    Without either, a run trains one epoch."""
    seed: int = 0
    """Seeds the model init, the embedding init and the data order."""
    eval_every: int = 0
    """Evaluate every N steps (0: only at the end)."""
    eval_samples: int = 0
    """Cap on evaluation samples (0: the whole eval split)."""
    checkpoint_every: int = 0
    """Write a checkpoint every N steps (0: only at the end)."""
    checkpoint_compact_every: int = 10
    """Every Nth checkpoint holds every row; the others only the rows changed since the
    previous checkpoint (1: every checkpoint is full)."""
    resume: bool = False
    """Continue from the run directory's latest checkpoint."""
    resume_from: str | None = None
    """Continue from this checkpoint of the run directory instead of its latest (a
    step-NNNNNNNN folder name, its path, or its step); implies --resume. Its later
    checkpoints are left on disk; the run's next checkpoints replace them."""
    summary_json: str | None = None
    """Also write the summary JSON here (outside --out: inside it only RUN/summary.json,
    which the run writes anyway); - (or /dev/stdout): standard output gets the JSON
    alone, the run's own lines go to stderr."""
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
    tensorboard: str | None = None
    """Also log the metrics as TensorBoard scalars into this directory (needs the
    tensorboard package: pip install 'bagpipe[tensorboard]')."""

    def validate(self) -> None:
        need(self.steps >= 0, f"steps must be > 0, got {self.steps}")  # 0: not given (one epoch)
        need(self.epochs is None or self.epochs > 0, f"epochs must be >= 1, got {self.epochs}")
        if self.resume_from is not None:
            need(
                bool(self.resume_from.strip()),
                "resume_from must name a checkpoint (step-NNNNNNNN, its path or its step)",
            )
            object.__setattr__(self, "resume", True)  # --resume-from implies --resume
        if self.summary_json == "-":  # the command line's name for standard output, as /dev/stdout is
            object.__setattr__(self, "summary_json", dash_is_stdout(self.summary_json))
        need(
            self.tensorboard != "-",
            "--tensorboard -: TensorBoard writes a folder of event files, not to standard output; give a folder "
            "(e.g. --tensorboard runs/tb)",
        )
        need(self.seed >= 0, f"seed must be >= 0, got {self.seed}")
        need(self.eval_every >= 0, f"eval_every must be >= 0, got {self.eval_every}")
        need(self.eval_samples >= 0, f"eval_samples must be >= 0, got {self.eval_samples}")
        need(self.checkpoint_every >= 0, f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        need(
            self.checkpoint_compact_every >= 1,
            f"--checkpoint-compact-every must be >= 1 (1: every checkpoint is full), got {self.checkpoint_compact_every}",
        )
        need(0 <= self.threads <= MAX_THREADS, f"threads must be in [0, {MAX_THREADS}], got {self.threads}")
        w = self.warmup_steps  # steps 0: one epoch, resolved once the data is read (it checks again)
        need(
            0 <= w and (not self.steps or w < self.steps),
            f"--warmup-steps (steps left out of the throughput, not --lr-warmup-steps) must be in [0, --steps), got {w}"
            + (f" with --steps {self.steps}" if self.steps else ""),
        )
