"""Checkpoints: atomic, complete, and mode-independent.

Layout inside a run directory::

    RUN/checkpoints/step-00000100/dense.pt        model + dense optimizer + step + RNG state
    RUN/checkpoints/step-00000100/emb_weights.npy (R, D) every embedding row
    RUN/checkpoints/step-00000100/emb_state.npy   (R, S) their optimizer state
    RUN/checkpoints/LATEST                        name of the newest complete checkpoint

A checkpoint is written into a hidden temporary directory, fsynced, renamed into place,
and only then named in LATEST (itself replaced atomically), so a crash at any point
leaves the previous checkpoint intact and readable. Any mode can resume any mode's
checkpoint: the embedding rows are stored in global row order, not cache order.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from bagpipe.errors import CheckpointError
from bagpipe.files import atomic_write_text, fsync_dir

KEEP = 2


@dataclass
class Checkpoint:
    path: Path
    step: int
    dense: dict

    def rows(self, chunk: int = 1 << 20) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        w = np.load(self.path / "emb_weights.npy", mmap_mode="r")
        s = np.load(self.path / "emb_state.npy", mmap_mode="r")
        for a in range(0, len(w), chunk):
            yield a, np.array(w[a : a + chunk]), np.array(s[a : a + chunk])

    def weights(self) -> np.ndarray:
        return np.load(self.path / "emb_weights.npy", mmap_mode="r")


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    dense: dict,
    rows: Iterator[tuple[int, np.ndarray, np.ndarray]],
    num_rows: int,
    dim: int,
    state_dim: int,
) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:08d}"
    tmp = root / f".tmp-{name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    w = np.lib.format.open_memmap(tmp / "emb_weights.npy", mode="w+", dtype=np.float32, shape=(num_rows, dim))
    s = np.lib.format.open_memmap(tmp / "emb_state.npy", mode="w+", dtype=np.float32, shape=(num_rows, state_dim))
    for a, cw, cs in rows:
        w[a : a + len(cw)] = cw
        s[a : a + len(cs)] = cs
    w.flush()
    s.flush()
    del w, s
    torch.save(dense, tmp / "dense.pt")
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(root)
    atomic_write_text(root / "LATEST", name + "\n")
    old = sorted(p for p in root.glob("step-*") if p.name != name)
    for p in old[: max(0, len(old) - (KEEP - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return final


def load_latest(run_dir: str | os.PathLike) -> Checkpoint | None:
    """The newest complete checkpoint of a run, or None when it has none."""
    root = Path(run_dir) / "checkpoints"
    latest = root / "LATEST"
    if not latest.exists():
        return None
    path = root / latest.read_text().strip()
    if not (path / "dense.pt").exists():
        raise CheckpointError(f"{latest} names {path.name}, which is missing or incomplete")
    try:
        # weights_only: a checkpoint holds tensors, numbers and dicts; unpickling anything
        # else (code) from a file someone handed you is refused
        dense = torch.load(path / "dense.pt", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a corrupt or foreign file
        found = re.search(r"unsupported GLOBAL (\S+)", str(e))
        if found:
            raise CheckpointError(
                f"{path / 'dense.pt'}: unreadable: it holds {found.group(1)}, which a bagpipe checkpoint never does; "
                "refusing to load it (it could run code)"
            ) from None
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{path / 'dense.pt'}: unreadable ({first})") from None
    return Checkpoint(path=path, step=int(dense["step"]), dense=dense)


def restore(ckpt: Checkpoint, model: torch.nn.Module, dense_opt: torch.optim.Optimizer, backend, init) -> int:
    """Load checkpoint ``ckpt`` into ``model``, ``dense_opt``, the torch RNG and ``backend``
    (every embedding row and its state); returns the step to continue from."""
    if ckpt.weights().shape != (init.num_rows, init.dim):
        raise CheckpointError(
            f"{ckpt.path}: holds {ckpt.weights().shape[0]} rows of dim {ckpt.weights().shape[1]}, "
            f"this run has {init.num_rows} rows of dim {init.dim}"
        )
    try:
        model.load_state_dict(ckpt.dense["model"])
        dense_opt.load_state_dict(ckpt.dense["dense_optimizer"])
    except (RuntimeError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0]
        raise CheckpointError(f"{ckpt.path}: does not match this run's model/optimizer ({first})") from None
    torch.set_rng_state(ckpt.dense["torch_rng"])
    for a, w, s in ckpt.rows():
        backend.load_rows(a, w, s)
    return ckpt.step
