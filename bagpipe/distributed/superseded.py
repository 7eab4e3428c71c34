"""End a role whose attempt the job has left behind (torchrun across hosts).

Under torchrun each host's agent restarts *its own* roles when one of them dies
(``--max-restarts``); the restarted roles meet under the next attempt's prefix of the
agent's store (``bagpipe/attempt-N``, :func:`bagpipe.distributed.rendezvous.rendezvous`).
With the static rendezvous backend no other host's agent is told: its roles go on in the
old attempt, and one that is blocked where no connection to a dead role breaks (a store
wait, a collective with a living peer, a gloo listener) would wait for the op time-out
(30 minutes) while the restarted roles wait for it at the rendezvous. torchrun's dynamic
backends would restart every host's roles on a membership change, but they keep pickles
in the store (see docs/distributed.md, "What is not authenticated").

So every role under torchrun watches the store: once a second it asks whether attempt
N + 1 has begun (a role arrived under its prefix). When it has, the role prints why and
ends its process at once with exit code 1 -- from this thread, because the main thread
may be blocked inside torch where no Python exception reaches it -- and its agent
restarts it into attempt N + 1, from the latest checkpoint like every restarted role.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta

log = logging.getLogger(__name__)

#: Seconds between two questions to the store (one small round trip each).
PERIOD_S = 1.0


def attempt_prefix(attempt: int) -> str:
    """The store prefix of the roles' rendezvous in ``attempt`` (torchrun's restart count)."""
    return f"bagpipe/attempt-{attempt}"


def attempt_key(attempt: int) -> str:
    """The store key the first role of ``attempt`` creates (its arrival counter)."""
    return f"{attempt_prefix(attempt)}/arrived"


class SupersededWatch:
    """A daemon thread that calls ``on_superseded(message)`` once ``attempt + 1`` has
    begun in the store at ``addr:port``. Its own store client: the role's may be held by
    a blocking wait. ``stop()`` ends the watch (the role is leaving on its own)."""

    def __init__(
        self,
        addr: str,
        port: int,
        attempt: int,
        name: str,
        on_superseded: Callable[[str], None],
        period_s: float = PERIOD_S,
    ) -> None:
        self.addr, self.port, self.attempt, self.name = addr, port, attempt, name
        self.on_superseded, self.period_s = on_superseded, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bagpipe-superseded-watch")

    def start(self) -> SupersededWatch:
        self._thread.start()
        return self

    def stop(self, wait: bool = True) -> None:
        """Stop watching; ``wait``: until the watch's thread has ended (up to its store's timeout)."""
        self._stop.set()
        if wait and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self.period_s + 10)

    def _run(self) -> None:
        import torch.distributed as dist

        key = attempt_key(self.attempt + 1)
        client = None
        while not self._stop.wait(self.period_s):
            try:
                if client is None:
                    client = dist.TCPStore(
                        self.addr, self.port, is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False
                    )
                begun = client.check([key])
            except RuntimeError as e:  # the store is unreachable for now: the agent's own business
                log.debug(f"{self.name}: cannot ask the store whether attempt {self.attempt + 1} began: {e}")
                client = None
                continue
            if begun and not self._stop.is_set():
                self.on_superseded(
                    f"{self.name}: another host's roles restarted (attempt {self.attempt + 1} began at "
                    f"{self.addr}:{self.port}); ending this attempt so that torchrun restarts this role too"
                )
                return
