"""SIGINT as Python's own KeyboardInterrupt, except where Python would lose it.

A KeyboardInterrupt raised while the import machinery runs a weak-reference callback of
its module locks (``<frozen importlib._bootstrap>``'s ``cb``: whenever an import finishes,
which during start-up -- torch -- is thousands of times a second) cannot propagate: Python
prints "Exception ignored in: ... KeyboardInterrupt" with a traceback and goes on, so the
run trained to its end and exited 0 (newcomer round 19). :func:`interrupt` raises the
interrupt as :func:`signal.default_int_handler` does, but one that lands in the import
machinery is sent again a moment later (from a timer thread), by when the import has
moved on to code that lets it through.

Imports only os, signal and sys (threading when deferring): the command line installs it
before any import that takes time.
"""

from __future__ import annotations

import os
import signal

#: How long a deferred signal waits before it is sent again (seconds).
RETRY_S = 0.02


def in_import_machinery(frame) -> bool:
    """Whether ``frame`` (a signal handler's: the innermost Python frame) is importlib's own."""
    return frame is not None and frame.f_code.co_filename.startswith("<frozen importlib")


def send_again_later(signum: int) -> None:
    """Deliver ``signum`` to this process again after :data:`RETRY_S`."""
    import threading

    t = threading.Timer(RETRY_S, os.kill, (os.getpid(), signum))
    t.daemon = True
    t.start()


def interrupt(signum, frame) -> None:
    """SIGINT's handler: KeyboardInterrupt, deferred out of the import machinery."""
    if in_import_machinery(frame):
        send_again_later(signum)
        return
    raise KeyboardInterrupt


def install(only_if_ignored: bool = False) -> None:
    """Make :func:`interrupt` SIGINT's handler, in place of Python's own or (with
    ``only_if_ignored``, or always) of an inherited SIG_IGN; another handler is left alone.
    Nothing off the main thread (not ours to set)."""
    old = signal.getsignal(signal.SIGINT)
    if old is signal.SIG_IGN or (not only_if_ignored and old is signal.default_int_handler):
        try:
            signal.signal(signal.SIGINT, interrupt)
        except ValueError:  # not the main thread
            pass


def is_python_interrupt(handler) -> bool:
    """Whether ``handler`` raises KeyboardInterrupt on SIGINT: Python's own or :func:`interrupt`."""
    return handler is signal.default_int_handler or handler is interrupt
