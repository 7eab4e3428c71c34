"""The trainer's cache: C slots of D weights (+ S optimizer-state values)."""

from __future__ import annotations

import numpy as np
import torch


class SlotCache:
    """A (C, D) weight tensor and a (C, S) state tensor, plus which row each slot holds.

    The model's embedding collection gathers slot ids from ``weights``, so forward and
    backward cost what a table of C rows costs, whatever the size of the store.
    """

    def __init__(self, cache_rows: int, dim: int, state_dim: int):
        self.weights = torch.zeros(cache_rows, dim)
        self.state = torch.zeros(cache_rows, state_dim)
        self.slot_rows = np.full(cache_rows, -1, dtype=np.int64)

    @property
    def capacity(self) -> int:
        return int(self.weights.shape[0])

    def install(self, slots: np.ndarray, rows: np.ndarray, weights: np.ndarray, state: np.ndarray) -> None:
        """Put fetched rows into their slots."""
        if len(slots) == 0:
            return
        idx = torch.from_numpy(slots)
        self.weights.index_copy_(0, idx, torch.from_numpy(weights))
        self.state.index_copy_(0, idx, torch.from_numpy(state))
        self.slot_rows[slots] = rows

    def take(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Copy the values of ``slots`` out (for write-back) and mark the slots free."""
        idx = torch.from_numpy(slots)
        w = self.weights.index_select(0, idx).numpy()
        s = self.state.index_select(0, idx).numpy()
        self.slot_rows[slots] = -1
        return w, s

    def drop(self, slots: np.ndarray) -> None:
        """Mark ``slots`` free without reading them (another trainer writes their rows back)."""
        self.slot_rows[slots] = -1

    def occupied(self) -> tuple[np.ndarray, np.ndarray]:
        """(slots, rows) of every slot that holds a row."""
        slots = np.flatnonzero(self.slot_rows >= 0)
        return slots, self.slot_rows[slots]
