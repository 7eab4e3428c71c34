"""Running a batch generator ahead of its consumer, in a background thread."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator


class Prefetched:
    """Iterates ``gen`` in a background thread, up to ``depth`` items ahead.

    An exception in ``gen`` is raised in the consumer at the item where it occurred;
    :meth:`close` stops the thread at its next item (the generator is abandoned).
    """

    def __init__(self, gen: Iterator, depth: int = 4):
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(gen,), daemon=True, name="bagpipe-loader")
        self._t.start()

    def _run(self, gen) -> None:
        try:
            for item in gen:
                while not self._stop.is_set():
                    try:
                        self._q.put(("item", item), timeout=0.1)
                        break
                    except queue.Full:
                        pass
                if self._stop.is_set():
                    return
            self._q.put(("done", None))
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            self._q.put(("error", e))

    def __iter__(self):
        while True:
            kind, item = self._q.get()
            if kind == "done":
                return
            if kind == "error":
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
