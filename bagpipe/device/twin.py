"""``--device cpu-async``: the CUDA path's ordering, checked on a CPU.

:class:`AsyncTwin` keeps every tensor in host memory, as ``--device cpu`` does, but
treats it as a separate device: a store's rows are staged through host buffers and
copied, and every copy enqueued on a side stream runs *later*, on a worker thread:

* when it is enqueued, its destination is filled with NaN (its contents are undefined
  until the copy has run) and nothing is read from its source yet (the source must not
  change until the copy has run);
* a copy is held back until someone needs it -- a thread synchronises on an event
  recorded after it, or the compute stream waits for such an event, directly or through
  another stream's wait -- or until its random hold time (``hold_s``) has passed;
* among the copies that may run, the worker picks one at random: work on different
  streams is reordered whenever no wait forbids it; each stream's own work stays in order;
* a side stream's copy into device memory allocated for another stream (``empty``'s
  ``stream``) is refused at once unless the side stream waited for an event of that
  stream recorded after the allocation: CUDA's caching allocator may hand such a block
  out while the other stream still has work queued on it, which the twin, having no
  allocator, could not show as a wrong value.

So a missing wait -- a step that installs staged rows before their copy, a write-back
thread that writes a host buffer before its copy, a buffer reused while a copy still
reads it -- makes the run read NaN or another step's values, and its ``params_sha256``
differs from ``--mode full``'s. The computation itself (the compute stream) runs in the
calling thread as it does on ``--device cpu``; what the twin checks is the ordering of
the copies around it.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from bagpipe.device.base import Event, Stream


class TwinEvent:
    """An event of the twin: fires when its stream's worker reaches it."""

    def __init__(self, twin: AsyncTwin, stream: TwinStream | None):
        self.twin, self.stream = twin, stream
        self.fired = stream is None  # an event of the compute stream has fired when recorded
        self.at = twin._tick()  # when it was recorded, against the allocations' times

    def synchronize(self) -> None:
        self.twin._wait_for(self)


@dataclass
class _Op:
    kind: str  # "copy" | "wait" | "fire"
    due: float = 0.0  # a copy's hold ends then
    dst: torch.Tensor | None = None
    src: torch.Tensor | None = None
    event: TwinEvent | None = None


@dataclass(eq=False)
class TwinStream:
    """A side stream of the twin: a queue of copies, waits and event records."""

    twin: AsyncTwin
    ops: deque = field(default_factory=deque)
    waited: dict = field(default_factory=dict)  # stream waited for (None: compute) -> latest event's time

    def record(self) -> Event:
        e = TwinEvent(self.twin, self)
        self.twin._enqueue(self, _Op("fire", event=e))
        return e

    def wait(self, event: Event) -> None:
        assert isinstance(event, TwinEvent), f"a twin stream waits on twin events, not {event!r}"
        self.waited[event.stream] = max(self.waited.get(event.stream, -1), event.at)
        if not event.fired:
            self.twin._enqueue(self, _Op("wait", event=event))


class _ComputeStream:
    """The calling thread: its work is done when enqueued; waiting blocks the thread."""

    def __init__(self, twin: AsyncTwin):
        self.twin = twin

    def record(self) -> Event:
        return TwinEvent(self.twin, None)

    def wait(self, event: Event) -> None:
        event.synchronize()


class AsyncTwin:
    """The asynchronous CPU twin of :class:`bagpipe.device.cuda.CudaDevice` (see the module docstring).

    Args:
        hold_s: (shortest, longest) seconds a copy nobody waits for is held back.
        seed: the worker's choices (which copy runs next, how long one is held).
    """

    name = "cpu-async"
    host_memory = False

    def __init__(self, hold_s: tuple[float, float] = (0.05, 0.5), seed: int = 0):
        self.torch = torch.device("cpu")
        self.compute: Stream = _ComputeStream(self)
        self.hold_s = hold_s
        self._rng = random.Random(seed)
        self._cond = threading.Condition()
        self._streams: list[TwinStream] = []
        self._demanded: set[TwinEvent] = set()
        self._error: BaseException | None = None
        self._closing = False
        self.copies = 0  # copies run so far
        self.reordered = 0  # copies run while an older copy of another stream was still held
        self._clock = itertools.count(1)  # orders allocations and event records (the allocation rule)
        self._worker = threading.Thread(target=self._run, name="bagpipe-twin", daemon=True)
        self._worker.start()

    # -- the seam ---------------------------------------------------------------------
    def describe(self) -> str:
        return "cpu-async (CPU; copies run late, in any order the waits allow)"

    def stream(self) -> Stream:
        s = TwinStream(self)
        with self._cond:
            self._streams.append(s)
        return s

    def empty(
        self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32, stream: Stream | None = None
    ) -> torch.Tensor:
        t = _undefined(torch.empty(shape, dtype=dtype))
        t._twin_stream = stream  # the stream it was allocated for, and when
        t._twin_at = self._tick()
        return t

    def _tick(self) -> int:
        return next(self._clock)  # one C call: atomic across the threads that allocate and record

    def keep_for(self, t: torch.Tensor, stream: Stream) -> None:
        pass  # the twin has no allocator to hand memory out early; CUDA's has (cuda.py)

    def host_empty(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return _undefined(torch.empty(shape, dtype=dtype))

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Stream) -> None:
        if not isinstance(stream, TwinStream):  # the compute stream: now, in this thread
            dst.copy_(src)
            return
        owner = getattr(dst, "_twin_stream", stream)
        if owner is not stream and stream.waited.get(owner, -1) < dst._twin_at:
            raise RuntimeError(
                "a side stream's copy writes device memory allocated for another stream, without waiting for an "
                "event of that stream recorded after the allocation: on CUDA the "
                "caching allocator may have handed that block out under the other stream's queued work; "
                "allocate it with empty(..., stream=) of the stream that writes it"
            )
        _undefined(dst)
        lo, hi = self.hold_s
        self._enqueue(stream, _Op("copy", due=time.monotonic() + self._rng.uniform(lo, hi), dst=dst, src=src))

    def put(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def close(self) -> None:
        """Run every enqueued copy, then stop the worker."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._worker.join(timeout=30)

    # -- the worker ---------------------------------------------------------------------
    def _enqueue(self, stream: TwinStream, op: _Op) -> None:
        with self._cond:
            if self._error is not None:
                raise self._error
            if self._closing:
                raise RuntimeError("the cpu-async device is closed")
            stream.ops.append(op)
            self._cond.notify_all()

    def _wait_for(self, event: TwinEvent) -> None:
        with self._cond:
            if not event.fired:
                self._demanded.add(event)
                self._cond.notify_all()
            while not event.fired:
                if self._error is not None:
                    raise self._error
                self._cond.wait(timeout=0.1)
            self._demanded.discard(event)

    def _urgent(self) -> set[int]:
        """Indices of the streams whose work someone waits for (through waits, too)."""
        urgent = {i for i, s in enumerate(self._streams) if any(op.event in self._demanded for op in s.ops)}
        grew = True
        while grew:
            grew = False
            for i in list(urgent):
                head = self._streams[i].ops[0] if self._streams[i].ops else None
                if head is not None and head.kind == "wait" and head.event is not None:
                    j = self._streams.index(head.event.stream) if head.event.stream is not None else None
                    if j is not None and j not in urgent:
                        urgent.add(j)
                        grew = True
        return urgent

    def _step(self) -> float | None:
        """Run one piece of work that may run (under the lock); else the seconds until a hold ends (None: idle)."""
        now = time.monotonic()
        for s in self._streams:  # waits that are satisfied and fired events cost nothing
            while s.ops and ((s.ops[0].kind == "wait" and s.ops[0].event.fired) or s.ops[0].kind == "fire"):
                op = s.ops.popleft()
                if op.kind == "fire":
                    op.event.fired = True
                    self._cond.notify_all()
        urgent = self._urgent()
        ready, next_due = [], None
        for i, s in enumerate(self._streams):
            if not s.ops or s.ops[0].kind != "copy":
                continue
            if i in urgent or self._closing or s.ops[0].due <= now:
                ready.append(s)
            else:
                next_due = s.ops[0].due if next_due is None else min(next_due, s.ops[0].due)
        if not ready:
            return None if next_due is None else max(next_due - now, 0.0)
        s = self._rng.choice(ready)
        op = s.ops.popleft()
        if any(t.ops and t.ops[0].kind == "copy" and t.ops[0].due < op.due for t in self._streams if t is not s):
            self.reordered += 1
        assert op.dst is not None and op.src is not None
        op.dst.copy_(op.src)
        self.copies += 1
        return 0.0

    def _run(self) -> None:
        with self._cond:
            while True:
                try:
                    wait = self._step()
                except BaseException as e:  # noqa: BLE001 - handed to whoever waits
                    self._error = e
                    self._cond.notify_all()
                    return
                if wait == 0.0:
                    continue
                if wait is None and self._closing and not any(s.ops for s in self._streams):
                    self._cond.notify_all()
                    return
                self._cond.wait(timeout=wait if wait is not None else 0.1)


def _undefined(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` with what a reader of memory not yet written would see (NaN for floats)."""
    if t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(-(2**31) + 7)
    return t
