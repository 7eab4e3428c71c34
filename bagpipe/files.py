"""Durable files: a write either happens completely or not at all, and survives a crash;
and :class:`RunLock`, one user of a folder at a time.

The module is long because every output's guards live beside the writers they guard (what
a whole output is, what replaces only its own, links followed), so that one reading shows
every rule a write obeys."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bagpipe.errors import ConfigError
from bagpipe.lifeline import restore, start_time, stop_cleanly

log = logging.getLogger(__name__)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write a text file so that readers see either the old or the new content."""
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` so that readers see either the old or the new content; a device, a name in
    /dev or /proc, this process's stdout/stderr directly (:func:`written_directly`); a link's target."""
    path = Path(path)
    direct = written_directly(path, "wb")
    if direct is not None:
        with direct as f:
            f.write(data)
        return
    path = through_link(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)  # never a temporary file left beside the target
        name_the_target(e, path, tmp)
        raise
    fsync_dir(path.parent)


def through_link(path: Path) -> Path:
    """The file a write of ``path`` replaces: itself, or the file a symbolic link (dangling
    too) names, as ``>`` writes; a rename onto the link replaced it (newcomer round 18).
    A loop of links is an ``OSError`` (ELOOP) naming ``path``: it names no file to write
    (the loop's link was replaced by a regular file; newcomer round 21)."""
    if not path.is_symlink():
        return path
    if is_link_loop(path):
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))
    return Path(os.path.realpath(path))


def is_link_loop(path: str | os.PathLike) -> bool:
    """Whether ``path`` (or a folder above it) is a symbolic link that never reaches a file
    or folder: its links lead back to themselves."""
    try:
        os.stat(path)
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


#: What a path may hold (Linux's NAME_MAX and PATH_MAX; most file systems take no more).
NAME_MAX, PATH_MAX = 255, 4096
TOO_LONG = "a name in it is longer than the file system takes (255 bytes a name, 4,096 a path)"


def shown_path(path: str | os.PathLike) -> str:
    """``path`` for a message, each name over 40 bytes shortened to its start and its size."""
    return "/".join(
        p if len(p.encode()) <= 40 else f"{p[:20]}...({len(p.encode()):,} bytes)" for p in str(path).split("/")
    )


def refuse_unnamable(path: str | os.PathLike, flag: str) -> None:
    """Refuse, in one line and before anything is made, a ``flag`` path that can name no
    file: its symbolic links form a loop, or a name in it is longer than a file system
    takes (newcomer round 21: tracebacks, or the folders above it made and left), or it
    holds a NUL byte, which no file name can (a traceback from the first system call)."""
    if "\0" in os.fsdecode(path):
        raise ConfigError(
            f"{flag} {os.fsdecode(path)!r}: a path cannot hold a NUL byte (\\0); give another {flag.split()[0]}"
        )
    if is_link_loop(path):
        raise ConfigError(
            f"{flag} {path} is a symbolic link that never reaches a file or folder (a loop); remove the link or "
            f"give another {flag.split()[0]}"
        )
    text = os.fsencode(path)
    if len(text) >= PATH_MAX or any(len(name) > NAME_MAX for name in text.split(b"/")):
        raise ConfigError(f"{flag} {shown_path(path)}: {TOO_LONG}; give another {flag.split()[0]}")


def standard_fd(path: str | os.PathLike) -> int | None:
    """1 or 2 where ``path`` names this process's own stdout or stderr (/dev/stdout,
    /dev/fd/2, ...), else None."""
    return _STANDARD.get(os.path.abspath(path))


def is_standard_stream(path: str | os.PathLike) -> bool:
    """Whether ``path`` names this process's own stdout or stderr (/dev/stdout, /dev/fd/2, ...)."""
    return standard_fd(path) is not None


def dash_is_stdout(path: str) -> str:
    """``-``, the command line's name for standard output, as /dev/stdout -- which every
    writer here writes through this process's own stream (:func:`written_directly`), so
    ``--out -`` and ``--out /dev/stdout`` are one thing; any other path as it is (a file
    named ``-`` is ``./-``)."""
    return "/dev/stdout" if path == "-" else path


@contextmanager
def _unclosed(stream):
    yield stream
    stream.flush()


def written_directly(path: Path, mode: str):
    """A context manager yielding the open file to write ``path`` through directly, or None
    when ``path`` is an ordinary file name (written under a temporary name and renamed).
    Directly: this process's own stdout/stderr through its open stream (so a shell's `> file`
    or `| cmd` gets every byte in order: a second open would have an offset of its own); a
    device or a pipe (anything existing but a regular file); any name in /dev or /proc --
    never a temporary file and a rename there, which would replace /dev/stdout or /dev/null
    itself (as root it can)."""
    std = standard_fd(path)
    if std is not None:
        stream = sys.stdout if std == 1 else sys.stderr
        return _unclosed(stream.buffer if "b" in mode else stream)
    if (path.exists() and not path.is_file()) or names_dev_or_proc(path):
        return open(path, mode)
    return None


def names_dev_or_proc(path: str | os.PathLike) -> bool:
    """Whether ``path``, as given or with its links resolved, is a name in /dev or /proc:
    written directly (:func:`written_directly`), never replaced by a rename."""
    return any(Path(f(path)).parts[1:2] in (("dev",), ("proc",)) for f in (os.path.abspath, os.path.realpath))


#: Names of this process's standard output and error: a file opened on them anew would
#: have an offset of its own (a shell's `> file` then sees the two writers overwrite each other).
_STANDARD = {f"{d}/{n}": n for d in ("/dev/fd", "/proc/self/fd") for n in (1, 2)} | {"/dev/stdout": 1, "/dev/stderr": 2}


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w"):
    """Write a file that appears only complete: yields an open file beside ``path``
    (``.NAME.tmp-PID``), fsynced and renamed onto ``path`` when the block ends, removed
    if it fails. A device such as /dev/null (anything but a regular file or nothing), or
    any name in /dev or /proc, is written directly; this process's own stdout/stderr
    (/dev/stdout, /dev/fd/2, ...) through its open stream, so a shell's `> file` or `| cmd`
    gets every byte in order; a symbolic link, through to its target. SIGTERM and SIGHUP unwind the writer as Ctrl-C does
    (:func:`bagpipe.lifeline.stop_cleanly`), so they too leave no temporary file."""
    path = Path(path)
    direct = written_directly(path, mode)
    if direct is not None:
        with direct as f:
            yield f
        return
    path = through_link(path)  # written through to the file it names, as `>` does; the link stays
    remove_stale_temporaries(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    signals = stop_cleanly()  # SIGTERM/SIGHUP too remove the unfinished file, as Ctrl-C does
    try:
        with open(tmp, mode) as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)  # held while writing: a later run sees it is not stale
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as e:
        name_the_target(e, path, tmp)
        raise
    finally:
        if tmp.exists():
            tmp.unlink()
        restore(signals)


#: What a file system answers a write it refuses: full, over quota, a file too large, read-only.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
WRITE_ERRNOS = FULL_ERRNOS | {errno.EROFS}


def name_the_target(e: BaseException, path: Path, tmp: Path) -> None:
    """A write error of ``tmp`` (a ``write()`` names no file) reported as one of ``path``,
    the file the user asked for: the command line's one line names it."""
    if isinstance(e, OSError) and e.errno in WRITE_ERRNOS and e.filename in (None, str(tmp)):
        e.filename = str(path)


def write_refused(e: BaseException, what: str, flag: str = "--out") -> ConfigError | None:
    """The one-line error of a write the file system refused (:data:`WRITE_ERRNOS`) while
    ``what`` (``the dataset data/x``) was written, or None for anything else."""
    if not isinstance(e, OSError) or e.errno not in WRITE_ERRNOS:
        return None
    fix = "free some space or choose another" if e.errno in FULL_ERRNOS else "choose another"
    return ConfigError(f"cannot write {what} ({e.strerror or e}); its unfinished files were removed: {fix} {flag}")


def remove_stale_temporaries(path: Path) -> None:
    """Remove the ``.NAME.tmp-PID`` files a killed :func:`atomic_file` writer of ``path``
    left (a ``kill -9`` of ``bagpipe predict`` left its partial output, gigabytes on a
    large log, that nothing removed), saying each in one line. Stale: no process holds
    its lock and its pid runs no more; another writer's live file is kept."""
    prefix = f".{path.name}.tmp-"
    try:
        siblings = [p for p in path.parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return
    for p in siblings:
        try:
            pid = int(p.name[len(prefix) :])
        except ValueError:
            continue  # not one of ours
        if pid == os.getpid() or _pid_alive(pid):
            continue
        try:
            with open(p, "rb") as f:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # its writer is gone: the kernel let go
                size = os.fstat(f.fileno()).st_size
                p.unlink()
        except OSError:
            continue  # held (a writer on another host), or already gone
        log.info(f"removed the unfinished {p} ({size / 2**20:,.1f} MB) of pid {pid}, which is gone")


def check_out_file(
    path: str | os.PathLike,
    flag: str,
    inputs: dict | None = None,
    own: tuple[str, Callable[[Path], bool]] | None = None,
) -> Path:
    """Refuse, in one line and before anything is written, an output file that cannot be
    written whole or would destroy an input: a directory, a path in a folder that does not
    exist, one of the command's inputs (``inputs``: flag -> paths; the same file under
    another name, a hard link, too), a path inside an input folder, or one inside any data
    set or export (:func:`refuse_inside_output`); and, given ``own`` (what the command
    writes, e.g. "an earlier predictions file", and a test of an existing file), an
    existing regular file that is not one (:func:`refuse_foreign_file`). Returns the path.
    This process's own stdout or stderr is written through its open stream
    (:func:`written_directly`): nothing to check, nothing replaced."""
    path = Path(path)
    if is_standard_stream(path):
        return path
    refuse_unnamable(path, flag)
    if path.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; give the file to write")
    parent = path.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {path}: the folder {parent} does not exist")
    if path.is_file():
        owner = bagpipe_folder(path)
        if owner is not None:
            raise ConfigError(
                f"{flag} {path}: the file is part of {owner}; it is not replaced: choose a path outside it"
            )
    check_can_write_in(parent, f"{flag} {path}")
    real = os.path.realpath(path)
    for opt, paths in (inputs or {}).items():
        for p in paths:
            if not p:
                continue
            r = os.path.realpath(p)
            if real == r or same_file(real, r) or (os.path.isdir(r) and real.startswith(r.rstrip(os.sep) + os.sep)):
                what = "is" if real == r else "lies inside" if os.path.isdir(r) else "is the same file as"
                raise ConfigError(
                    f"{flag} {path} {what} {opt} {p}: writing it would destroy an input; choose another {flag}"
                )
    refuse_inside_output(path, flag, "the file")
    if own is not None:
        refuse_foreign_file(path, flag, *own)
    return path


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` are one regular file (one inode: a hard link is the file
    under another name); False where either is not a regular file (a device, a pipe, a
    terminal: two names of one terminal are not an output replacing an input)."""
    try:
        return os.path.isfile(a) and os.path.isfile(b) and os.path.samefile(a, b)
    except OSError:
        return False


def refuse_foreign_file(path: str | os.PathLike, flag: str, what: str, is_own: Callable[[Path], bool]) -> None:
    """The rule of every one-file output: an existing file is replaced only when it is an
    earlier output of the command's own kind (``is_own``, a cheap test of its first
    bytes); anything else -- a user's data, notes, another command's output -- is refused
    in one line naming it (``--out notes.txt: the file exists and is not WHAT; it is not
    replaced: choose another --out``). Nothing to check where nothing is replaced: no file
    there, a device or a pipe, a name in /dev or /proc, this process's own stdout/stderr
    (all written directly, :func:`written_directly`)."""
    path = Path(path)
    if not path.is_file() or is_standard_stream(path) or names_dev_or_proc(path) or is_own(path):
        return
    raise ConfigError(
        f"{flag} {path}: the file exists and is not {what}; it is not replaced: choose another {flag}, "
        "or move the file away first"
    )


def check_can_write_in(folder: Path, what: str) -> None:
    """Refuse, in one line, a folder this process cannot create a file in (read-only, no
    permission, a kernel file system such as /proc): probed with a temporary file, removed."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".bagpipe-probe-"):
            pass
    except OSError as e:
        raise ConfigError(f"{what}: cannot write in {folder} ({e.strerror or e}); choose another path") from None


def bagpipe_folder(path: Path) -> str | None:
    """The bagpipe folder whose own file ``path`` is -- "the data set D" (any file of a folder
    with meta.json), "the run R" (its config.json, summary.json, metrics.jsonl, checkpoints,
    logs or store) or "the export E" (its model.json, safetensors and vocabulary) -- or None
    (a file of the user's own, even one kept in such a folder)."""
    real = Path(os.path.realpath(path))
    for folder in real.parents:
        first = real.relative_to(folder).parts[0]
        kind = whole_output(folder)
        if kind == "data set":
            return f"the data set {folder}"
        if (folder / "config.json").is_file() and first in RUN_FILES:
            return f"the run {folder}"
        if kind == "export" and (first in EXPORT_FILES or first.startswith("embeddings-")):
            return f"the export {folder}"
    return None


def whole_output(folder: Path) -> str | None:
    """The kind of whole output ``folder`` is: "data set" (meta.json), "export" (model.json),
    "disk store" (header.json and rows.f32), "checkpoint" (a run's step-N) or None: folders written
    and replaced (or pruned) as a whole."""
    if (folder / "meta.json").is_file():
        return "data set"
    if (folder / "model.json").is_file():
        return "export"
    if (folder / "header.json").is_file() and (folder / "rows.f32").exists():
        return "disk store"  # its folder holds a store's own files only (newcomer round 19)
    if folder.parent.name == "checkpoints" and folder.name[5:].isdigit() and (folder / "MANIFEST.json").is_file():
        return "checkpoint"  # step-N: pruned whole by its run, with whatever lies in it (round 20)
    return None


def enclosing_output(path: str | os.PathLike) -> tuple[str, Path] | None:
    """The whole output (:func:`whole_output`: (kind, FOLDER), the nearest) that ``path`` is
    or lies anywhere inside, or None. Walks up from ``path`` (links resolved; it need not
    exist yet) to the root, a few stat calls. Nothing is written there: its files would be
    mixed with the output's, and its own writer (``--overwrite``) would refuse it then."""
    real = Path(os.path.realpath(path))
    for folder in (real, *real.parents):
        kind = whole_output(folder)
        if kind is not None:
            return kind, folder
    return None


def refuse_inside_output(path: str | os.PathLike, flag: str, what: str) -> None:
    """Refuse, in one line, an output ``path`` (given as ``flag``) that is or lies inside a
    whole output (:func:`enclosing_output`), naming it; ``what``: what would be written."""
    found = enclosing_output(path)
    if found is None:
        return
    kind, folder = found
    where = "is" if folder == Path(os.path.realpath(path)) else "lies inside"
    then = {
        "disk store": "the store could not be opened again",
        "checkpoint": "its run removes whatever lies in a checkpoint it prunes",
    }.get(kind, "a later --overwrite of it would be refused")
    raise ConfigError(
        f"{flag} {path} {where} the {kind} {folder}: {what} would be mixed with the {kind}'s, and {then}; "
        f"choose a {flag} outside it"
    )


#: A run's records, in the order refusals name them: written only by a run that got past its
#: start (bagpipe.train.rundir.RunDir's config_file, metrics_file, summary_file).
RUN_RECORDS = ("config.json", "metrics.jsonl", "summary.json")
#: A run folder's own files and folders (a user's file beside them is theirs).
RUN_FILES = frozenset({*RUN_RECORDS, "checkpoints", "logs", "store", "events"})


def runs_above(path: str | os.PathLike) -> Iterator[tuple[Path, str | None]]:
    """Every run folder that ``path`` (links resolved; it need not exist) is or lies in,
    nearest first, with the first part of ``path`` inside it (None: ``path`` is the run
    folder). A run folder holds config.json and another of :data:`RUN_FILES`; a config.json
    of the user's own alone is not one."""
    real = Path(os.path.realpath(path))
    for run in (real, *real.parents):
        if (run / "config.json").is_file() and any((run / n).exists() for n in RUN_FILES - {"config.json"}):
            parts = real.relative_to(run).parts
            yield run, parts[0] if parts else None


#: An export's own files (bagpipe/export/write.py), besides its embeddings-*.safetensors.
EXPORT_FILES = frozenset({"model.json", "model.safetensors.index.json", "dense.safetensors", "vocab"})


def fsync_dir(directory: str | os.PathLike) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RunLock:
    """One user of a folder at a time: an exclusive ``flock`` on a lock file for the life
    of the run (the run folder's RUN/.lock, a store directory's DIR/.lock, the lock beside
    a dataset or export being built).

    The kernel drops a ``flock`` when its holder dies however it dies (even SIGKILL), so
    a lock left by a dead process never blocks the next run; the file keeps the last
    holder's pid, host and start time, which a refused run names. A holder that lets go
    marks the record ``released``; a record without the mark was left by a process that
    died holding the lock, and the next holder says that it took it over (one line,
    naming the pid). The lock is also held by the processes a holder starts with its
    descriptor (:func:`held_lock_fds`: the local launcher's roles), until the last of
    them ends. ``what`` and ``hint`` make the refusal's message (``runs/a is in use by
    another run (...); wait for it to end or choose another --out``).
    """

    def __init__(self, path: Path, what: str | None = None, hint: str = "wait for it to end or choose another --out"):
        self.path = Path(path)
        self.what = what if what is not None else str(self.path.parent)
        self.hint = hint
        self.fd: int | None = None
        self._info: dict = {}

    def acquire(self) -> None:
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:  # /proc, a read-only volume, a folder of another user's
                prefix = "" if self.what == str(self.path.parent) else f"{self.what}: "
                raise ConfigError(
                    f"{prefix}cannot write in {self.path.parent} ({e.strerror or e}); choose another path"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise ConfigError(f"{self.what} is in use by another run ({holder}); {self.hint}") from None
            try:  # a holder that removes its lock file on release may have done so meanwhile
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:
            raise ConfigError(f"{self.what}: its lock file {self.path} keeps changing; {self.hint}")
        left = _read_record(fd)
        os.ftruncate(fd, 0)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv[:3]),
        }
        try:
            self._write(fd, info)
        except BaseException:  # a full disk: the lock is let go, the caller says why
            os.close(fd)
            raise
        self.fd, self._info = fd, info
        _HELD.add(fd)
        if left and "pid" in left and not left.get("released") and left.get("pid") != os.getpid():
            log.info(f"{self.what}: took over the lock left by {_describe(left)}, which is gone")

    def release(self) -> None:
        if self.fd is not None:
            _HELD.discard(self.fd)
            try:  # let go on purpose: the next holder has nothing to take over
                self._write(self.fd, {**self._info, "released": time.strftime("%Y-%m-%d %H:%M:%S")})
            except OSError:
                pass
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    @staticmethod
    def _write(fd: int, info: dict) -> None:
        data = (json.dumps(info, allow_nan=False) + "\n").encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


#: Descriptors of the locks this process holds (see :func:`held_lock_fds`).
_HELD: set[int] = set()


def held_lock_fds() -> tuple[int, ...]:
    """The descriptors of every :class:`RunLock` this process holds: a child started with
    them (``subprocess.Popen(pass_fds=...)``) holds the locks too, until it ends, so a
    holder killed with SIGKILL does not free its folder while its children still work."""
    return tuple(sorted(_HELD))


def _read_record(fd: int) -> dict | None:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (ValueError, OSError, UnicodeDecodeError):
        return None
    return info if isinstance(info, dict) else None


def _describe(info: dict) -> str:
    words = str(info.get("command") or "").split()
    if len(words) > 1 and "bagpipe" in words[0]:  # .../bagpipe/cli.py train --data: bagpipe train
        command = f"bagpipe {words[1]}"
    else:
        command = words[0] if words else "?"
    return f"pid {info.get('pid')} on {info.get('host')} ({command}, started {info.get('started')})"


def _read_holder(fd: int) -> str:
    info = _read_record(fd)
    if not info or "pid" not in info:
        return "holder unknown"
    try:
        where = f"pid {info['pid']} on {info['host']}, started {info['started']}"
        if info["host"] == socket.gethostname() and not _pid_alive(int(info["pid"])):
            where += "; it is gone, and processes it started still hold the lock"
    except (KeyError, TypeError, ValueError):
        return "holder unknown"
    return where


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    if os.path.isdir("/proc/self"):
        return start_time(pid) is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True
