"""Where a trainer computes: the device seam (:mod:`bagpipe.device.base`) and its implementations.

* :class:`~bagpipe.device.base.HostDevice` -- ``--device cpu``, the reference;
* :class:`~bagpipe.device.cuda.CudaDevice` -- ``--device cuda``: one GPU, torch's streams,
  events, pinned buffers and non-blocking copies;
* :class:`~bagpipe.device.twin.AsyncTwin` -- ``--device cpu-async``: host memory whose copies
  run late and out of order on a worker thread, so a missing wait shows as a wrong digest.

:func:`open_device` opens the one a run names; :mod:`bagpipe.device.placement` maps the
trainers of a distributed job to GPUs and picks their collectives' backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bagpipe.device.base import Device, Event, HostDevice, Stream


def _cuda(index: int | None, deterministic: bool, memory_budget_mb: float) -> Device:
    from bagpipe.device.cuda import CudaDevice

    return CudaDevice(index, deterministic, memory_budget_mb)


def _twin(index: int | None, deterministic: bool, memory_budget_mb: float) -> Device:
    from bagpipe.device.twin import AsyncTwin

    return AsyncTwin()


#: ``--device`` name -> a function of (the GPU index, None: the current one; whether
#: torch's deterministic algorithms are on; the device memory budget in MiB, 0: none,
#: which only CUDA's allocator enforces) that opens it.
DEVICES: dict[str, Callable[[int | None, bool, float], Device]] = {
    "cpu": lambda index, deterministic, memory_budget_mb: HostDevice(),
    "cuda": _cuda,
    "cpu-async": _twin,
}


def open_device(
    name: str, index: int | None = None, deterministic: bool = True, memory_budget_mb: float = 0.0
) -> Device:
    """The device ``--device name`` names (``index``: which GPU, for cuda); close it after use.
    ``memory_budget_mb``: on cuda, torch's caching allocator is capped there (0: no cap).
    ``cuda`` where torch sees no GPU is a :class:`~bagpipe.errors.ConfigError` saying why."""
    return DEVICES[name](index, deterministic, memory_budget_mb)


def on_host(obj: Any) -> Any:
    """``obj`` (tensors, possibly inside dicts, lists and tuples) with every tensor copied to
    host memory: what a checkpoint saves, so that any machine can load it."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: on_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(on_host(v) for v in obj)
    return obj


__all__ = ["DEVICES", "Device", "Event", "HostDevice", "Stream", "on_host", "open_device"]
