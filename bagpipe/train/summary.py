"""What a finished run reports: the step meter, and ``summary.json``'s schema.

Every topology (one process, a data-parallel trainer) and the TorchRec peer of
``bagpipe bench peers`` time their steps with :class:`StepMeter` and report a
:class:`Summary`, so ``summary.json`` has one schema and one meaning everywhere. The
schema is the dataclasses below -- :class:`Summary` and the sections it nests
(:class:`StepTimes`, :class:`IoPerStep`, :class:`CacheStats`, :class:`DistributedStats`,
:class:`CheckpointStats`, :class:`EndOfRun`, :class:`Approximation`, :class:`MemoryReport`) -- with a
docstring per field; ``docs/runs.md`` points here. This module is long because the schema is one
place: every section with its field docs, which a test keeps in step with the docs. Two rules hold for every figure:

* ``samples_per_s`` and ``time_per_step_ms`` cover the *measured* steps: the steps of
  this run after the first ``warmup_steps`` (all of them when there is no warm-up);
* figures over trainers (``train_logloss``) are means over the trainers; everything else
  is trainer 0's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

from bagpipe.budget.sizing import Fit
from bagpipe.cache.advice import run_advice
from bagpipe.config.modes import ModeSpec
from bagpipe.train.metrics import current_rss_mb, peak_rss_mb
from bagpipe.train.threadcpu import ThreadClock, ThreadTime, pipeline_share

LOSS_WINDOW = 50  # steps the summary's train_logloss averages


@dataclass
class StepTimes:
    """Milliseconds per measured step of the trainer's thread, by phase (the summary's
    ``time_per_step_ms``)."""

    wait_embeddings: float = 0.0
    """Waiting for a plan and its fetched rows, and installing them into the cache."""
    forward: float = 0.0
    """Gathering the rows, pooling, the model's forward pass and the loss."""
    backward: float = 0.0
    """Backpropagation (with DDP: the dense gradients' all-reduce)."""
    optimizer: float = 0.0
    """The dense optimizer's step and the row strategy's update of the embedding rows."""
    sync_wait: float = 0.0
    """Completing deferred embedding synchronisation (0 on one process)."""
    writeback: float = 0.0
    """Copying expired rows out of the cache (and, synchronously, writing them)."""


#: The phases of a step, as :class:`StepTimes` names them.
TIME_KEYS = tuple(f.name for f in fields(StepTimes))


@dataclass
class IoPerStep:
    """The process's block-device traffic per measured step (``/proc/self/io``, every
    thread: page-cache misses of a disk store, faults through its memory map included)."""

    read_bytes: float = 0.0
    """Bytes read from block devices."""
    write_bytes: float = 0.0
    """Bytes written to block devices."""
    major_faults: float = 0.0
    """Major page faults (a page read from disk on first touch)."""


@dataclass
class Timing:
    """What :meth:`StepMeter.result` measured."""

    seconds: float
    """Wall time from the first step of this run to the end of its last (warm-up included)."""
    steps_this_run: int
    """Steps trained by this run (a resumed run counts from its start)."""
    measured_steps: int
    """Steps after the warm-up: what samples_per_s and time_per_step_ms cover."""
    samples_per_s: float
    """Samples of the measured steps per second of their wall time."""
    time_per_step_ms: StepTimes
    """The measured steps' time by phase."""
    io_per_step: IoPerStep
    """The measured steps' block-device traffic."""
    threads_per_step_ms: dict[str, ThreadTime] = field(default_factory=dict)
    """The measured steps' CPU by thread (:mod:`bagpipe.train.threadcpu`)."""


@dataclass
class EndOfRun:
    """Seconds of the work after the last step (the summary's ``end_of_run_s``): it costs
    what was trained, not what the tables hold."""

    finish: float = 0.0
    """Write-backs drained and the cached rows written to the store; the pipeline stopped."""
    checkpoint_cut: float = 0.0
    """The final checkpoint's cut (its rows copied; its files are written meanwhile)."""
    evaluation: float = 0.0
    """The final evaluation."""
    digest: float = 0.0
    """params_sha256, over the rows written since initialisation."""
    checkpoint_wait: float = 0.0
    """Waiting for the final checkpoint's files and commit after the rest was done."""
    total: float = 0.0
    """From the end of the last step to the summary."""


@dataclass
class CheckpointStats:
    """Checkpoints taken by this run (the summary's ``checkpoints``). Each is a cut at a step
    boundary (the training thread copies what it needs) and a write in the background."""

    written: int = 0
    """How many were committed."""
    full: int = 0
    """How many of them are full: every row written since initialisation (the others hold
    only the rows written since the previous checkpoint)."""
    seconds: float = 0.0
    """Time training waited for them, in all: the cuts (write-backs drained, the rows
    copied) and any wait for the previous checkpoint's write to end."""
    write_seconds: float = 0.0
    """Time their files took to write and commit in the background, in all."""
    bytes: int = 0
    """Bytes of their row parts, in all."""
    rows: int = 0
    """Rows their parts hold, in all."""
    failed: int = 0
    """Checkpoints not written for lack of disk space (their partial files removed; the
    next one is full)."""
    last_step: int | None = None
    """The step of the latest complete checkpoint (a resumed run's start before it writes one)."""
    history: list[dict] = field(default_factory=list)
    """Per checkpoint: ``step``, ``kind``, ``rows``, ``bytes``, ``cut_s``, ``write_s``,
    ``failed`` (why it was not written, or None)."""

    @classmethod
    def of(cls, history: list, start: int) -> CheckpointStats:
        """From a :class:`bagpipe.checkpoint.CheckpointWriter`'s history (``start``: the step
        the run resumed from, 0 for a fresh one)."""
        done = [w for w in history if w.failed is None]
        return cls(
            written=len(done),
            full=sum(w.kind == "full" for w in done),
            seconds=sum(w.cut_s for w in history),
            write_seconds=sum(w.write_s for w in history),
            bytes=sum(w.bytes for w in done),
            rows=sum(w.rows for w in done),
            failed=len(history) - len(done),
            last_step=done[-1].step if done else (start or None),
            history=[asdict(w) for w in history],
        )


@dataclass
class CacheStats:
    """The embedding side of a run with a store (the summary's ``cache``; None for ``--mode full``).

    The first block counts every plan the planner made (:class:`bagpipe.oracle.plan.PlanStats`)."""

    steps: int = 0
    """Plans made."""
    lookups: int = 0
    """Lookups of the planned batches (ids, multi-hot ones each counted)."""
    unique_rows: int = 0
    """The batches' unique rows, summed over steps (those the planner saw: a hot tier's are not)."""
    hits: int = 0
    """Unique rows found in the cache."""
    misses: int = 0
    """Unique rows fetched from the store."""
    rows_fetched: int = 0
    """Rows read from the store for the steps."""
    rows_written_back: int = 0
    """Rows written back to the store after their last use in the window or when forced out."""
    forced_evictions: int = 0
    """Rows forced out before their last use because the cache was full (Belady's choice)."""
    retained_evictions: int = 0
    """``lookahead`` on one trainer: rows kept past their last use in the window, written back
    when a miss needed the slot (least recently used first); 0 for the other planners."""
    max_occupied: int = 0
    """The most slots ever in use."""
    seconds: float = 0.0
    """The planner's own time (reading the batches excluded)."""
    state_mb: float = 0.0
    """The lookahead oracle's state at its largest (row map, ring, free slots), MiB."""
    hit_rate: float = 0.0
    """hits / unique_rows."""
    planning_ms_per_step: float = 0.0
    """The planner's time per plan."""
    cache_rows: int = 0
    """C, the planner's slots (a hot tier's rows come on top)."""
    lookahead: int | None = None
    """L, for a planner that looks ahead."""
    hot: dict | None = None
    """The hot tier: its rows and MiB, what it served, the profile that chose it
    (:func:`bagpipe.accel.hot.hot_section`); None without one."""
    store: dict = field(default_factory=dict)
    """The store's counters (reads, rows read, writes, rows written, ...: :class:`bagpipe.store.base.StoreStats`);
    a disk store's also its row layout (`layout`: `identity` or `frequency`, `packed_rows`: the rows at the
    front of its file, `layout_choice`: why it has that layout -- `--store-layout` as given, the rule of
    `auto`, or a reopened store's own; with the frequency layout `log_slots`, the slots of its row log, and
    `logged_rows`, the packed rows whose latest value is in the log at the end)."""
    pipeline_s: dict = field(default_factory=dict)
    """Cumulative seconds of the executor's phases (:class:`bagpipe.cache.executor.PipelineTimes`);
    ``wait_plan`` / ``plan_waits``: how long and at how many steps the trainer waited for its plan."""
    autotune: dict | None = None
    """The auto-tuner's choice of C and L for --cache-budget-mb, with its reason; None when not used."""

    @classmethod
    def plan_keys(cls) -> tuple[str, ...]:
        """The fields that come from the planner's counters."""
        return tuple(f.name for f in fields(cls))[: [f.name for f in fields(cls)].index("cache_rows")]


@dataclass
class DistributedStats:
    """A data-parallel job's figures (the summary's ``distributed``; None on one process)."""

    trainers: int
    """N, data-parallel trainers."""
    servers: int
    """S, embedding servers."""
    cache_sync: str
    """partitioned, owner, replicated or periodic:K (--cache-sync)."""
    sync_bytes_per_step: float
    """Bytes of embedding gradients (or rows, periodically) trainer 0 all-reduced per step (the buffer; a ring sends 2 (N - 1) / N of it); with --cache-sync owner the bytes it sent (gradients to owners, rows to their next users)."""
    sync_rows_per_step: float
    """Rows synchronised per step; with --cache-sync owner the row transfers between trainers (gradients and rows, all trainers together)."""
    sync_overlapped_share: float
    """Share of the synchronised rows (owner: of the transfers; the deferred half's rows count as waited for) that overlapped the next step's compute."""
    replicated_sync_rows_per_step: float
    """Rows a replicated cache would synchronise per step on the same plans."""
    replicated_sync_bytes_per_step: float
    """Bytes a replicated cache would all-reduce per step."""
    partitioned_sync_bytes_per_step: float | None
    """Bytes the exact partitioned cache would all-reduce per step (None with --cache-sync replicated)."""
    fetched_rows_per_trainer: list
    """Rows each trainer fetched from the servers, in all."""
    plans_in_flight: int
    """--plans-in-flight: plans the oracle may send a trainer ahead."""
    max_plans_in_flight: int
    """The most plans ever in flight to one trainer."""
    oracle_planning_s: float
    """The oracle role's time planning and partitioning."""
    oracle_waiting_for_credit_s: float
    """The oracle role's time waiting for a trainer to take a plan (back-pressure)."""
    servers_report: list
    """Each server's request counts, the time its reads were held for other trainers'
    write-backs, waited for the store's lock and spent in the store, the time its row
    replies took to hand to the wire, and its memory: budget, estimate and measured peak
    anonymous MiB."""
    bytes_sent_by_trainer0: int
    """Bytes trainer 0 sent through the transport (requests, write-backs, marks, credits)."""
    bytes_received_by_trainer0: int
    """Bytes trainer 0 received through the transport (rows, plans)."""
    trainer_backend: str = "gloo"
    """The collectives' backend among the trainers (DDP, embedding all-reduce): nccl when
    every trainer has a GPU of its own, gloo otherwise; none with one trainer."""


@dataclass
class MemoryReport:
    """The run's memory: its budget, the estimate it was sized by, and what it used
    (the summary's ``memory``; docs/beyond-memory.md#memory-budgets)."""

    budget_mb: float | None
    """The budget: --memory-budget-mb, else the memory cgroup's limit; None: no budget."""
    budget_source: str
    """Where the budget came from."""
    estimate_mb: float
    """The estimate of the process's peak that the run was sized by (what `bagpipe plan` prints), MiB."""
    estimate_parts_mb: dict
    """The estimate, part by part, MiB."""
    sizes: dict
    """What the budget chose: cache_rows, hot_rows, lookahead, staged_plans, and the disk
    store's io_threads, hint_mb (pages in flight), dirty_mb, page_cache_mb, chunk_rows."""
    changes: list
    """What the budget changed from the run's defaults, one line each."""
    peak_anon_mb: float
    """Measured: the process's peak anonymous memory over the whole run -- training,
    evaluation, digest (sampled every 50 ms) -- MiB."""
    by_step: list
    """Measured every 10 steps (at most 128 points, evenly thinned): [step, the process's
    anonymous MiB, its memory cgroup's usage, page cache, dirty and writeback MiB (None
    without a cgroup)]."""
    group_max_mb: dict
    """Measured: the largest usage, anon, file, dirty, writeback and mapped MiB of the
    process's memory cgroup over those samples (empty without a cgroup)."""

    @classmethod
    def of(cls, fit: Fit | None, watch, peak_anon_mb: float) -> MemoryReport:
        """From the run's memory fit (a remote trainer's from the oracle role, which sized it;
        None: no memory plan) and a :class:`bagpipe.budget.watch.MemoryWatch`."""
        d = fit.as_dict() if fit is not None else {}
        est = d.get("estimate", {})
        return cls(
            budget_mb=d.get("budget_mb"),
            budget_source=d.get("budget_source", "not sized"),
            estimate_mb=est.get("total_mb", 0.0),
            estimate_parts_mb=est.get("parts_mb", {}),
            sizes=d.get("sizes", {}),
            changes=d.get("changes", []),
            peak_anon_mb=peak_anon_mb,
            by_step=watch.points,
            group_max_mb=watch.maxima,
        )


@dataclass
class Approximation:
    """What an approximate run left out (the summary's ``approximation``; None for an exact run)."""

    names: list[str]
    """The approximations (skip-stale, cache-sync periodic:K, fae-schedule split), or
    ``emulate-compute SPEC (did not train)``: a benchmark whose forward and backward were a delay."""
    skip_stale: dict | None = None
    """Slipstream's threshold, decision and skipped inputs per epoch (--skip-stale)."""
    periodic: dict | None = None
    """Periodic averaging's counters (--cache-sync periodic:K)."""
    emulated_compute: dict | None = None
    """--emulate-compute (a benchmark; no training): the spec, the delay per step, the bytes
    a step handed to DDP's dense all-reduce and to the row sync, and the dense all-reduce
    waited for after the emulated backward's end (trainer 0's)."""


class StepMeter:
    """Wall time, losses and per-phase seconds of a run's steps, warm-up excluded.

    Args:
        start: the first step of this run (a resumed run starts past 0).
        warmup: steps left out of the measured figures.
        batch_size: B, samples per (global) step.
        phases: cumulative seconds per phase kept elsewhere (the pipeline's waits, the
            row strategy's sync waits); added to the step's own :attr:`times`.
    """

    def __init__(self, *, start: int, warmup: int, batch_size: int, phases: Callable[[], dict] | None = None):
        self.start = self.step = start
        self.warmup = warmup
        self.batch_size = batch_size
        self.times = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}  # train_step adds to these
        self.losses: list[float] = []
        self._phases = phases or dict
        self.t_start = time.perf_counter()
        self._t_measure: float | None = None
        self._at_warmup: dict | None = None
        self._io_start: dict = io_counters()
        self._io_end: dict | None = None
        self._t_end: float | None = None
        self.clock = ThreadClock()  # created on the thread that runs the steps
        self.clock.start()

    def seconds(self) -> dict:
        """Cumulative seconds per phase (every key of TIME_KEYS)."""
        extra = self._phases()
        return {k: self.times.get(k, 0.0) + extra.get(k, 0.0) for k in TIME_KEYS}

    def record(self, step: int, loss: float) -> None:
        """Step ``step`` (1-based count of steps done) ended with ``loss``."""
        self.losses.append(loss)
        self.step = step
        if step - self.start == self.warmup and self.warmup > 0:
            self._t_measure = time.perf_counter()
            self._at_warmup = self.seconds()
            self._io_start = io_counters()
            self.clock.start()

    @property
    def trained(self) -> int:
        return self.step - self.start

    def samples_per_s(self) -> float:
        """Throughput since the start of this run (warm-up included): the progress line's figure."""
        return self.trained * self.batch_size / max(time.perf_counter() - self.t_start, 1e-9)

    def stop(self) -> None:
        """The last step is done: later work (evaluation, digest) is not timed."""
        self._t_end = time.perf_counter()
        self._io_end = io_counters()
        self.clock.stop()

    def result(self) -> Timing:
        """The measured figures (warm-up excluded)."""
        t_end = self._t_end if self._t_end is not None else time.perf_counter()
        t0, at = self._t_measure, self._at_warmup
        if t0 is None or at is None:  # no warm-up, or a resumed run shorter than it
            t0, at = self.t_start, dict.fromkeys(TIME_KEYS, 0.0)
        measured = self.trained - (self.warmup if self.trained > self.warmup else 0)
        now = self.seconds()
        io_end = self._io_end or io_counters()
        io_start = self._io_start
        per = max(measured, 1)
        return Timing(
            seconds=t_end - self.t_start,
            steps_this_run=self.trained,
            measured_steps=measured,
            samples_per_s=measured * self.batch_size / max(t_end - t0, 1e-9),
            time_per_step_ms=StepTimes(**{k: 1000 * (now[k] - at[k]) / per for k in TIME_KEYS}),
            io_per_step=IoPerStep(**{k: (io_end[k] - io_start[k]) / per for k in io_end}),
            threads_per_step_ms=self.clock.per_step(per),
        )


def io_counters() -> dict:
    """This process's bytes read from and written to block devices (``/proc/self/io``: page
    cache misses, mapped-file faults included; every thread) and its major page faults.
    Zeros where /proc/self/io is not readable."""
    import resource

    out = {"read_bytes": 0, "write_bytes": 0}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in out:
                    out[k] = int(v)
    except OSError:
        pass
    out["major_faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    return out


@dataclass
class Summary:
    """``summary.json``: what a finished run reports, one schema for every mode and topology.

    Built by :meth:`of`; written with :func:`dataclasses.asdict` (:meth:`to_json`), every
    section nested as its own dataclass documents it.
    """

    mode: str
    """--mode."""
    exact: bool
    """True when the run ends with the parameters of plain synchronous training from the seed
    (``--mode full``'s params_sha256, bit for bit); False with any line in ``not_exact``."""
    not_exact: list[str]
    """Why ``exact`` is false, one line each (empty when exact): an approximation by name (its
    section is ``approximation``); ``hotline: equal to plain training within float rounding,
    not bitwise``; ``init-from-store: started from the store's tables, not the seed's``; ``N
    data-parallel trainers: equal to plain training within float tolerance (gradients summed in
    another order), not bitwise``. A resumed run keeps the lines of the runs it continues."""
    approximation: Approximation | None
    """What an approximate run left out; None without an approximation."""
    model: str
    """--model."""
    device: str
    """Where the trainer computed: cpu, cpu-async, or cuda:INDEX (the GPU's name) (--device)."""
    optimizer: str
    """--optimizer."""
    steps: int
    """Steps done, counted from the start of the run (a resumed run includes the earlier ones)."""
    epochs: float | None
    """``steps`` as a multiple of the train split's batches (1.5: half way through the second epoch)."""
    steps_this_run: int
    """Steps trained by this process since it started (or resumed)."""
    samples: int
    """Samples trained by this run: steps_this_run x batch_size."""
    batch_size: int
    """B, samples per (global) step."""
    seconds: float
    """Wall time of this run's steps (warm-up included; evaluation, digest and the final checkpoint excluded)."""
    measured_steps: int
    """Steps after --warmup-steps: what samples_per_s and time_per_step_ms cover."""
    samples_per_s: float
    """Training throughput of the measured steps."""
    train_logloss: float | None
    """Mean training loss of the last 50 steps (averaged over the trainers)."""
    eval_logloss: float | None
    """Log loss of the final evaluation (:mod:`bagpipe.train.evaluate`)."""
    eval_auc: float | None
    """ROC AUC of the final evaluation."""
    eval_ne: float | None
    """Normalized entropy: log loss over the entropy of the eval split's click rate."""
    eval_calibration: float | None
    """Mean predicted click rate over the actual click rate."""
    eval_accuracy: float | None
    """Share of eval samples on the right side of 0.5."""
    eval_samples: int
    """Samples the final evaluation covered."""
    params_sha256: str | None
    """SHA-256 of every dense parameter and of every embedding row whose weights or optimizer
    state differ from their initial values (with the initial tables' identity): equal for
    equal parameters, so ``--mode full``'s for every exact run; it reads only the rows
    written since initialisation (None with --no-digest)."""
    peak_rss_mb: float
    """The process's peak resident memory, MiB (ru_maxrss)."""
    peak_anon_rss_mb: float
    """The process's peak anonymous memory sampled during training, MiB (page cache excluded)."""
    rss_mb: float
    """Resident memory at the end, MiB."""
    total_rows: int
    """R, rows of all tables."""
    embedding_dim: int
    """D."""
    time_per_step_ms: StepTimes
    """The trainer thread's time per measured step, by phase."""
    io_per_step: IoPerStep | None
    """Block-device traffic per measured step."""
    threads_per_step_ms: dict[str, ThreadTime]
    """CPU per measured step of every thread of the process, by name (``trainer``: the steps'
    thread; ``native``: threads Python did not start, mostly torch's intra-op workers)."""
    pipeline_cpu_share: float | None
    """CPU of the embedding pipeline's threads (planner, fetch, write-back, readers, the disk
    store's pools, a distributed trainer's plan receiver) over the CPU of the step's compute
    (trainer + native); None without figures."""
    cache: CacheStats | None
    """The embedding side of a run with a store; None for the full tables."""
    distributed: DistributedStats | None
    """A data-parallel job's figures; None on one process."""
    checkpoints: CheckpointStats | None
    """Checkpoints written by this run."""
    memory: MemoryReport | None
    """The memory budget, the estimate the run was sized by, and what it used."""
    end_of_run_s: EndOfRun | None = None
    """The work after the last step, by part (seconds)."""
    advice: str | None = None
    """Whether the mode paid for itself on this store, in one line (:mod:`bagpipe.cache.advice`);
    None when there is nothing to say."""

    @classmethod
    def of(
        cls,
        *,
        mode: str,
        model: str,
        optimizer: str,
        batch_size: int,
        device: str = "cpu",
        steps: int,
        timing: Timing,
        train_logloss: float | None,
        evaluation: dict,
        params_sha256: str | None,
        peak_anon_rss_mb: float,
        total_rows: int,
        embedding_dim: int,
        cache: CacheStats | None = None,
        distributed: DistributedStats | None = None,
        epochs: float | None = None,
        checkpoints: CheckpointStats | None = None,
        approximation: Approximation | None = None,
        end_of_run_s: EndOfRun | None = None,
        memory: MemoryReport | None = None,
        spec: ModeSpec | None = None,
        slow_store: bool = False,
        remote_store: bool = False,
        not_exact: list[str] | None = None,
    ) -> Summary:
        """The summary of a run: ``timing`` from :meth:`StepMeter.result`, ``evaluation`` from
        :func:`bagpipe.train.evaluate.evaluate`; the process's memory is read now. ``not_exact``:
        why the run is not exact (:attr:`bagpipe.config.train.TrainConfig.not_exact`); None: the
        approximation's names."""
        if not_exact is None:
            not_exact = list(approximation.names) if approximation is not None else []
        return cls(
            mode=mode,
            exact=not not_exact,
            not_exact=not_exact,
            approximation=approximation,
            model=model,
            device=device,
            optimizer=optimizer,
            steps=steps,
            epochs=epochs,
            steps_this_run=timing.steps_this_run,
            samples=timing.steps_this_run * batch_size,
            batch_size=batch_size,
            seconds=timing.seconds,
            measured_steps=timing.measured_steps,
            samples_per_s=timing.samples_per_s,
            train_logloss=train_logloss,
            eval_logloss=evaluation.get("eval_logloss"),
            eval_auc=evaluation.get("eval_auc"),
            eval_ne=evaluation.get("eval_ne"),
            eval_calibration=evaluation.get("eval_calibration"),
            eval_accuracy=evaluation.get("eval_accuracy"),
            eval_samples=evaluation.get("eval_samples", 0),
            params_sha256=params_sha256,
            peak_rss_mb=peak_rss_mb(),
            peak_anon_rss_mb=peak_anon_rss_mb,
            rss_mb=current_rss_mb(),
            total_rows=total_rows,
            embedding_dim=embedding_dim,
            time_per_step_ms=timing.time_per_step_ms,
            io_per_step=timing.io_per_step,
            threads_per_step_ms=timing.threads_per_step_ms,
            pipeline_cpu_share=pipeline_share(timing.threads_per_step_ms),
            cache=cache,
            distributed=distributed,
            checkpoints=checkpoints,
            end_of_run_s=end_of_run_s,
            memory=memory,
            advice=None
            if cache is None or spec is None
            else _advice(spec, slow_store, remote_store, batch_size, timing, cache),
        )

    def to_json(self) -> dict:
        """What summary.json holds."""
        return asdict(self)


def _advice(
    spec: ModeSpec, slow_store: bool, remote: bool, batch_size: int, timing: Timing, cache: CacheStats
) -> str | None:
    """The summary's ``advice`` (:func:`bagpipe.cache.advice.run_advice`) for a run with a store."""
    ms = 1000 * batch_size / timing.samples_per_s if timing.samples_per_s > 0 else 0.0
    times = asdict(timing.time_per_step_ms)
    return run_advice(spec, slow_store, ms, times, cache.pipeline_s, cache.steps, remote=remote)
