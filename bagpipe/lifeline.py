"""Processes bagpipe starts end with the process that started them.

A process bagpipe starts (a role of a local job, a pre-started spare, a run or helper of
``bagpipe bench``) gets :data:`ENV` in its environment: its parent's pid and the start
time of that pid (from ``/proc/PID/stat``), so a pid the kernel has handed to another
process since is not mistaken for the parent. :func:`watch`, called first thing by the
command line (and by bench's own helper programs), starts a daemon thread that looks
every :data:`INTERVAL_S` seconds; once the parent is gone -- killed with SIGKILL, say,
so that it could stop nothing itself -- it prints one line, interrupts the main thread
(so the process's own clean-up runs, as on Ctrl-C), and ends the process if it is still
there :data:`GRACE_S` seconds later (a SIGALRM the kernel delivers, whatever the process's
threads are doing -- the interpreter's own shutdown stops daemon threads such as this one).

Only processes bagpipe started carry :data:`ENV`: a role started by hand or by torchrun
keeps its own supervision. (``PR_SET_PDEATHSIG`` is not used for these: it fires when the
*thread* that forked the child ends, and the launcher starts its spares from a thread.)

This module imports nothing heavy: the command line calls it before parsing arguments.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping

from bagpipe.interrupts import in_import_machinery, install, is_python_interrupt, send_again_later

#: ``PID:START`` of the process that started this one (START: its start time in clock
#: ticks after boot, 0 where /proc is not available).
ENV = "BAGPIPE_PARENT"
#: A file the one line is also appended to (a role's log: its output went to the parent).
LOG_ENV = "BAGPIPE_PARENT_LOG"
INTERVAL_S = 0.25
GRACE_S = 3.0


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, field 22 of /proc/PID/stat);
    None if there is no such process (or it is a zombie: it has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # after "(comm)", which may hold spaces
    if not fields or fields[0] == b"Z":
        return None
    return int(fields[19])


def token(pid: int | None = None) -> str:
    """``PID:START`` of ``pid`` (this process by default), the value of :data:`ENV`."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{start_time(pid) or 0}"


def alive(value: str) -> bool:
    """Whether the process that a :func:`token` names still runs (the same process: its
    pid not reused since)."""
    pid_s, _, start_s = value.partition(":")
    pid, start = int(pid_s), int(start_s or 0)
    if not start:  # no /proc where the token was made: the pid alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return start_time(pid) == start


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (this process's environment by default) with :data:`ENV` naming this process:
    a child started with it ends when this process does."""
    out = dict(os.environ if env is None else env)
    out[ENV] = token()
    return out


def parse(value: str | None) -> str | None:
    """A well-formed :data:`ENV` value, or None (absent or malformed: nothing to watch)."""
    if not value:
        return None
    pid_s, sep, start_s = value.partition(":")
    if not (pid_s.isdigit() and sep and start_s.isdigit()):
        return None
    return value


def watch(what: str | None = None, *, on_gone: Callable[[str], None] | None = None) -> threading.Thread | None:
    """Start the watch of this process's parent when :data:`ENV` names one (see the module
    docstring); returns its thread, or None when there is nothing to watch. The variable
    is removed from this process's environment, so processes it starts are not tied to
    its parent (they get their own value where bagpipe starts them). ``what``: this
    process in the one line (``bagpipe worker``); ``on_gone``: replaces the ending (tests)."""
    value = parse(os.environ.pop(ENV, None))
    if value is None:
        return None
    name = what or " ".join(os.path.basename(a) for a in sys.argv[:2])
    log_file = os.environ.pop(LOG_ENV, None)
    pid = int(value.partition(":")[0])

    def loop() -> None:
        while alive(value):
            time.sleep(INTERVAL_S)
        line = f"{name} (pid {os.getpid()}): the process that started it (pid {pid}) is gone; ending"
        if log_file:
            try:
                with open(log_file, "a") as f:
                    f.write(time.strftime("%H:%M:%S ") + line + "\n")
            except OSError:
                pass
        (on_gone or _end)(line)

    if threading.current_thread() is threading.main_thread():
        # started in the background by a shell (`cmd &` ignores SIGINT in its children), the
        # interrupt that lets the main thread clean up would be a no-op: restore Python's own
        install(only_if_ignored=True)
    t = threading.Thread(target=loop, name="bagpipe-lifeline", daemon=True)
    t.start()
    return t


class Terminated(KeyboardInterrupt):
    """A stop signal (SIGTERM, SIGHUP) delivered within :func:`stop_cleanly`: it unwinds
    the main thread as Ctrl-C does, so ``finally`` blocks remove what is unfinished."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: The signals :func:`stop_cleanly` turns into :class:`Terminated` (where their action is the default).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def stop_cleanly() -> dict | None:
    """From now on (until :func:`restore`, given what this returns) a stop signal ends the
    main thread as Ctrl-C does -- SIGTERM or SIGHUP (from ``kill``, ``timeout``, a
    scheduler, a closed terminal) raises :class:`Terminated`, and SIGINT raises
    KeyboardInterrupt even where the process inherited it ignored (a shell's background
    job, ``cmd &``) -- so an output being written is removed instead of left behind. A
    signal its parent chose to ignore (``nohup``'s SIGHUP) stays ignored. The first signal
    only: one that comes while the clean-up runs is not let cut it short. Returns the
    handlers replaced; None off the main thread (Python's handlers run there only)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    fired: list[int] = []

    def stop(signum, frame):
        if fired:
            return  # cleaning up already
        if in_import_machinery(frame):  # raised there, it would be lost: a moment later
            send_again_later(signum)
            return
        fired.append(signum)
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)

    before = {}
    for sig in (signal.SIGINT, *STOP_SIGNALS):
        old = signal.getsignal(sig)
        if sig == signal.SIGINT:
            if old is not signal.SIG_IGN and not is_python_interrupt(old):
                continue  # someone's own handler
        elif old != signal.SIG_DFL:
            continue
        before[sig] = old
        signal.signal(sig, stop)
    return before


def restore(before: dict | None) -> None:
    """Put back the handlers :func:`stop_cleanly` replaced."""
    if not before or threading.current_thread() is not threading.main_thread():
        return
    for sig, old in before.items():
        signal.signal(sig, old)


def _end(line: str) -> None:
    """Say ``line`` (where anyone still reads), let the main thread clean up, then leave."""
    for stream in (sys.stderr, sys.stdout):
        try:
            stream.write(line + "\n")
            stream.flush()
        except (OSError, ValueError):  # a pipe to the parent that is gone
            pass
    # a deadline the kernel keeps: SIGALRM's default action ends the process even when no
    # thread can run Python any more (the interpreter's shutdown stops daemon threads)
    signal.setitimer(signal.ITIMER_REAL, GRACE_S)
    _thread.interrupt_main()  # KeyboardInterrupt in the main thread: its finally blocks run
    time.sleep(GRACE_S + 0.5)
    os._exit(1)  # the main thread is stuck (in C, say): leave without it
