"""The progress of a run as the user sees it: a bar, or a line every few seconds."""

from __future__ import annotations

import logging
import time
from typing import Literal

from tqdm import tqdm

log = logging.getLogger(__name__)

ProgressKind = Literal["bar", "lines", "off"]


class Progress:
    """Shows ``step N/M  loss L  S samples/s``, and notices between updates.

    ``bar``: a tqdm bar (one process on a terminal); ``lines``: a plain line on the
    ``bagpipe`` logger at most every ``every_s`` seconds and at the first and last step
    (a distributed trainer, whose output the launcher prefixes and logs); ``off``: no
    updates. Notices (an epoch begins, an evaluation's result) are shown whatever the
    kind (above the bar, or on the logger), unless ``quiet`` (a process that does not
    report: trainers 1..N-1).
    """

    def __init__(
        self,
        kind: ProgressKind,
        *,
        total: int,
        initial: int,
        desc: str,
        quiet: bool = False,
        every_s: float = 10.0,
    ):
        self.kind = kind
        self.total = total
        self.quiet = quiet
        self.every_s = every_s
        self._last = 0.0
        self._every_steps = max(1, (total - initial) // 20)
        self.bar = (
            tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True) if kind == "bar" else None
        )

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def show(self, step: int, loss: float, samples_per_s: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", samples_s=f"{samples_per_s:,.0f}")
        elif self.kind == "lines" and not self.quiet:
            now = time.monotonic()
            if (
                now - self._last >= self.every_s
                or step % self._every_steps == 0
                or step == self.total
                or self._last == 0.0
            ):
                self._last = now
                log.info(f"step {step}/{self.total}  loss {loss:.4f}  {samples_per_s:,.0f} samples/s")

    def note(self, line: str) -> None:
        """A line between updates (an evaluation's result)."""
        if self.bar is not None:
            self.bar.write(line)
        elif not self.quiet:
            log.info(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
