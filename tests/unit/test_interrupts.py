"""A SIGINT (and a stop signal within ``stop_cleanly``) that lands in the import machinery
is not lost: Python cannot propagate a KeyboardInterrupt raised in importlib's weak-reference
callback ("Exception ignored in ... cb", and the run trained on to exit 0: newcomer round
19), so the handler sends the signal again a moment later, where it is raised."""

from __future__ import annotations

import signal
import time
from types import SimpleNamespace
from typing import Any

import pytest

from bagpipe import interrupts, lifeline

pytestmark = pytest.mark.unit

IMPORTLIB: Any = SimpleNamespace(f_code=SimpleNamespace(co_filename="<frozen importlib._bootstrap>"))


def _raised_within(seconds: float) -> BaseException | None:
    try:
        time.sleep(seconds)  # a signal's Python handler runs here, in the main thread
    except KeyboardInterrupt as e:
        return e
    return None


def test_an_interrupt_in_the_import_machinery_is_raised_a_moment_later():
    old = signal.signal(signal.SIGINT, interrupts.interrupt)
    try:
        interrupts.interrupt(signal.SIGINT, IMPORTLIB)  # deferred: returns
        e = _raised_within(5.0)
        assert type(e) is KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):  # anywhere else: at once
            interrupts.interrupt(signal.SIGINT, None)
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_stop_signal_in_the_import_machinery_unwinds_a_moment_later():
    before = lifeline.stop_cleanly()
    try:
        stop = signal.getsignal(signal.SIGTERM)
        assert callable(stop)
        stop(signal.SIGTERM, IMPORTLIB)  # deferred: returns, and is not counted as the first signal
        e = _raised_within(5.0)
        assert isinstance(e, lifeline.Terminated) and e.signum == signal.SIGTERM
    finally:
        lifeline.restore(before)


def test_install_replaces_pythons_handler_and_an_ignored_one_not_anothers():
    old = signal.getsignal(signal.SIGINT)
    try:
        cases: list[tuple[Any, bool, Any]] = [
            (signal.default_int_handler, False, interrupts.interrupt),
            (signal.default_int_handler, True, signal.default_int_handler),
            (signal.SIG_IGN, True, interrupts.interrupt),
            (print, False, print),
        ]
        for given, only_if_ignored, want in cases:
            signal.signal(signal.SIGINT, given)
            interrupts.install(only_if_ignored=only_if_ignored)
            assert signal.getsignal(signal.SIGINT) is want
    finally:
        signal.signal(signal.SIGINT, old)
