"""A folder bagpipe writes whole (a dataset, an export): built beside its target and
swapped in only when complete, and replaced only where everything in it is bagpipe's.

The life of ``OutputDir(target, ...)``:

1. :meth:`OutputDir.open` checks everything before any folder changes: the target is a
   directory or nothing (``-``, standard output elsewhere, is refused); it lies inside no
   data set or export (nor among a run's files: :func:`~bagpipe.files.bagpipe_folder`,
   :func:`~bagpipe.files.enclosing_output`) and is no output of another kind (an
   export over a data set); no input lies inside it; if it already holds a finished output
   it is replaced only with ``overwrite``, and only when every file in it is one this
   output wrote (its manifest, ``.bagpipe-files.json``) -- a note, a sub-folder, a run
   or a raw log someone put there makes ``--overwrite`` refuse, naming it; a non-empty
   folder that holds no output is never written into. Then it takes the target's lock
   (``.NAME.lock`` beside it, held until :meth:`close`; a second writer of the same
   target is refused naming the holder) and makes the staging folder
   ``.NAME.partial-PID`` beside the target, where everything is written -- inside the
   target when it is an existing empty folder (perhaps a mounted volume's root, where a
   folder beside it lies on another file system and the final rename would cross
   devices). A folder where nothing can be written is refused in one line first. Until
   :meth:`close`, SIGTERM and SIGHUP (and SIGINT, even inherited ignored by a background
   job) unwind the writer as Ctrl-C does (:func:`bagpipe.lifeline.stop_cleanly`), and a
   write the file system refuses (full, read-only) leaving the ``with`` block becomes a
   one-line error naming the target.
2. :meth:`OutputDir.commit` writes the manifest (every file of the staging folder), then
   swaps the staging folder in: an atomic exchange (``renameat2(RENAME_EXCHANGE)``)
   where the kernel has it, else the old folder renamed aside and the new one renamed
   in (a crash between the two leaves the old one beside, whole); the old folder is
   removed last. Into an empty target folder (which may be the current one) the
   entries move one by one, the file that marks the output finished last. Replacing a
   folder that holds the current one is refused (it would leave the shell in a removed
   folder).
3. :meth:`OutputDir.close` (or leaving the ``with`` block) removes the staging folder
   if the output was not committed, and the folders above the target that step 1
   created while they are empty: a failed or interrupted build leaves the target and
   the folders around it as they were.

What a killed writer (SIGKILL, a power cut) leaves beside the target -- its staging
folder ``.NAME.partial-PID``, preprocess's spill folders ``.NAME.spill-PID-*`` (its
parsed blocks: tens of GB on a large log) and its lock file -- is recognised by its
name, which carries the writer's pid, and removed by the next writer of the same target
once it holds the lock: the lock is an ``flock`` the kernel drops when its holder dies,
so holding it proves that no writer of that name is still at work. Each removal is said
in one line (``removed the spill folder data/.out.spill-1234 (111 MB) of pid 1234,
which is gone``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from bagpipe.errors import ConfigError, DataError
from bagpipe.files import (
    RunLock,
    atomic_write_text,
    bagpipe_folder,
    check_can_write_in,
    enclosing_output,
    fsync_dir,
    refuse_unnamable,
    write_refused,
)
from bagpipe.lifeline import restore, stop_cleanly

MANIFEST = ".bagpipe-files.json"
#: The folders a writer keeps beside its target: WORD -> (what the removal message calls
#: it, the pattern of the name's tail after ``.NAME.WORD-``): the staging folder
#: ``.NAME.partial-PID``; preprocess's spill ``.NAME.spill-PID-XXXXXXXX``
#: (:func:`tempfile.mkdtemp`'s 8 characters; without ``PID-`` from an older bagpipe).
BESIDE = {
    "partial": ("unfinished {kind}", r"(?P<pid>\d+)"),
    "spill": ("spill folder", r"(?:(?P<pid>\d+)-)?[a-z0-9_]{8}"),
}

#: The file that marks a folder as a data set, a run or an export (as :func:`bagpipe_folder` tells them).
OUTPUT_MARKERS = ("meta.json", "config.json", "model.json")

log = logging.getLogger(__name__)


def inside(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether ``path`` is ``folder`` or lies inside it (symbolic links resolved)."""
    p, f = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return p == f or f in p.parents


def listing(folder: Path) -> list[str]:
    """Every file and folder under ``folder``, as sorted relative paths (folders end in /)."""
    out = []
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        out += [f"{(rel / d).as_posix()}/" for d in dirs] + [(rel / f).as_posix() for f in files]
    return sorted(p[2:] if p.startswith("./") else p for p in out)


def name_outermost(paths: list[str], shown: int = 3) -> tuple[str, str]:
    """Name the outermost of ``paths`` (as :func:`listing` writes them) for a message, each
    folder with the files under it: ``("notes.txt and extra/ (2 files)", "are")``."""
    folders = {p for p in paths if p.endswith("/")}
    outer = [p for p in paths if not any(p != f and p.startswith(f) for f in folders)]

    def name(p: str) -> str:
        if not p.endswith("/"):
            return p
        n = sum(1 for q in paths if q.startswith(p) and not q.endswith("/"))
        return f"{p} ({n:,} file{'' if n == 1 else 's'})"

    named = [name(p) for p in outer[:shown]]
    if len(outer) > shown:
        named.append(f"{len(outer) - shown:,} more")
    text = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    return text, "is" if len(outer) == 1 else "are"


class OutputDir:
    """A whole output folder ``target`` of one ``kind`` ("dataset", "export"), finished
    when ``finished_file`` exists in it (see the module docstring).

    ``inputs``: flag -> paths the command reads; none may lie inside the target.
    ``flag``: the option that names the target, for messages (``--out``).
    """

    def __init__(
        self,
        target: str | os.PathLike,
        kind: str,
        finished_file: str,
        *,
        overwrite: bool = False,
        inputs: dict[str, Iterable] | None = None,
        flag: str = "--out",
    ):
        self.target = Path(target)  # as the user named it, for messages
        # where it is, for renames: "." or a symbolic link is swapped at the folder it names
        self.path = Path(os.path.realpath(target))
        self.kind, self.finished_file, self.overwrite, self.flag = kind, finished_file, overwrite, flag
        self.inputs = {k: [Path(p) for p in v if p] for k, v in (inputs or {}).items()}
        self.staging: Path | None = None
        self._lock: RunLock | None = None
        self._made: list[Path] = []  # the folders above the target that open() created
        self._signals: dict | None = None  # the handlers stop_cleanly replaced while open
        self.committed = False

    # -- checks -------------------------------------------------------------------------
    def check(self) -> None:
        """Every refusal, before anything changes (see the module docstring)."""
        t, flag = self.target, self.flag
        a = f"a{'n' if self.kind[0] in 'aeiou' else ''} {self.kind}"
        if str(t) == "-":  # predict --out - is standard output; a folder cannot be
            raise ConfigError(f"{flag} -: {a} is written as a folder, not to standard output; give the folder to write")
        refuse_unnamable(t, flag)
        if t.exists() and not t.is_dir():
            raise DataError(f"{flag} {t}: exists and is not a directory")
        owner = bagpipe_folder(t)  # a data set (or run, export) the target would sit among the files of
        if owner is None:  # or anywhere inside an export (the export's --overwrite would refuse it)
            found = enclosing_output(self.path.parent)
            owner = None if found is None else f"the {found[0]} {found[1]}"
        if owner is not None:
            raise ConfigError(
                f"{flag} {t} lies inside {owner}: {a} is not written inside it; choose a {flag} outside it"
            )
        other = self.other_output()
        if other is not None:
            raise ConfigError(f"{flag} {t} is {other}: {a} is not written over it; choose another {flag}")
        for opt, paths in self.inputs.items():
            for p in paths:
                if t.exists() and inside(p, t):
                    raise ConfigError(
                        f"{opt} {p} lies inside {flag} {t}, which this command replaces as a whole; "
                        f"move it out or choose another {flag}"
                    )
        if not t.exists() or self.empty_target():
            return
        if not (t / self.finished_file).exists():
            raise DataError(
                f"{t}: directory is not empty and holds no {self.kind}; refusing to write into it "
                f"(choose another {flag})"
            )
        if not self.overwrite:
            raise DataError(
                f"{t}: already holds a{'n' if self.kind[0] in 'aeiou' else ''} {self.kind} "
                "(pass --overwrite to replace it)"
            )
        if os.path.ismount(self.path):
            raise ConfigError(
                f"{flag} {t} is a mount point (a volume's root), which --overwrite cannot swap for a new "
                f"{self.kind}; remove the old {self.kind}'s files from it yourself, or write to a folder inside it"
            )
        if inside(os.getcwd(), self.path):
            raise ConfigError(
                f"{flag} {t} is (or holds) the current folder, which --overwrite replaces as a whole; "
                "run the command from outside it"
            )
        foreign = self.foreign()
        if foreign:
            names, verb = name_outermost(foreign)
            raise DataError(
                f"{t}: --overwrite replaces only what bagpipe wrote there, and {names} {verb} not "
                f"part of the {self.kind}; move {'it' if verb == 'is' else 'them'} out (or remove the folder "
                "yourself) and run again"
            )

    def empty_target(self) -> bool:
        """Whether the target is an existing folder that holds nothing (but the staging
        folders of writers of it: see :meth:`stage_in`)."""
        if not self.path.is_dir():
            return False
        pattern = self._staging_pattern()
        return all(pattern.fullmatch(p.name) and p.is_dir() for p in self.path.iterdir())

    def _staging_pattern(self) -> re.Pattern:
        return re.compile(rf"\.{re.escape(self.path.name)}\.partial-{BESIDE['partial'][1]}")

    def stage_in(self) -> Path:
        """The folder the staging folder is made in: the target itself when it is an
        existing empty folder -- perhaps the root of a volume mounted there, where a folder
        made beside it would lie on another file system, and moving the files in would
        cross devices -- else the folder that holds the target."""
        return self.path if self.empty_target() else self.path.parent

    def check_space(self, need: int, detail: str, fix: str) -> None:
        """Refuse, in one line and before anything is written, an output of about ``need``
        bytes that the file system it is staged on has no room for (``detail``: how the
        size was found; ``fix``: what else the user can do)."""
        where = self.stage_in()
        while not where.exists():
            where = where.parent
        check_can_write_in(where, f"{self.flag} {self.target}")  # /proc has no room, and is not the reason
        free = shutil.disk_usage(where).free
        if need > free:
            raise ConfigError(
                f"{self.flag} {self.target}: this {self.kind} needs about {human_bytes(need)} ({detail}) but {where} "
                f"has {human_bytes(free)} free; free some space, choose another {self.flag}, or {fix}"
            )

    def other_output(self) -> str | None:
        """The data set, run or export of another kind the target is ("the data set D"), or None."""
        for marker in OUTPUT_MARKERS:
            if marker != self.finished_file and (self.target / marker).is_file():
                return bagpipe_folder(self.target / marker)
        return None

    def foreign(self) -> list[str]:
        """What the target holds that its manifest does not list (everything, without one)."""
        try:
            written = set(json.loads((self.target / MANIFEST).read_text())["files"])
        except (OSError, ValueError, KeyError, TypeError):
            return [f"{MANIFEST} (the list of files bagpipe wrote, missing or unreadable)"]
        return [p for p in listing(self.target) if p != MANIFEST and p not in written]

    # -- life ---------------------------------------------------------------------------
    def open(self) -> Path:
        """Check, lock, and make the staging folder; returns it (write everything there)."""
        self.check()
        parent = self.path.parent
        self._made = [p for p in (parent, *parent.parents) if not p.exists()]  # deepest first
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{self.flag} {self.target}: cannot create {parent} ({e.strerror})") from None
        try:
            for folder in dict.fromkeys([parent, self.stage_in()]):  # the lock's, the staging folder's
                check_can_write_in(folder, f"{self.flag} {self.target}")
        except BaseException:
            self.close()
            raise
        name = self.path.name
        self._lock = RunLock(
            parent / f".{name}.lock",
            what=f"{self.flag} {self.target}",
            hint=f"wait for it to end or choose another {self.flag}",
        )
        try:
            self._lock.acquire()
        except BaseException as e:
            self._lock = None
            self.close()
            refused = write_refused(e, f"the {self.kind} {self.target}", self.flag)
            if refused is not None:  # a full disk: the lock's record could not be written (it was ours)
                (parent / f".{name}.lock").unlink(missing_ok=True)
                raise refused from None
            raise
        try:
            self._signals = stop_cleanly()  # SIGTERM too removes what is unfinished, as Ctrl-C does
            self.check()  # again, now that no other writer of this target can change it
            self.remove_left_behind()
            self.staging = self.stage_in() / f".{name}.partial-{os.getpid()}"
            self.staging.mkdir()
        except BaseException as e:
            self.close()
            refused = write_refused(e, f"the {self.kind} {self.target}", self.flag)
            if refused is not None:
                raise refused from None
            raise
        return self.staging

    def left_behind(self) -> list[tuple[Path, str, int | None]]:
        """The folders beside the target that a writer of it keeps while it works
        (``.NAME.partial-PID``, ``.NAME.spill-PID-*``; see :data:`BESIDE`), as (path, what
        it is, the writer's pid -- None for a name without one, an older bagpipe's)."""
        name = self.path.name
        found = []
        for word, (what, tail) in BESIDE.items():
            pattern = re.compile(rf"\.{re.escape(name)}\.{word}-{tail}")
            # staging folders are made inside an empty target too (see stage_in)
            folders = [self.path.parent] + ([self.path] if word == "partial" and self.path.is_dir() else [])
            for p in sorted(p for f in folders for p in f.glob(f".{glob_escape(name)}.{word}-*")):
                m = pattern.fullmatch(p.name)
                if m and p.is_dir() and not p.is_symlink() and p != self.staging:
                    pid = m.group("pid")
                    found.append((p, what.format(kind=self.kind), int(pid) if pid else None))
        return found

    def remove_left_behind(self) -> list[Path]:
        """Remove what writers of this target that are gone left beside it (the caller
        holds the lock: no live writer of this target is left), saying each in one line."""
        removed = []
        for p, what, pid in self.left_behind():
            size = _size(p)
            shutil.rmtree(p, ignore_errors=True)
            if p.exists():
                continue
            who = f"pid {pid}, which is gone" if pid is not None else "an earlier run that is gone"
            log.info(f"removed the {what} {p} ({size / 2**20:,.1f} MB) of {who}")
            removed.append(p)
        return removed

    def commit(self) -> None:
        """Write the manifest and swap the finished staging folder in for the target."""
        assert self.staging is not None, "open() first"
        files = [p for p in listing(self.staging) if p != MANIFEST]
        atomic_write_text(
            self.staging / MANIFEST, json.dumps({"kind": self.kind, "files": files}, indent=1, allow_nan=False)
        )
        t = self.path
        if self.staging.parent == t:  # staged inside the empty target: the entries move up, finished last
            others = [p.name for p in t.iterdir() if p != self.staging]
            if others:
                raise DataError(
                    f"{t}: {others[0]} appeared in it while the {self.kind} was written; the {self.kind} is not "
                    f"written among other files: move them out and run again"
                )
            for p in sorted(self.staging.iterdir(), key=lambda p: p.name == self.finished_file):
                os.rename(p, t / p.name)
            self.staging.rmdir()
        elif not t.exists():
            os.rename(self.staging, t)
        elif not any(t.iterdir()):  # an empty folder (perhaps the current one) is kept: the entries move in
            entries = sorted(self.staging.iterdir(), key=lambda p: p.name == self.finished_file)  # finished last
            for p in entries:
                os.rename(p, t / p.name)
            self.staging.rmdir()
        elif _exchange(self.staging, t):
            shutil.rmtree(self.staging)  # now the old folder
        else:
            aside = t.parent / f".{t.name}.old-{os.getpid()}"
            os.rename(t, aside)
            os.rename(self.staging, t)
            shutil.rmtree(aside)
        fsync_dir(t.parent)
        self.staging = None
        self.committed = True

    def close(self) -> None:
        """Remove an uncommitted staging folder, release the lock, and remove the folders
        above the target that :meth:`open` created if the output was not committed and
        they are still empty (idempotent)."""
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None
        restore(self._signals)
        self._signals = None
        if self._lock is not None:
            try:  # removed while still held: the lock file exists only while a writer works
                self._lock.path.unlink()
            except OSError:
                pass
            self._lock.release()
            self._lock = None
        if not self.committed:
            for folder in self._made:
                try:
                    folder.rmdir()  # only an empty one: whatever another process put there stays
                except OSError:
                    break
        self._made = []

    def __enter__(self) -> Path:
        return self.open()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()
        refused = write_refused(exc, f"the {self.kind} {self.target}", self.flag)
        if refused is not None:  # a full disk, a volume made read-only: one line, the target as it was
            raise refused from None


def human_bytes(n: int) -> str:
    """Bytes for a person: 712 KiB, 3.4 MiB, 1.25 GiB."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n / 2**10:,.0f} KiB"


def glob_escape(name: str) -> str:
    """``name`` with glob's special characters taken literally."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def _size(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders atomically (Linux ``renameat2``); False where it is not available."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    AT_FDCWD = -100
    rc = fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0
