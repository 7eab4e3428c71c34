"""The checkpoint format: one for every mode and topology (format version 2).

A checkpoint is a folder ``RUN/checkpoints/step-NNNNNNNN/``::

    MANIFEST.json          what the checkpoint is (written last, atomically): the step,
                           the row space (rows, D, S), whether its rows are *full* or a
                           *delta* on the previous checkpoint (``base``), and its parts
    dense.pt               model, dense optimizer, torch RNG state and step (trainer 0)
    rows-K-of-S.npy        a full part: every row g with g % S == K, in local order
                           l = g // S, as (n_K, D + S_state) float32 (weights then state)
    delta-K-of-S.ids.npy   a delta part: the global rows of shard K that changed since
    delta-K-of-S.npy       ``base``, ascending (m,) int64, and their values (m, D + S_state)

One process is shard 0 of 1; in a distributed job each embedding server writes its own
part, in parallel, straight into the checkpoint folder. Rows are named by global row,
so a checkpoint written by S servers restores onto any number of servers, or onto one
process, and the other way round. A delta checkpoint holds only rows changed since the
previous checkpoint; every ``compact_every``-th checkpoint is full again, so the chain
a restore reads stays short (:class:`bagpipe.checkpoint.reader.CheckpointReader`).

A checkpoint counts only once ``MANIFEST.json`` exists (written after every part is
fsynced) and ``LATEST`` names it; a crash at any moment leaves the previous
checkpoint whole.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from bagpipe.data.schema import read_json
from bagpipe.errors import CheckpointError
from bagpipe.files import atomic_write_text

FORMAT = "bagpipe.checkpoint"
VERSION = 2
MANIFEST = "MANIFEST.json"
DENSE = "dense.pt"
LATEST = "LATEST"

Kind = Literal["full", "delta"]


def full_name(shard: int, shards: int) -> str:
    return f"rows-{shard}-of-{shards}.npy"


def delta_names(shard: int, shards: int) -> tuple[str, str]:
    return f"delta-{shard}-of-{shards}.ids.npy", f"delta-{shard}-of-{shards}.npy"


def step_name(step: int) -> str:
    return f"step-{step:08d}"


@dataclass
class Part:
    """One shard's rows in a checkpoint."""

    shard: int
    shards: int
    kind: Kind
    rows: int  # rows in the part (n_K for a full part, m for a delta)
    bytes: int = 0

    @property
    def files(self) -> list[str]:
        return (
            [full_name(self.shard, self.shards)] if self.kind == "full" else list(delta_names(self.shard, self.shards))
        )


@dataclass
class Manifest:
    """What a checkpoint folder holds (its MANIFEST.json)."""

    step: int
    num_rows: int
    dim: int
    state_dim: int
    kind: Kind
    base: str | None  # a delta's previous checkpoint (folder name); None for a full one
    parts: list[Part] = field(default_factory=list)
    chain: int = 0  # deltas since the last full checkpoint (0 for a full one)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, d: dict, where: Path) -> Manifest:
        if d.get("format") != FORMAT or d.get("version") != VERSION:
            raise CheckpointError(f"{where}: not a bagpipe checkpoint of format version {VERSION}")
        try:
            parts = [Part(**p) for p in d["parts"]]
            return cls(
                step=int(d["step"]),
                num_rows=int(d["num_rows"]),
                dim=int(d["dim"]),
                state_dim=int(d["state_dim"]),
                kind=d["kind"],
                base=d["base"],
                parts=parts,
                chain=int(d.get("chain", 0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: malformed manifest ({e})") from None

    def save(self, folder: Path) -> None:
        atomic_write_text(folder / MANIFEST, json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, folder: Path) -> Manifest:
        path = Path(folder) / MANIFEST
        if not path.exists():
            raise CheckpointError(f"{folder}: incomplete checkpoint (no {MANIFEST})")
        return cls.from_json(read_json(path), path)

    def check_parts(self, folder: Path) -> None:
        """Every part's files exist; the shards cover the row space once."""
        shards = {p.shards for p in self.parts}
        if len(shards) != 1 or sorted(p.shard for p in self.parts) != list(range(shards.pop())):
            raise CheckpointError(f"{folder}: its parts do not cover the row space once")
        for p in self.parts:
            for f in p.files:
                if not (Path(folder) / f).exists():
                    raise CheckpointError(f"{folder / f}: missing (the checkpoint is damaged)")
