"""The checkpoint format: one for every mode and topology (format version 5; versions 2 to 4 are read).

A checkpoint is a folder ``RUN/checkpoints/step-NNNNNNNN/``::

    MANIFEST.json          what the checkpoint is (written last, atomically): the step,
                           the row space (rows, D, S) and the initialiser's identity
                           (seed, table sizes), whether its rows are *full* or a *delta*
                           on the previous checkpoint (``base``), its parts, and the size
                           and CRC-32 of every file (``sums`` of each part, ``dense_sum``),
                           and the CRC-32 of its own content (``manifest_crc32``)
    dense.pt               model, dense optimizer, torch RNG state and step (trainer 0)
    full-K-of-S.ids.npy    a full part: the global rows g of shard K (g % S == K) whose
    full-K-of-S.npy        value may differ from their initial one, ascending (m,) int64,
                           and their values (m, D + S_state) float32 (weights then state)
    delta-K-of-S.ids.npy   a delta part: the rows of shard K written since ``base``,
    delta-K-of-S.npy       ascending, and their values

Rows are stored **relative to the initial tables**: a row never written since
initialisation is in no part, and reads as its initial value -- a pure function of
(seed, row) (:class:`bagpipe.store.init.RowInitializer`) -- with zero optimizer state.
A checkpoint therefore costs what was trained, not what the tables hold: the first one
of a run is as small as the rows trained so far, and a delta as small as the rows
written since the previous checkpoint.

One process is shard 0 of 1; in a distributed job each embedding server writes its own
part, in parallel, straight into the checkpoint folder. Rows are named by global row,
so a checkpoint written by S servers restores onto any number of servers, or onto one
process, and the other way round. Every ``compact_every``-th checkpoint is full again
(merged from the chain in the background, :func:`bagpipe.checkpoint.parts.write_part`),
so the chain a restore reads stays short (:class:`bagpipe.checkpoint.reader.CheckpointReader`).

Version 2 (read, never written) stored a full part as every row of the shard in local
order (``rows-K-of-S.npy``, (n_K, D + S)); its deltas are as above.

A checkpoint counts only once ``MANIFEST.json`` exists (written after every part is
fsynced) and ``LATEST`` names it; a crash at any moment leaves the previous
checkpoint whole.

Version 4 added the files' sizes and CRC-32s, taken as the files are written and checked
before a checkpoint (and the chain under it) is read (:mod:`bagpipe.checkpoint.verify`);
versions 2 and 3 are checked by size only. An older bagpipe refuses a version-4
checkpoint in one line (it reads 2 and 3).

Version 5 added ``manifest_crc32``: the CRC-32 of the manifest's own canonical content
(:func:`bagpipe.filesums.seal`), so that a change that keeps valid JSON -- a step, the
seed, D or S one bit off -- is a damaged checkpoint file rather than a checkpoint read
wrongly. The rule: a manifest that carries ``manifest_crc32`` is checked against it
first, whatever version it says (a flipped version digit is found too); a version-5
manifest must carry it; versions 2 to 4, written before, carry none and are read as
before (their files' sums are still checked). An older bagpipe refuses a version-5
checkpoint in one line (it reads 2 to 4).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from bagpipe.checkpoint.verify import FileSum, check_file, check_npy_size, not_a_file
from bagpipe.data.schema import read_json
from bagpipe.errors import CheckpointError, DataError
from bagpipe.files import atomic_write_text
from bagpipe.filesums import seal, sealed_problem
from bagpipe.jsonout import json_text

FORMAT = "bagpipe.checkpoint"
VERSION = 5
READS = (2, 3, 4, 5)  # format versions this bagpipe reads
SEALED = 5  # the first version whose manifest must carry the CRC-32 of its content
MANIFEST = "MANIFEST.json"
MANIFEST_SUM = "manifest_crc32"  # the key of that CRC-32
DENSE = "dense.pt"
LATEST = "LATEST"

Kind = Literal["full", "delta"]


def dense_name(shard: int, shards: int) -> str:
    """A version-2 full part: every row of the shard, in local order."""
    return f"rows-{shard}-of-{shards}.npy"


def part_names(kind: Kind, shard: int, shards: int) -> tuple[str, str]:
    """(ids file, values file) of a sparse part."""
    return f"{kind}-{shard}-of-{shards}.ids.npy", f"{kind}-{shard}-of-{shards}.npy"


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def is_step_name(name: str) -> bool:
    """Whether ``name`` is a checkpoint folder's name (:func:`step_name`): ``step-`` and 8 or
    more digits, nothing else -- a user's ``step-00000010.bak`` beside them is not one."""
    digits = name.removeprefix("step-")
    return name.startswith("step-") and len(digits) >= 8 and digits.isascii() and digits.isdigit()


@dataclass
class Part:
    """One shard's rows in a checkpoint."""

    shard: int
    shards: int
    kind: Kind
    rows: int  # rows in the part
    bytes: int = 0
    dense: bool = False  # a version-2 full part: every row of the shard, no ids file
    sums: dict[str, FileSum] = field(default_factory=dict)  # file -> size, CRC-32 (empty before version 4)

    def __post_init__(self) -> None:  # from a manifest's (or a server's) JSON
        self.sums = {str(name): FileSum.of(s) for name, s in self.sums.items()}

    @property
    def files(self) -> list[str]:
        return (
            [dense_name(self.shard, self.shards)]
            if self.dense
            else list(part_names(self.kind, self.shard, self.shards))
        )


@dataclass(frozen=True)
class InitialRows:
    """Which initial tables the rows are relative to: what re-derives a row never written."""

    seed: int
    table_sizes: list[int]


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
    init: InitialRows | None = None  # None only in version 2 (its full parts hold every row)
    version: int = VERSION
    dense_sum: FileSum | None = None  # dense.pt's size and CRC-32 (None before version 4)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("version")
        for p in d["parts"]:
            p.pop("dense")
        return seal({"format": FORMAT, "version": VERSION, **d}, MANIFEST_SUM)

    @classmethod
    def from_json(cls, d: dict, where: Path) -> Manifest:
        version = d.get("version")
        problem = sealed_problem(d, MANIFEST_SUM, "version", SEALED)
        if problem is not None:
            raise CheckpointError(f"{where}: damaged checkpoint file: {problem}")
        if d.get("format") != FORMAT or version not in READS:
            raise CheckpointError(
                f"{where}: not a bagpipe checkpoint of format version {', '.join(map(str, READS[:-1]))} or {READS[-1]} "
                f"(it says {d.get('format')!r} version {version!r})"
            )
        try:
            parts = [Part(**p, dense=version == 2 and p["kind"] == "full") for p in d["parts"]]
            init = d.get("init")
            if version >= 3 and not init:
                raise KeyError("init")
            m = cls(
                step=int(d["step"]),
                num_rows=int(d["num_rows"]),
                dim=int(d["dim"]),
                state_dim=int(d["state_dim"]),
                kind=d["kind"],
                base=d["base"],
                parts=parts,
                chain=int(d.get("chain", 0)),
                init=InitialRows(int(init["seed"]), [int(n) for n in init["table_sizes"]]) if init else None,
                version=int(version),
                dense_sum=FileSum.of(d["dense_sum"]) if version >= 4 else None,
            )
            if version >= 4:
                for p in m.parts:
                    for f in p.files:
                        if f not in p.sums:
                            raise KeyError(f"sums of {f}")
            return m
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: malformed manifest ({e})") from None

    def save(self, folder: Path) -> None:
        atomic_write_text(folder / MANIFEST, json_text(self.to_json(), indent=1))

    @classmethod
    def load(cls, folder: Path) -> Manifest:
        path = Path(folder) / MANIFEST
        if not path.exists():
            raise CheckpointError(f"{folder}: incomplete checkpoint (no {MANIFEST})")
        if (wrong := not_a_file(path)) is not None:
            raise wrong
        try:
            d = read_json(path)
        except DataError as e:  # a MANIFEST that does not parse is a damaged checkpoint file like any other
            raise CheckpointError(f"{e} (a damaged checkpoint file)") from None
        if not isinstance(d, dict):
            raise CheckpointError(f"{path}: malformed manifest (not a JSON object; a damaged checkpoint file)")
        return cls.from_json(d, path)

    @property
    def rows(self) -> int:
        """Rows the parts hold, in all."""
        return sum(p.rows for p in self.parts)

    @property
    def bytes(self) -> int:
        """Bytes of the parts, in all."""
        return sum(p.bytes for p in self.parts)

    def check_parts(self, folder: Path) -> None:
        """Every part's files exist; the shards cover the row space once."""
        shards = {p.shards for p in self.parts}
        if len(shards) != 1 or sorted(p.shard for p in self.parts) != list(range(shards.pop())):
            raise CheckpointError(f"{folder}: its parts do not cover the row space once")
        for p in self.parts:
            for f in p.files:
                if not (Path(folder) / f).exists():
                    raise CheckpointError(f"{folder / f}: missing (the checkpoint is damaged)")

    def verify(self, folder: Path, dense: bool = True) -> None:
        """Every file of this checkpoint (not of its base) is whole: its parts cover the row
        space and each file has the size and CRC-32 this manifest recorded (versions 2 and
        3: each .npy file is as long as its header says, and a version-3 part's files add
        up to its bytes); ``dense``: dense.pt too. Else a one-line CheckpointError naming the file."""
        folder = Path(folder)
        self.check_parts(folder)
        for p in self.parts:
            if p.sums:
                for f in p.files:
                    check_file(folder / f, p.sums[f])
                continue
            total = sum(check_npy_size(folder / f) for f in p.files)
            if self.version == 3 and total != p.bytes:
                raise CheckpointError(
                    f"{folder / p.files[-1]}: damaged checkpoint file: the part's files hold {total:,} bytes, "
                    f"the manifest says {p.bytes:,}"
                )
        if dense and self.dense_sum is not None:
            check_file(folder / DENSE, self.dense_sum)
