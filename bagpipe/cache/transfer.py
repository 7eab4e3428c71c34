"""Rows between a store (host memory, numpy) and the cache on the trainer's device.

Every executor moves rows through one :class:`Transfers`, so the copy path is one piece
of code whatever the device (:mod:`bagpipe.device`):

* **in** (:meth:`Transfers.stage`, any thread -- the pipelined executor's fetch thread):
  the store's (M, D) weights and (M, S) state are copied into host staging buffers (pinned
  on CUDA), then to device memory on the *upload* stream, and an event is recorded after
  the copies; :meth:`Transfers.install` (the trainer's thread) makes the compute stream wait
  for that event and only then copies the rows into their cache slots, so the step that
  uses them runs after they arrived. The device buffers are allocated for the upload
  stream and kept for the compute stream until the install has run (CUDA's caching
  allocator would otherwise hand them out under work still queued);
* **out** (:meth:`Transfers.download`, the trainer's thread): the rows leaving the cache are
  gathered on the compute stream, the *download* stream waits for that, copies them into
  host buffers and records an event; :meth:`Download.result` (the write-back thread) waits
  for the event before the rows are written to the store. Write-backs reach the store in
  the order the executor queues them, and a fetch waits for the write-backs its plan
  depends on (``fetch_after``) as before: the store sees what it sees without a device.

On ``--device cpu`` (``host_memory``) nothing is staged: a store's arrays become the
tensors installed, and a download is the gathered rows themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bagpipe.cache.slots import SlotCache
from bagpipe.device import Device, Event, HostDevice


@dataclass
class Staged:
    """Rows on their way into the cache: (M, D) weights and (M, S) state in device memory,
    valid once ``ready`` has fired (None: already valid)."""

    weights: torch.Tensor
    state: torch.Tensor
    ready: Event | None = None


@dataclass
class Download:
    """Rows on their way out of the cache: host buffers, valid once ``done`` has fired."""

    weights: torch.Tensor
    state: torch.Tensor
    done: Event | None = None

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(M, D) weights and (M, S) state as numpy arrays, after waiting for the copies."""
        if self.done is not None:
            self.done.synchronize()
        return self.weights.numpy(), self.state.numpy()


class Transfers:
    """The copy path between host and the cache of one trainer (see the module docstring)."""

    def __init__(self, device: Device | None = None):
        self.device = HostDevice() if device is None else device
        d = self.device
        self.upload = d.stream() if not d.host_memory else d.compute
        self.download_stream = d.stream() if not d.host_memory else d.compute

    def _to_host(self, a: np.ndarray) -> torch.Tensor:
        buf = self.device.host_empty(tuple(a.shape))
        buf.numpy()[...] = a
        return buf

    def stage(self, weights: np.ndarray, state: np.ndarray) -> Staged:
        """Start moving a store's rows to the device (any thread)."""
        d = self.device
        w, s = np.ascontiguousarray(weights, dtype=np.float32), np.ascontiguousarray(state, dtype=np.float32)
        if d.host_memory:
            return Staged(torch.from_numpy(w), torch.from_numpy(s))
        hw, hs = self._to_host(w), self._to_host(s)
        # allocated for the upload stream that writes them (see Device.empty)
        dw, ds = d.empty(tuple(w.shape), stream=self.upload), d.empty(tuple(s.shape), stream=self.upload)
        d.copy(dw, hw, self.upload)
        d.copy(ds, hs, self.upload)
        return Staged(dw, ds, self.upload.record())

    def install(self, cache: SlotCache, slots: np.ndarray, rows: np.ndarray, staged: Staged) -> None:
        """Put staged rows into ``slots`` once they have arrived (the trainer's thread)."""
        d = self.device
        if staged.ready is not None:
            d.compute.wait(staged.ready)
        if not d.host_memory:  # the upload stream's memory, read by the compute stream's install
            d.keep_for(staged.weights, d.compute)
            d.keep_for(staged.state, d.compute)
        cache.install(slots, rows, staged.weights, staged.state)

    def download(self, weights: torch.Tensor, state: torch.Tensor) -> Download:
        """Start moving rows gathered from the cache (on the compute stream) to host memory."""
        d = self.device
        if d.host_memory:
            return Download(weights, state)
        self.download_stream.wait(d.compute.record())
        hw, hs = d.host_empty(tuple(weights.shape)), d.host_empty(tuple(state.shape))
        d.copy(hw, weights, self.download_stream)
        d.copy(hs, state, self.download_stream)
        return Download(hw, hs, self.download_stream.record())
