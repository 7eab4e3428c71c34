"""A run's checkpoints folder: begin, commit, find the latest, keep what is needed.

Writing a checkpoint of step K is one sequence for every topology
(:mod:`bagpipe.checkpoint.writer`: the cut at the step, then the files in the background)::

    kind, base, chain = ckpts.next_kind(compact_every)
    staging = ckpts.begin(K)              # RUN/checkpoints/.tmp-step-K/ (a fresh, empty folder)
    ...every part's writer fills staging (parts.write_part), trainer 0 writes dense.pt...
    ckpts.commit(staging, manifest)       # MANIFEST.json, rename, LATEST, prune

Only :meth:`commit` makes a checkpoint count: it writes MANIFEST.json (atomically,
after every part is fsynced by its writer), renames the folder into place, fsyncs the
parent, then replaces LATEST atomically. A crash at any point leaves LATEST naming the
previous complete checkpoint; leftover ``.tmp-*`` folders are removed by the next
commit. :meth:`prune` keeps the newest ``keep`` checkpoints and every checkpoint their
delta chains rest on.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from bagpipe.checkpoint.format import DENSE, LATEST, MANIFEST, Kind, Manifest, is_step_name, step_name
from bagpipe.checkpoint.reader import CheckpointReader
from bagpipe.checkpoint.verify import FileSum, SummingFile, check_file, remember
from bagpipe.errors import CheckpointError
from bagpipe.files import RUN_RECORDS, atomic_write_text, fsync_dir

KEEP = 2


@dataclass
class Checkpoint:
    """A complete checkpoint: its folder, manifest and dense state."""

    path: Path
    manifest: Manifest
    dense: dict

    @property
    def step(self) -> int:
        return self.manifest.step

    def reader(self) -> CheckpointReader:
        return CheckpointReader(self.path)


def latest(run_dir: str | os.PathLike) -> Checkpoint | None:
    """The newest complete checkpoint of the run in ``run_dir`` (None: it has none)."""
    return CheckpointFolder(run_dir).latest()


def load_dense(path: Path) -> dict:
    """dense.pt, loaded so that it cannot run code (tensors, numbers and containers only)."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a corrupt or foreign file
        found = re.search(r"unsupported GLOBAL (\S+)", str(e))
        if found:
            raise CheckpointError(
                f"{path}: unreadable: it holds {found.group(1)}, which a bagpipe checkpoint never does; "
                "refusing to load it (it could run code)"
            ) from None
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{path}: unreadable ({first})") from None


_STEP = re.compile(r"step-\d{8}")


class CheckpointFolder:
    """``RUN/checkpoints``."""

    def __init__(self, run_dir: str | os.PathLike):
        self.root = Path(run_dir) / "checkpoints"

    def latest_name(self) -> str | None:
        latest = self.root / LATEST
        if latest.is_dir():  # a file replaced by a folder: said so, with the newest intact checkpoint
            self._refuse_latest("is a folder where a file is expected", first=f"move the folder {LATEST} away, then ")
        return latest.read_text().strip() if latest.exists() else None

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint, or None when the run has none (its dense.pt
        checked against the manifest; its rows are checked when read: :meth:`Checkpoint.reader`)."""
        name = self.latest_name()
        if name is None:
            done = self.complete()
            if done:  # LATEST lost while checkpoints are there: no checkpoint would be a wrong answer (round 19)
                raise CheckpointError(
                    f"{self.root / LATEST} is missing, yet {len(done)} complete checkpoint(s) are there (the newest "
                    f"{done[-1]}): restore it with `echo {done[-1]} > {shlex.quote(str(self.root / LATEST))}`"
                )
            return None
        self.check_latest(name)
        path = self.root / name
        if not path.is_dir():
            raise CheckpointError(f"{self.root / LATEST} names {name}, which is missing or incomplete")
        return self.load(name)

    def load(self, name: str) -> Checkpoint:
        """The complete checkpoint ``name`` (a ``step-NNNNNNNN`` folder), its dense.pt checked."""
        path = self.root / name
        manifest = Manifest.load(path)
        if manifest.dense_sum is not None:
            check_file(path / DENSE, manifest.dense_sum)
        dense = load_dense(path / DENSE)
        return Checkpoint(path=path, manifest=manifest, dense=dense)

    def complete(self) -> list[str]:
        """The complete checkpoints' folder names (those with a manifest), oldest first."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.glob("step-*") if is_step_name(p.name) and (p / MANIFEST).exists())

    def verified(self, name: str) -> Checkpoint:
        """The checkpoint ``name``, every file it and its chain hold checked (a one-line
        CheckpointError naming the first damaged file otherwise)."""
        ckpt = self.load(name)
        ckpt.reader()
        return ckpt

    def check_latest(self, name: str) -> None:
        """LATEST's text ``name`` names a checkpoint folder (step-NNNNNNNN), or a one-line
        CheckpointError saying what is wrong with LATEST and offering the newest intact
        checkpoint. Reads only."""
        if _STEP.fullmatch(name):
            return
        self._refuse_latest(
            "is empty: it names no checkpoint" if not name else f"names {name[:40]!r}, not a checkpoint (step-NNNNNNNN)"
        )

    def _refuse_latest(self, what: str, first: str = "") -> None:
        """A one-line CheckpointError: LATEST ``what``, and the newest intact checkpoint offered
        (``first``: what to do before resuming from it)."""
        newest = self.intact_before(None)
        offer = (
            f"the newest intact checkpoint is {newest.path.name} (step {newest.step}): {first}`bagpipe train ... "
            f"--resume --resume-from {newest.path.name}` continues from it and makes {LATEST} name it"
            if newest is not None
            else "no checkpoint of the run is intact: start it again with another --out"
        )
        raise CheckpointError(
            f"{self.root / LATEST} {what} (a damaged run folder); {offer} (nothing in the run folder was changed)"
        )

    def intact_before(self, name: str | None) -> Checkpoint | None:
        """The newest complete checkpoint older than ``name`` (None: of all) whose every
        file (and its chain's) is whole, or None. Reads only; changes nothing."""
        for older in reversed([n for n in self.complete() if name is None or n < name]):
            try:
                return self.verified(older)
            except CheckpointError:
                continue
        return None

    def staging(self, step: int) -> Path:
        """Where the checkpoint of ``step`` is staged (:meth:`begin` makes it)."""
        return self.root / f".tmp-{step_name(step)}"

    def begin(self, step: int) -> Path:
        """An empty staging folder for the checkpoint of ``step``."""
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.staging(step)
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
        return staging

    def next_kind(self, compact_every: int) -> tuple[Kind, str | None, int]:
        """(kind, base, chain length) of the next checkpoint: a delta on the latest
        complete one (``base``), or full when its chain reached ``compact_every`` -- then
        ``base`` names the checkpoint to merge it from -- or when there is none (base None)."""
        name = self.latest_name()
        if name is None:
            return "full", None, 0
        try:
            prev = Manifest.load(self.root / name)
        except CheckpointError:
            return "full", None, 0
        chain = prev.chain + 1
        if compact_every <= 1 or chain >= compact_every:
            return "full", name, 0
        return "delta", name, chain

    @staticmethod
    def write_dense(staging: Path, dense: dict) -> FileSum:
        """dense.pt, fsynced; through a Python file, so that a full disk is an OSError (ENOSPC).
        Returns its size and CRC-32, summed as it was written."""
        with open(staging / DENSE, "wb") as raw:
            f = SummingFile(raw)
            torch.save(dense, f)  # a writable file-like object is all torch.save needs
            raw.flush()
            os.fsync(raw.fileno())
        s = f.sum()
        remember(staging / DENSE, s)
        return s

    def commit(self, staging: Path, manifest: Manifest) -> Path:
        """Make the staged checkpoint count (see the module docstring); returns its folder."""
        manifest.check_parts(staging)
        if not (staging / DENSE).exists():
            raise CheckpointError(f"{staging}: no {DENSE}")
        manifest.save(staging)
        final = self.root / step_name(manifest.step)
        if final.exists():
            shutil.rmtree(final)
        os.rename(staging, final)
        fsync_dir(self.root)
        atomic_write_text(self.root / LATEST, final.name + "\n")
        self.prune()
        return final

    def discard(self, staging: Path) -> None:
        """Remove an unfinished checkpoint's folder (it failed; the latest stays as it was)."""
        shutil.rmtree(staging, ignore_errors=True)

    def prune(self, keep: int = KEEP) -> None:
        """Remove leftovers of unfinished checkpoints and checkpoints nothing needs."""
        latest = self.latest_name()
        complete = self.complete()
        needed: set[str] = set()
        for top in complete[-keep:] + ([latest] if latest else []):
            name: str | None = top
            while name and name not in needed:  # the checkpoint and the chain under it
                needed.add(name)
                try:
                    name = Manifest.load(self.root / name).base
                except CheckpointError:
                    break
        for p in self.root.iterdir():
            # only the names a checkpoint takes: a user's step-00000010.bak is theirs (newcomer round 19)
            stale_tmp = p.name.startswith(".tmp-") and is_step_name(p.name.removeprefix(".tmp-"))
            if (is_step_name(p.name) and p.name not in needed) or stale_tmp:
                shutil.rmtree(p, ignore_errors=True)


def where_to_continue(out: str) -> str:
    """Where a stopped run (the run folder ``out``) can continue from, in the one sentence a
    stopped one-process run and a stopped local job both print: its latest checkpoint and
    ``--resume``, or that it has none."""
    try:
        name = CheckpointFolder(out).latest_name()
    except Exception:  # noqa: BLE001 - a damaged folder: --resume says what is wrong
        name = None
    if name is None:
        # a run that got past its start left its records, and a new run refuses such a folder
        # (bagpipe.train.resume.refuse_overwrite): starting over means removing them first
        if any((Path(out) / f).exists() for f in RUN_RECORDS):
            store = _store_it_made(Path(out))  # a --store-dir the run filled: a new run refuses it too
            also = f" and the store it made (rm -r {shlex.quote(store)})" if store else ""
            return (
                f"{out} has no checkpoint: to start over, remove it (rm -r {shlex.quote(str(out))}){also} and run "
                "the command again, or give another --out"
            )
        return f"{out} has no checkpoint: run the command again to start over"
    step = int(name.rsplit("-", 1)[-1]) if name.startswith("step-") else None
    at = f"step {step}" if step is not None else name
    return f"its latest checkpoint is {at} in {out}/checkpoints: run the same command with --resume to continue from it"


def stopped_by(e: KeyboardInterrupt) -> str:
    """How ``e`` stopped a run: ``stopped by SIGTERM`` (a :class:`bagpipe.lifeline.Terminated`,
    which carries its signal), else ``interrupted`` (Ctrl-C)."""
    import signal

    signum = getattr(e, "signum", None)
    return f"stopped by {signal.Signals(signum).name}" if signum is not None else "interrupted"


def _store_it_made(out: Path) -> str | None:
    """The ``--store-dir`` a run folder's config.json names, where the run made its store
    (not one it started from, ``--init-from-store``) and a store is there; else None."""
    import json

    try:
        cache = json.loads((out / "config.json").read_text())["train"]["cache"]
        given, started_from = cache.get("store_dir"), cache.get("init_from_store")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not given or started_from or not (Path(given) / "header.json").is_file():
        return None
    return str(given)
