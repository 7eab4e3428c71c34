"""The parts of the training loop that act every so many steps, each deciding its own cadence.

The loop (:mod:`bagpipe.train.loop`) calls ``maybe(step)`` on each after every step; each
knows when it has something to do:

* :class:`MetricsLogger` -- every :data:`LOG_EVERY` steps, the first and the last: the
  loss over the trainers, samples/s, the progress line, a metrics.jsonl record;
* :class:`Epochs` -- the note that a new epoch begins;
* :class:`Evaluator` -- every ``--eval-every`` steps (not the last: the end of the run
  evaluates): every row final, then an evaluation recorded by the reporter;
* :class:`Checkpointer` -- every ``--checkpoint-every`` steps (not the last: the end of
  the run takes the final one), and the final one on request.

What only the process that writes the run's files does (metrics.jsonl, the heartbeat,
evaluations, the summary) goes through a :class:`Reporter`: a :class:`RunReporter` on
that process, a :class:`NullReporter` (which does nothing) on the others, so that the
loop reads the same on every trainer. :class:`EndClock` times the end of the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Protocol, TypeVar

import bagpipe.phases as phases
from bagpipe.budget.watch import MemoryWatch
from bagpipe.checkpoint import CheckpointFolder, CheckpointWriter, CutTarget, RowSpace
from bagpipe.config.train import TrainConfig
from bagpipe.errors import WriteError
from bagpipe.faults import pause_at
from bagpipe.files import FULL_ERRNOS
from bagpipe.train.evaluate import eval_line
from bagpipe.train.progress import Progress
from bagpipe.train.protocols import PartsWriter
from bagpipe.train.rundir import MetricsLog, RunDir
from bagpipe.train.summary import EndOfRun, StepMeter
from bagpipe.train.tensorboard import Logs, with_tensorboard

log = logging.getLogger(__name__)

LOG_EVERY = 10  # steps between metrics.jsonl records (and progress updates)

T = TypeVar("T")


class Cadence(Protocol):
    """A part of the loop that acts every so many steps."""

    def maybe(self, step: int) -> None:
        """Act if ``step`` (steps done) is one of this part's."""
        ...


class Reporter(Protocol):
    """What only the process that writes the run's files does."""

    @property
    def not_exact(self) -> list[str]:
        """Why the run is not exact, those of the runs it continues included (the summary's
        ``not_exact``); empty where nothing is reported."""
        ...

    def checkpoint_writer(self, space: RowSpace) -> CheckpointWriter | None:
        """What commits the run's checkpoints (rows of ``space``); None: this process does not."""
        ...

    def resumed(self, start: int) -> None:
        """Say that the run continues at ``start``."""
        ...

    def config_later(self, train: dict, model: object, dataset: dict) -> None:
        """The run's config.json, written once start-up is over (:meth:`RunDir.write_config_later`)."""
        ...

    def open(self, start: int) -> None:
        """Open metrics.jsonl for the steps after ``start``."""
        ...

    def stepped(self, step: int) -> None:
        """``step`` steps are done (the heartbeat)."""
        ...

    def record(self, **fields: object) -> None:
        """One metrics.jsonl record (with the run's approximation tags)."""
        ...

    def evaluate(
        self, step: int, evaluation: Callable[[], dict], note: Callable[[str], None] | None = None
    ) -> dict | None:
        """Run ``evaluation`` after ``step`` steps and record it (``note``: say it too)."""
        ...

    def only(self, work: Callable[[], T]) -> T | None:
        """``work()`` here; None where nothing is reported."""
        ...

    def write_summary(self, summary: Callable[[], dict]) -> dict | None:
        """Build the summary, say its advice and write summary.json; returns it."""
        ...

    def close(self) -> None: ...


class NullReporter:
    """The :class:`Reporter` of a process that reports nothing (trainers 1..N-1)."""

    @property
    def not_exact(self) -> list[str]:
        return []

    def checkpoint_writer(self, space: RowSpace) -> CheckpointWriter | None:
        return None

    def resumed(self, start: int) -> None:
        pass

    def config_later(self, train: dict, model: object, dataset: dict) -> None:
        pass

    def open(self, start: int) -> None:
        pass

    def stepped(self, step: int) -> None:
        pass

    def record(self, **fields: object) -> None:
        pass

    def evaluate(
        self, step: int, evaluation: Callable[[], dict], note: Callable[[str], None] | None = None
    ) -> dict | None:
        return None

    def only(self, work: Callable[[], T]) -> T | None:
        return None

    def write_summary(self, summary: Callable[[], dict]) -> dict | None:
        return None

    def close(self) -> None:
        pass


class RunReporter:
    """The :class:`Reporter` of the process that writes the run folder ``run``."""

    def __init__(self, run: RunDir, cfg: TrainConfig):
        self.run, self.cfg = run, cfg
        self._not_exact = cfg.not_exact
        self.tags = self._tags()
        self.start = 0
        self.metrics: MetricsLog | Logs | None = None
        self._said_no_eval = False  # the note that there is no eval split, said once

    @property
    def not_exact(self) -> list[str]:
        return list(self._not_exact)

    def _tags(self) -> dict:
        """What every metrics record of a run that is not exact carries."""
        if not self._not_exact:
            return {}
        approx = self.cfg.approximations
        return {"exact": False, **({"approximation": approx} if approx else {}), "not_exact": self.not_exact}

    def checkpoint_writer(self, space: RowSpace) -> CheckpointWriter | None:
        return CheckpointWriter(CheckpointFolder(self.run.path), self.cfg.run.checkpoint_compact_every, space)

    def resumed(self, start: int) -> None:
        log.info(f"resumed from step {start}")
        # the mode and --init-from-store may change on resume: the parameters keep what the
        # earlier runs did (config.json still holds the last one's lines here)
        for line in earlier_not_exact(self.run):
            if line not in self._not_exact:
                self._not_exact.append(line)
        self.tags = self._tags()

    def config_later(self, train: dict, model: object, dataset: dict) -> None:
        # written by the first step's heartbeat: a refusal before it leaves the folder as it was
        self.run.write_config_later(train, model, dataset, self.not_exact)

    def open(self, start: int) -> None:
        self.start = start
        self.metrics = with_tensorboard(self.run.metrics(since=start), self.cfg.run.tensorboard, since=start)

    def stepped(self, step: int) -> None:
        self.run.heartbeat(step)
        if step == self.start + 1:
            phases.report(self.run.path)  # a restarted job: where the seconds since the failure went

    def record(self, **fields: object) -> None:
        assert self.metrics is not None, "open() first"
        self.metrics.write(**fields, **self.tags)

    def evaluate(
        self, step: int, evaluation: Callable[[], dict], note: Callable[[str], None] | None = None
    ) -> dict | None:
        ev = evaluation()
        self.record(step=step, **ev)
        if not ev.get("eval_samples"):  # no eval split: said at the first evaluation, not at every one
            said = self._no_eval_split(step, periodic=note is not None)
            if said is not None:
                (note or log.info)(said)
            return ev
        if note is not None:
            note(f"step {step}: {eval_line(ev)}")
        return ev

    def _no_eval_split(self, step: int, periodic: bool) -> str | None:
        """The note, once, that the options asking for evaluations (--eval-every at a
        ``periodic`` one, --eval-samples N at any) evaluate nothing: there is no eval split."""
        if self._said_no_eval:
            return None
        n = self.cfg.run.eval_samples
        asked = (["--eval-every"] if periodic else []) + ([f"--eval-samples {n}"] if n else [])
        if not asked:  # the final evaluation of a run that asked for none: the summary says n/a
            return None
        self._said_no_eval = True
        verb = "evaluates" if len(asked) == 1 else "evaluate"
        said = f"{self.cfg.data.data} has no eval split, so {' and '.join(asked)} {verb} nothing"
        return f"step {step}: {said} (said once)" if periodic else said

    def only(self, work: Callable[[], T]) -> T | None:
        return work()

    def write_summary(self, summary: Callable[[], dict]) -> dict | None:
        s = summary()
        if s["advice"]:
            log.info(f"advice: {s['advice']}")
        also = self.cfg.run.summary_json
        try:
            self.run.write_summary(s)
        except OSError as e:
            if e.errno not in FULL_ERRNOS:
                raise
            copied = False
            if also:  # on another disk, the figures are still saved
                with suppress(OSError):
                    self.run.copy_summary(s, also)
                    copied = True
            said = summary_not_written(self.run.path, self.cfg.data.data, s, e, also if copied else None)
            raise WriteError(said) from None
        if also:
            self.run.copy_summary(s, also)
        return s

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()


def earlier_not_exact(run: RunDir) -> list[str]:
    """The ``not_exact`` lines of the run that ``run``'s config.json records (one written
    before that field existed: those its settings give); [] when there is none to read."""
    if not run.config_file.is_file():
        return []
    conf = run.read_config()
    if "not_exact" in conf:
        return list(conf["not_exact"])
    return TrainConfig.from_json(conf["train"], source=str(run.config_file)).not_exact


def summary_not_written(run: Path, data: str, s: dict, e: OSError, copied: str | None) -> str:
    """The one line of a run whose summary.json met a full disk after its last step: the
    file, whether its final checkpoint is intact (else the last intact one and the steps
    ``--resume`` retrains), and where its figures went (``copied``: --summary-json); ``data``:
    the run's data set."""
    steps, last = s["steps"], (s.get("checkpoints") or {}).get("last_step")
    where = run / "checkpoints"
    said = f"cannot write {e.filename} ({e.strerror or e}), so "
    said += f"this run's figures are only in {copied}" if copied else "this run's figures are not saved"
    if last == steps:
        return (
            said + f"; nothing trained is lost: its final checkpoint (step {steps}) is intact in {where} "
            f"(free some space, then `bagpipe eval --run {run} --data {data}` evaluates it and `bagpipe train --resume` "
            "with a larger --steps continues it)"
        )
    final = [h for h in (s.get("checkpoints") or {}).get("history") or [] if h.get("step") == steps]
    if final and final[-1].get("failed"):
        said += f", and its final checkpoint (step {steps}) was not written either"
    if last:
        return (
            said + f"; the last intact checkpoint is step {last} in {where}: free some space, then train again "
            f"with --resume (it retrains steps {last + 1}..{steps})"
        )
    return said + f"; {run} has no checkpoint: free some space and train it again"


@dataclass
class MetricsLogger:
    """Every ``every`` steps, the first step and the last: the recent loss (averaged over
    the trainers: every trainer takes part), samples/s, the progress line and a record."""

    every: int
    total: int
    start: int
    meter: StepMeter
    mean: Callable[[list[float]], float]
    """The topology's mean over the trainers (a collective)."""
    rates: Callable[[int], dict]
    """The learning rates of a 0-based step, for the record."""
    progress: Progress
    watch: MemoryWatch
    reporter: Reporter

    def maybe(self, step: int) -> None:
        if not (step % self.every == 0 or step == self.total or step == self.start + 1):
            return
        self.watch.mark(step)
        recent = self.mean(self.meter.losses[-self.every :])
        sps = self.meter.samples_per_s()
        self.progress.show(step, recent, sps)
        self.reporter.record(step=step, loss=recent, samples_per_s=sps, **self.rates(step - 1))


#: About how many epoch lines a run prints at most: every epoch's when there are few,
#: else the first's and then every k-th's (k a round number): 250 short epochs say 6.
EPOCH_LINES = 5


def epoch_stride(epochs: int) -> int:
    """k: after the first, every k-th epoch's beginning is noted (1, 2, 5, 10, 20, 50, ...),
    so that a run of ``epochs`` epochs prints about :data:`EPOCH_LINES` lines at most."""
    k, i = 1, 0
    while epochs > k * EPOCH_LINES:
        k = round(k * (2, 2.5, 2)[i % 3])  # 1, 2, 5, 10, 20, 50, 100, ...
        i += 1
    return k


@dataclass
class Epochs:
    """The note that a new epoch begins (after the last batch of the train split): every
    epoch's when the run has few, else the second's and every k-th (:func:`epoch_stride`)."""

    batches_per_epoch: int
    total: int
    progress: Progress

    def resumed(self, start: int) -> None:
        """A run resumed at ``start`` (0: a new run, whose first epoch is not noted): an
        epoch that begins right there is noted now, as an uninterrupted run noted it after
        step ``start`` (the run that saved that checkpoint ended there, before noting it)."""
        if start:
            self.maybe(start)

    def maybe(self, step: int) -> None:
        n = self.batches_per_epoch
        if step % n or step >= self.total:
            return
        epoch, epochs = step // n + 1, -(-self.total // n)
        k = epoch_stride(epochs)
        if epoch > 2 and epoch % k:
            return
        if epoch > 2:
            self.progress.note(f"epoch {epoch} of {epochs} begins at step {step + 1}")
            return
        why = f"the train split holds {n} batches; each epoch reshuffles its blocks"
        if k > 1:
            nth = {1: "st", 2: "nd", 3: "rd"}.get(k % 10 if k % 100 not in (11, 12, 13) else 0, "th")
            why += f"; {epochs} epochs in all, every {k}{nth} is noted"
        self.progress.note(f"epoch {epoch} begins at step {step + 1} ({why})")


@dataclass
class Evaluator:
    """Every ``every`` steps but the last (0: never): every row final and in the store
    (every trainer), then the evaluation, recorded by the reporter."""

    every: int
    total: int
    settle: Callable[[int], None]
    evaluation: Callable[[], dict]
    reporter: Reporter
    note: Callable[[str], None]

    def maybe(self, step: int) -> None:
        if self.every and step % self.every == 0 and step < self.total:
            self.settle(step)
            self.reporter.evaluate(step, self.evaluation, self.note)


@dataclass
class Checkpointer:
    """Every ``every`` steps but the last (0: never), and the final checkpoint by
    :meth:`cut`. Every trainer takes part in a cut; the one with a ``writer`` commits it
    (:mod:`bagpipe.checkpoint.writer`: its files are written in the background)."""

    every: int
    total: int
    writer: CheckpointWriter | None
    """None on a trainer that takes part in the cut but writes nothing."""
    finish_rows: Callable[[], None]
    """Deferred row work done: every row final."""
    cut_rows: Callable[[int, CutTarget | None], PartsWriter | None]
    """The topology's cut of the rows (:meth:`~bagpipe.train.protocols.Topology.checkpoint_cut`)."""
    dense_state: Callable[[int], dict]
    """The dense state after a step, copied to the host."""

    def maybe(self, step: int) -> None:
        if self.every and step % self.every == 0 and step < self.total:
            self.cut(step)  # the cut: its time is in samples_per_s, the write runs meanwhile

    def cut(self, step: int) -> None:
        """The cut of the checkpoint of ``step``: what it needs is copied now."""
        t0 = time.perf_counter()
        writer = self.writer
        if writer is not None:
            writer.wait()  # the previous checkpoint is written (in a run that checkpoints every few minutes: long ago)
        pause_at("cut", step)  # a test changes the world here (fills the disk)
        self.finish_rows()
        target = writer.begin(step) if writer is not None else None
        write_parts = self.cut_rows(step, target)
        if writer is None:
            return
        assert target is not None and write_parts is not None
        writer.submit(target, self.dense_state(step), write_parts, time.perf_counter() - t0)

    def wait(self) -> None:
        """Until the last checkpoint is written and committed."""
        if self.writer is not None:
            self.writer.wait()

    def abandon(self) -> None:
        """The run failed: its last complete checkpoint is what survives."""
        if self.writer is not None:
            self.writer.close(abandon=True)


_END_PHASES = frozenset(f.name for f in fields(EndOfRun)) - {"total"}


class EndClock:
    """The end of a run, timed in one place: each named :meth:`phase` is one of
    :class:`~bagpipe.train.summary.EndOfRun`'s fields; ``total`` runs from the clock's
    start (the end of the last step) to :meth:`result`. A phase skipped stays 0."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self._end = EndOfRun()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in _END_PHASES:
            raise ValueError(f"{name!r} is not a phase of the end of a run ({sorted(_END_PHASES)})")
        t0 = time.perf_counter()
        yield
        setattr(self._end, name, time.perf_counter() - t0)

    def result(self) -> EndOfRun:
        self._end.total = time.perf_counter() - self._t0
        return self._end
