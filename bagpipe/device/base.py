"""The device seam: streams, events, buffers and copies, declared once.

Everything bagpipe moves between host memory and the device that computes goes through
a :class:`Device`: the executors' staged rows and write-backs
(:mod:`bagpipe.cache.transfer`), the hot rows loaded at start, the rows written at a
checkpoint. Three implementations:

* :class:`HostDevice` (``--device cpu``, the reference): the device *is* host memory;
  streams are the caller's thread, a copy is done when it returns, an event has always
  fired. Staging is skipped (``host_memory``): a store's rows are used where they lie.
* :class:`bagpipe.device.cuda.CudaDevice` (``--device cuda``): torch's streams and events,
  pinned host buffers, non-blocking copies.
* :class:`bagpipe.device.twin.AsyncTwin` (``--device cpu-async``): host memory, but every
  copy on a side stream runs later, on a worker thread, in any order the waits allow --
  so a missing wait shows on a CPU as a wrong result (the tests' way to check the
  CUDA path's ordering without a GPU).

The rules every user of the seam keeps (they are CUDA's):

* work enqueued on one stream runs in order; on different streams in any order, unless
  a stream :meth:`Stream.wait`\\ s for an :class:`Event` recorded on another;
* a side stream's copy writes into device memory allocated for that stream
  (:meth:`Device.empty`'s ``stream``), and memory one stream allocated that another
  stream's work uses is kept for it (:meth:`Device.keep_for`);
* after :meth:`Device.copy` returns, the destination is undefined and the source must
  not change until an event recorded on the copy's stream after it has fired;
* the *compute* stream is the one the caller's thread computes on (the step, the
  cache's index_copy/index_select); waiting on it for an event orders the computation
  after the event, and the host thread is not blocked (on CUDA) or is (elsewhere).
"""

from __future__ import annotations

from typing import Protocol

import torch


class Event(Protocol):
    """A point in a stream's work."""

    def synchronize(self) -> None:
        """Block the calling thread until the work before the event is done."""
        ...


class Stream(Protocol):
    """A queue of device work that runs in order."""

    def record(self) -> Event:
        """An event that fires once the work enqueued on this stream so far is done."""
        ...

    def wait(self, event: Event) -> None:
        """Work enqueued on this stream from now on starts only after ``event`` fired."""
        ...


class Device(Protocol):
    """Where the model, the (C, D) cache and its optimizer state live, and how rows reach it."""

    name: str
    """What ``--device`` named: ``cpu``, ``cuda`` or ``cpu-async``."""
    torch: torch.device
    """The torch device of the model, the cache and the full tables."""
    host_memory: bool
    """Whether device tensors are host memory that copies reach at once (then rows are
    used where a store put them, without staging)."""
    compute: Stream
    """The stream the calling thread computes on."""

    def describe(self) -> str:
        """One line for the summary and the logs (``cuda:0 (NVIDIA H100 80GB HBM3)``)."""
        ...

    def stream(self) -> Stream:
        """A new side stream (copies in the background)."""
        ...

    def empty(
        self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32, stream: Stream | None = None
    ) -> torch.Tensor:
        """An uninitialised tensor in device memory, allocated for work on ``stream`` (None:
        the compute stream). A side stream's copy writes only into memory allocated for
        it: CUDA's caching allocator hands a freed block out again to the stream it
        belongs to as soon as *that* stream's queued work allows, so a block of the
        compute stream written by a side copy may still be read by compute work queued
        before it (seen on an H200: NaN at batch 16384)."""
        ...

    def keep_for(self, t: torch.Tensor, stream: Stream) -> None:
        """``t``, allocated for another stream, is used by work enqueued on ``stream``: its
        memory is not handed out again before that work has run (CUDA: ``record_stream``)."""
        ...

    def host_empty(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """An uninitialised host buffer that copies to and from the device read and
        write directly (pinned on CUDA)."""
        ...

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Stream) -> None:
        """Enqueue ``dst <- src`` on ``stream`` (see the module's rules)."""
        ...

    def put(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor's value on the device, ordered on the compute stream (a step's
        index and inverse; small). Where the device is host memory it is the tensor itself;
        on CUDA a copy, and the host tensor may change after the call."""
        ...

    def close(self) -> None:
        """Finish every enqueued copy and release the device's threads."""
        ...


class _DoneEvent:
    """An event that has fired."""

    def synchronize(self) -> None:
        pass


DONE = _DoneEvent()


class _HostStream:
    """The caller's thread as a stream: its work is done when enqueued."""

    def record(self) -> Event:
        return DONE

    def wait(self, event: Event) -> None:
        event.synchronize()


class HostDevice:
    """``--device cpu``: the device is host memory and every copy is done on return (the
    reference of the other devices; staging is skipped)."""

    name = "cpu"
    host_memory = True

    def __init__(self) -> None:
        self.torch = torch.device("cpu")
        self.compute: Stream = _HostStream()

    def describe(self) -> str:
        return "cpu"

    def stream(self) -> Stream:
        return _HostStream()

    def empty(
        self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32, stream: Stream | None = None
    ) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def keep_for(self, t: torch.Tensor, stream: Stream) -> None:
        pass

    def host_empty(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Stream) -> None:
        dst.copy_(src)

    def put(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def close(self) -> None:
        pass
