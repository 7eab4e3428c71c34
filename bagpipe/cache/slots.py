"""The trainer's cache: C slots of D weights (+ S optimizer-state values), on the trainer's device."""

from __future__ import annotations

import numpy as np
import torch


class SlotCache:
    """A (C, D) weight tensor and a (C, S) state tensor, plus which row each slot holds.

    The model's embedding collection gathers slot ids from ``weights``, so forward and
    backward cost what a table of C rows costs, whatever the size of the store. The
    tensors live on ``device`` (the GPU's memory on ``--device cuda``); which row each slot
    holds is host bookkeeping. :meth:`install`, :meth:`read` and :meth:`take` run on the
    device's compute stream: rows reach them through :class:`bagpipe.cache.transfer.Transfers`.
    """

    def __init__(self, cache_rows: int, dim: int, state_dim: int, device: torch.device | None = None):
        self.device = torch.device("cpu") if device is None else device
        self.weights = torch.zeros(cache_rows, dim, device=self.device)
        self.state = torch.zeros(cache_rows, state_dim, device=self.device)
        self.slot_rows = np.full(cache_rows, -1, dtype=np.int64)

    @property
    def capacity(self) -> int:
        return int(self.weights.shape[0])

    def index(self, slots: np.ndarray) -> torch.Tensor:
        """(n,) int64 slot ids on the cache's device."""
        idx = torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64))
        return idx if self.device.type == "cpu" else idx.to(self.device, non_blocking=True)

    def install(self, slots: np.ndarray, rows: np.ndarray, weights: torch.Tensor, state: torch.Tensor) -> None:
        """Put fetched rows ((M, D) weights and (M, S) state, on the cache's device) into their slots."""
        if len(slots) == 0:
            return
        idx = self.index(slots)
        self.weights.index_copy_(0, idx, weights)
        self.state.index_copy_(0, idx, state)
        self.slot_rows[slots] = rows

    def read(self, slots: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(M, D) weights and (M, S) state of ``slots``: new tensors on the cache's device."""
        idx = self.index(slots)
        return self.weights.index_select(0, idx), self.state.index_select(0, idx)

    def take(self, slots: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`read` ``slots`` (for write-back) and mark them free."""
        out = self.read(slots)
        self.slot_rows[slots] = -1
        return out

    def drop(self, slots: np.ndarray) -> None:
        """Mark ``slots`` free without reading them (another trainer writes their rows back)."""
        self.slot_rows[slots] = -1

    def occupied(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots, rows) of every slot that holds a row."""
        slots = np.flatnonzero(self.slot_rows >= 0)
        return slots, self.slot_rows[slots]
