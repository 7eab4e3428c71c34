"""The library's one logger, and how the command line shows it.

Every module logs its one-line notices with ``logging.getLogger(__name__)`` (children of
the ``bagpipe`` logger): the auto-tuner's choice, the hot tier, ``resumed from step N``,
evaluations, a role's progress. The library decides nothing about where they go: a
program or notebook that uses bagpipe sees them as it configures :mod:`logging`. The
command line (:mod:`bagpipe.cli`) calls :func:`to_terminal`, which prints them on
standard output, plainly for a command and with the time for a role of a distributed
job (whose output the launcher prefixes with the role's name and keeps in its log).
"""

from __future__ import annotations

import logging
import sys

LOGGER = "bagpipe"


class _Stdout(logging.Handler):
    """Writes to whatever ``sys.stdout`` is when a record comes (tests capture it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stdout.write(self.format(record) + "\n")
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - logging must not raise
            self.handleError(record)


def to_terminal(*, timestamps: bool = False, level: int = logging.INFO) -> None:
    """Show the ``bagpipe`` logger's records of ``level`` and above on standard output,
    one line each (with ``HH:MM:SS`` first when ``timestamps``); replaces an earlier
    call's handler."""
    logger = logging.getLogger(LOGGER)
    for h in list(logger.handlers):
        if isinstance(h, _Stdout):
            logger.removeHandler(h)
    handler = _Stdout()
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S") if timestamps else logging.Formatter("%(message)s")
    )
    logger.addHandler(handler)
    logger.setLevel(level)
