"""``--device cuda``: the device seam over torch's CUDA streams, events and pinned memory.

The step computes on the thread's current stream (the default stream); staged rows and
write-backs each get a side stream of their own (:meth:`CudaDevice.stream`, non-blocking
streams from torch's pool, so they never wait on the default stream implicitly).

Memory that one stream allocated and another uses must not be handed out again before
the other's work is done, and a side stream must not write memory the caching allocator
gave to another stream (that stream may still have work queued on the block's previous
tensor: the first H200 run read NaN at batch 16384 from exactly this). So staged rows
are allocated *for* the upload stream (:meth:`CudaDevice.empty` with ``stream``), kept for
the compute stream that installs them (:meth:`CudaDevice.keep_for`), and
:meth:`CudaDevice.copy` records every device tensor it touches on the copy's stream
(``Tensor.record_stream``); pinned host buffers come from torch's
caching host allocator, which holds a block until the copies that used it have finished.

Exactness on the device needs torch's deterministic algorithms (an ``embedding_bag``
backward or an ``index_add`` may otherwise sum in a different order each run): opening a
CUDA device turns them on, with the cuBLAS workspace setting they need, and closing it
restores what was set before.

A device memory budget (``--device-memory-budget-mb``) caps torch's caching allocator on
this GPU (``torch.cuda.set_per_process_memory_fraction``): an allocation past it raises
torch's out-of-memory error instead of using the rest of the GPU; closing lifts the cap.
"""

from __future__ import annotations

import os

import torch

from bagpipe.device.base import Event, Stream
from bagpipe.errors import ConfigError

CUBLAS_WORKSPACE = ":4096:8"  # what torch's deterministic mode asks of cuBLAS >= 10.2


def cuda_unavailable_reason() -> str | None:
    """Why ``--device cuda`` cannot run here (None: it can)."""
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) was built without CUDA"
    return "torch sees no CUDA GPU (check the driver and CUDA_VISIBLE_DEVICES)"


class CudaEvent:
    def __init__(self, event: torch.cuda.Event):
        self.event = event

    def synchronize(self) -> None:
        self.event.synchronize()


class CudaStream:
    """A torch CUDA stream as a :class:`~bagpipe.device.base.Stream`."""

    def __init__(self, stream: torch.cuda.Stream):
        self.stream = stream

    def record(self) -> Event:
        e = torch.cuda.Event()
        e.record(self.stream)
        return CudaEvent(e)

    def wait(self, event: Event) -> None:
        assert isinstance(event, CudaEvent), f"a CUDA stream waits on CUDA events, not {event!r}"
        self.stream.wait_event(event.event)


class CudaDevice:
    """One GPU (``cuda:index``); see the module docstring."""

    name = "cuda"
    host_memory = False

    def __init__(self, index: int | None = None, deterministic: bool = True, memory_budget_mb: float = 0.0):
        reason = cuda_unavailable_reason()
        if reason is not None:
            raise ConfigError(f"--device cuda: {reason}; use --device cpu")
        count = torch.cuda.device_count()
        index = torch.cuda.current_device() if index is None else int(index)
        if not 0 <= index < count:
            raise ConfigError(f"--device cuda: GPU {index} asked for, but torch sees {count} (cuda:0..{count - 1})")
        self.torch = torch.device("cuda", index)
        torch.cuda.set_device(self.torch)
        self.compute: Stream = CudaStream(torch.cuda.current_stream(self.torch))
        self._restore: tuple[bool, str | None] | None = None
        self.capped = memory_budget_mb > 0
        if self.capped:
            total = torch.cuda.get_device_properties(self.torch).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, memory_budget_mb * (1 << 20) / total), self.torch)
        if deterministic:
            self._restore = (torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
            torch.use_deterministic_algorithms(True)

    def describe(self) -> str:
        return f"{self.torch} ({torch.cuda.get_device_name(self.torch)})"

    def stream(self) -> Stream:
        return CudaStream(torch.cuda.Stream(self.torch))

    def empty(
        self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32, stream: Stream | None = None
    ) -> torch.Tensor:
        if stream is None:
            return torch.empty(shape, dtype=dtype, device=self.torch)
        assert isinstance(stream, CudaStream), f"CUDA memory is allocated for a CUDA stream, not {stream!r}"
        with torch.cuda.stream(stream.stream):  # the block belongs to the stream that writes it
            return torch.empty(shape, dtype=dtype, device=self.torch)

    def keep_for(self, t: torch.Tensor, stream: Stream) -> None:
        assert isinstance(stream, CudaStream), f"CUDA memory is kept for a CUDA stream, not {stream!r}"
        t.record_stream(stream.stream)

    def host_empty(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Stream) -> None:
        assert isinstance(stream, CudaStream), f"a CUDA copy runs on a CUDA stream, not {stream!r}"
        with torch.cuda.stream(stream.stream):
            dst.copy_(src, non_blocking=True)
        for t in (dst, src):  # allocated on another stream: not reused before this copy ran
            if t.is_cuda:
                t.record_stream(stream.stream)

    def put(self, t: torch.Tensor) -> torch.Tensor:
        # from pageable memory the copy is staged by the driver before the call returns,
        # so the host tensor may change afterwards; ordered on the current (compute) stream
        return t.to(self.torch, non_blocking=True)

    def close(self) -> None:
        torch.cuda.synchronize(self.torch)
        if self.capped:
            torch.cuda.set_per_process_memory_fraction(1.0, self.torch)
            self.capped = False
        if self._restore is not None:
            enabled, workspace = self._restore
            torch.use_deterministic_algorithms(enabled)
            if workspace is None:
                os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
            self._restore = None
