"""What a run needs in memory, part by part: the one estimate ``bagpipe plan`` prints and
``bagpipe train`` sizes itself by.

The parts (:func:`estimate`; MiB in ``bagpipe plan``):

* **interpreter and torch**: Python with torch, numpy and bagpipe loaded, and what torch's
  first optimizer imports (``torch._dynamo``, sympy): a constant measured on this build;
* **dense model and optimizer**: the parameters, their gradients and optimizer state, and
  what one training step holds at its peak: the tensors autograd saves for backward (
  measured on the model itself, :func:`bagpipe.budget.shape.run_shape`), the pooled
  (B, F, D) embeddings and the (U, D) rows with their gradients;
* **cache**: C slots of D weights and S state values, and each slot's row (+ the
  planner's per-slot bookkeeping);
* **hot tier**: H slots the same way, and the hot rows' bitmap (R/8 + R/16 bytes);
* **staging**: the plans in flight (a plan's batch, inverse map, rows and slots), the
  rows fetched for the ``staged`` plans read ahead, the write-back queue (as many
  groups), and the disk store's reused I/O buffers (one per reading or writing thread);
* **oracle**: the planner's state: the lookahead oracle's row map (one int32 a row, or
  a window-sized map past 256 MiB), its ring of the 2L+1 batches' occurrences and the L
  batches it reads ahead; LRU's row-to-slot map;
* **store**: the memory store's tables (R rows), or the disk store's presence bitmaps;
  ``--mode full``: the full tables;
* **store page cache**: what the run pins in the page cache: the disk store's dirty
  pages (its bound) and pages in flight, and the data shards' pages of a batch. The
  page cache beyond this is reclaimable: a memory cgroup's limit takes it back;
* **evaluation and digest**: what an evaluation or the final digest holds beyond a
  training step (they do not overlap with one);
* **checkpoint cut**: what a checkpoint's cut holds when it streams (mid-run and at the
  end of the run): the bitmaps of the rows it takes (R/8 bytes each), one chunk of rows
  read, copied and written, the part files' pages not yet written back (two chunks), the
  cache's rows sorted. A cut whose whole copy fits in what the budget leaves
  (:func:`cut_bytes`) copies instead, and its part is written while training goes on.

Every constant below was measured (docs/beyond-memory.md#the-estimate); tests and
``bagpipe bench memory`` hold the total against the measured peak of real runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from bagpipe.config.modes import ModeSpec
from bagpipe.store.diskio import DiskIO
from bagpipe.store.layout import LayoutChoice

MIB = 1 << 20

#: Anonymous memory of a trainer before its tables, cache and data: Python, torch,
#: numpy, bagpipe, and torch._dynamo + sympy, which torch's first optimizer imports
#: (68 MiB of it); measured with torch 2.13 (CPU) on Linux x86-64.
BASE_TRAINER = 220 * MIB
#: The same for an embedding server or the oracle role. They start as `bagpipe worker`,
#: whose imports reach torch.optim like a trainer's: `bench memory --quick` measured a
#: server's peak at 221 MiB of anonymous memory against an estimate of 173 with 155 here
#: (newcomer round 21; 2026-11-27, torch 2.13 CPU), so the trainer's constant.
BASE_ROLE = 220 * MIB
#: A training step's peak over the tensors autograd saves for backward (the forward's
#: transients, the gradients of the largest activations, the allocator's slack).
ACTIVATION_FACTOR = 2.0
#: Bytes of the planner's bookkeeping per cache slot (the oracle's slot_seq and free
#: stack; LRU's slot row and last use) beside the cache's own slot_rows.
SLOT_BOOKKEEPING = 24
#: Bytes a lookahead oracle that retains rows past their window keeps per slot: the row and
#: its last use (8 + 4), and the queue of retained slots (at most 2C int32). Counted for every
#: oracle (a data-parallel one retains nothing).
RETAINED_SLOT = 20
#: A lookahead oracle's row map is one int32 per row up to this size, then a window map.
DENSE_MAP_BYTES = 256 * MIB
#: Bytes per occurrence of the oracle's ring (row, previous, next use, slot, eviction).
RING_ENTRY = 28


@dataclass(frozen=True)
class Part:
    """One part of the estimate."""

    name: str
    bytes: int
    note: str = ""

    @property
    def mib(self) -> float:
        return self.bytes / MIB


@dataclass(frozen=True)
class Estimate:
    """A process's memory, part by part (bytes); ``total`` is their sum."""

    role: str
    parts: tuple[Part, ...]

    @property
    def total(self) -> int:
        return sum(p.bytes for p in self.parts)

    @property
    def mib(self) -> float:
        return self.total / MIB

    def part(self, name: str) -> int:
        return sum(p.bytes for p in self.parts if p.name == name)

    def as_dict(self) -> dict:
        """``{"role", "total_mb", "parts_mb": {name: MiB}}`` for summary.json and results."""
        return {
            "role": self.role,
            "total_mb": round(self.mib, 1),
            "parts_mb": {p.name: round(p.mib, 1) for p in self.parts},
        }

    def lines(self) -> list[str]:
        """One aligned line per part, then the total (``bagpipe plan``)."""
        width = max(len(p.name) for p in self.parts)
        out = [f"  {p.name:<{width}}  {p.mib:8.1f} MiB  {p.note}".rstrip() for p in self.parts]
        return out + [f"  {'total':<{width}}  {self.mib:8.1f} MiB"]


@dataclass(frozen=True)
class RunShape:
    """What of a run its memory depends on, besides the sizes a budget chooses
    (:func:`bagpipe.budget.shape.run_shape` reads it from the config, the data and the model).

    Attributes:
        spec: the mode.
        store: ``memory`` or ``disk``.
        num_rows: R.
        dim, state_dim: D and S.
        batch_size: B (a trainer's share in a data-parallel job).
        num_features: F.
        lookups: a bound of one batch's lookups (B*F for one-hot data).
        unique: the most unique rows of the batches sampled at start-up (U).
        batch_bytes: one batch's tensors (labels, dense, rows, offsets).
        dense_params: parameters of the dense model.
        dense_states: optimizer values per dense parameter (Adagrad 1, Adam 2, SGD 0).
        saved_bytes: bytes autograd saves for backward in one step at batch B.
        sample_bytes: bytes of one sample in the data shards (labels, dense, ids).
        eval_batch: samples per evaluation batch.
        largest_table: rows of the largest table (the hot-row profiler counts per table).
        fetch_rows, evict_rows: the most rows one plan fetches / writes back
            (:func:`bagpipe.budget.shape.with_traffic`; None: U, the bound).
        layout_bytes: a disk store's frequency layout: its count of the train split's rows
            at start-up (a store made here) and the packed rows it keeps.
        layout: the row layout of the run's disk store and why (None without one).
        plans_received: plans a distributed trainer's receiver may hold ahead of its step
            (``--plans-in-flight``; 0 outside a distributed trainer).
        trainers: N, the data-parallel trainers (a trainer's plan lists the slots of the
            global batch's synchronised rows: up to N times its own unique rows).
    """

    spec: ModeSpec
    store: str
    num_rows: int
    dim: int
    state_dim: int
    batch_size: int
    num_features: int
    lookups: int
    unique: int
    batch_bytes: int
    dense_params: int
    dense_states: int
    saved_bytes: int
    sample_bytes: int
    eval_batch: int
    largest_table: int = 0
    fetch_rows: int | None = None
    evict_rows: int | None = None
    layout_bytes: int = 0
    layout: LayoutChoice | None = None
    plans_received: int = 0
    trainers: int = 1

    @property
    def row_bytes(self) -> int:
        return 4 * (self.dim + self.state_dim)


@dataclass(frozen=True)
class Sizes:
    """What a budget chooses for a run (the budget's fit, :mod:`bagpipe.budget.sizing`).

    Attributes:
        cache_rows: C (a mode without a sized cache stages one batch: C = lookups).
        hot_rows: H.
        lookahead: L (the oracle's window; 0 for the other planners).
        staged: plans whose rows are fetched ahead of the step (the executor's depth;
            0 for the synchronous executors).
        io: the disk store's memory settings.
    """

    cache_rows: int
    hot_rows: int
    lookahead: int
    staged: int
    io: DiskIO

    def as_dict(self) -> dict:
        io = self.io
        return {
            "cache_rows": self.cache_rows,
            "hot_rows": self.hot_rows,
            "lookahead": self.lookahead,
            "staged_plans": self.staged,
            "io_threads": io.threads,
            "hint_mb": io.hint_bytes / MIB,
            "dirty_mb": None if io.dirty_bytes is None else io.dirty_bytes / MIB,
            "page_cache_mb": None if io.page_cache_bytes is None else io.page_cache_bytes / MIB,
            "chunk_rows": io.chunk_rows,
        }


def _oracle(shape: RunShape, sizes: Sizes) -> tuple[int, str]:
    """The planner's state and the batches it holds ahead."""
    s, R = shape.spec, shape.num_rows
    if s.planner is None:
        return 0, ""
    if s.looks_ahead:
        L, C = max(1, sizes.lookahead), sizes.cache_rows
        # a window map also keeps the entries of the rows retained past their window (up to C)
        row_map = 4 * R if 4 * R <= DENSE_MAP_BYTES else 3 * (2 * L + 1) * shape.unique * 12 + 16 * C
        need = (2 * L + 1) * shape.unique * 9 // 8
        cap = 1 << max(14, (max(1, need) - 1).bit_length())
        ring = cap * RING_ENTRY
        ahead = (L + 1) * (shape.batch_bytes + 8 * shape.lookups + 8 * shape.unique)
        kept = C * RETAINED_SLOT
        note = f"row map {row_map / MIB:.0f}, ring {ring / MIB:.0f}, retained slots {kept / MIB:.0f}, {L + 1} batches ahead"
        return row_map + ring + ahead + kept, note
    if s.sized_cache:  # lru: one int32 per row
        return 4 * R, "row-to-slot map"
    return 0, ""


ROLES = ("trainer", "remote-trainer", "oracle")

#: The estimate's part that a checkpoint's cut streams within (:func:`cut_bytes`).
CUT = "checkpoint cut"


def cut_part(num_rows: int, row_bytes: int, chunk_rows: int, cache_rows: int) -> Part:
    """What a streamed checkpoint cut holds (:class:`bagpipe.checkpoint.parts.RowCut`): two
    bitmaps of the rows, a chunk read (rows, weights and state), its copy into the part's
    layout, the part files' dirty pages (two chunks' bytes), and the cache's (rows, slots)
    sorted for the overlay."""
    chunk = chunk_rows * (4 * row_bytes + 24)
    return Part(CUT, 2 * ((num_rows + 7) // 8) + chunk + 16 * cache_rows, f"streamed in chunks of {chunk_rows:,} rows")


def cut_bytes(est: Estimate, usable: int) -> int:
    """What a checkpoint's cut may hold at once under a budget of ``usable`` bytes: its
    own part of the estimate ``est`` and whatever the budget leaves beyond the estimate
    (the cut's copy is held while the end of the run evaluates and hashes)."""
    return usable - est.total + est.part(CUT)


def estimate(shape: RunShape, sizes: Sizes, role: str = "trainer") -> Estimate:
    """The memory of one process of the run ``shape`` with ``sizes``, by ``role``:

    ``trainer``: a one-process run (its planner and store in the process);
    ``remote-trainer``: a trainer of a distributed job (its rows on embedding servers,
    its plans from the oracle role: neither oracle nor store here);
    ``oracle``: the oracle role of a distributed job (the planner and the plans it sends).
    """
    assert role in ROLES, role
    s, R, rb = shape.spec, shape.num_rows, shape.row_bytes
    D, U, B, F = shape.dim, shape.unique, shape.batch_size, shape.num_features
    plan = shape.batch_bytes + 8 * shape.lookups + 40 * U  # batch, inverse, rows, slots, next use
    if role == "oracle":
        ob, note = _oracle(shape, sizes)
        return Estimate(
            role,
            (
                Part("interpreter and torch", BASE_ROLE, "measured constant"),
                Part("oracle", ob, note),
                Part("staging", 2 * (sizes.staged + 2) * plan, "plans queued for the trainers"),
            ),
        )
    remote = role == "remote-trainer"
    parts = [Part("interpreter and torch", BASE_TRAINER, "measured constant")]
    emb = 4 * (B * F * D * 2 + U * D * 4)  # pooled (+ its gradient); rows, gradient, update, state
    act = int(ACTIVATION_FACTOR * shape.saved_bytes)
    dense = 4 * shape.dense_params * (2 + shape.dense_states)
    parts.append(Part("dense model and optimizer", dense + act + emb, f"{shape.dense_params:,} parameters; a step"))
    if not s.store:  # --mode full: every table in this process
        parts.append(Part("store", R * (4 * D + 4 * shape.state_dim + 1), "the full tables (R rows)"))
    else:
        C, H = sizes.cache_rows, sizes.hot_rows
        parts.append(Part("cache", C * (rb + 8 + SLOT_BOOKKEEPING), f"{C:,} slots"))
        if H:
            parts.append(Part("hot tier", H * (rb + 8) + R // 8 + R // 16, f"{H:,} rows"))
        staged = sizes.staged
        fetch = shape.fetch_rows if shape.fetch_rows is not None else U
        evict = shape.evict_rows if shape.evict_rows is not None else U
        if s.pipelined:  # the plan and ready queues (staged each), one in the fetcher's and one in the trainer's hands
            held = (2 * staged + 2) * plan + (staged + 2) * fetch * rb + (staged + 2) * evict * rb
        else:
            held = 2 * plan + 2 * fetch * rb + evict * rb
        buffers = 0
        if shape.store == "disk" and not remote:  # the fetch, trainer and writer threads' reused I/O buffers
            round_ = sizes.io.round_rows() * rb
            buffers = 2 * round_ + max(round_, sizes.io.chunk_rows * rb)
        parts.append(
            Part(
                "staging",
                held + buffers,
                f"{staged} plan{'' if staged == 1 else 's'} read ahead, {fetch:,} rows fetched a step",
            )
        )
        if remote and shape.plans_received:  # the plan receiver's inbox (bagpipe.distributed.oracle_role)
            n, received = shape.plans_received, plan + 8 * shape.trainers * U  # + the global batch's synced slots
            parts.append(Part("plans received", n * received, f"up to {n} from the oracle ahead of the step"))
        if not remote:
            ob, note = _oracle(shape, sizes)
            if ob:
                parts.append(Part("oracle", ob, note))
            if shape.store == "memory":
                parts.append(Part("store", R * (rb + 1), "memory store: every row"))
            else:
                parts.append(Part("store", 3 * ((R + 7) // 8), "presence bitmaps"))
                if shape.layout_bytes:
                    made = shape.layout is None or shape.layout.made
                    what = (
                        "the train split's rows counted, the packed rows kept" if made else "its packed rows (reopened)"
                    )
                    parts.append(Part("store layout", shape.layout_bytes, what))
    pinned = 2 * shape.sample_bytes * B
    if s.store and shape.store == "disk" and not remote:
        pinned += (sizes.io.dirty_bytes or 64 * MIB) + min(sizes.io.hint_bytes, 4096 * (shape.unique + 1))
    parts.append(Part("store page cache", pinned, "pinned: dirty pages, reads in flight, a batch's shards"))
    E = shape.eval_batch
    ev = 4 * (E * F * D + U * D * 2) + shape.saved_bytes * E // max(B, 1) // 2  # no autograd: transients only
    digest = 2 * (sizes.io.chunk_rows if s.store else 1 << 16) * rb
    extra = max(0, max(ev, digest) - act - emb)
    parts.append(Part("evaluation and digest", extra, "beyond a training step"))
    if not remote:  # a trainer of a distributed job copies no rows at a cut: its servers do
        chunk = sizes.io.chunk_rows if s.store else 1 << 16
        parts.append(cut_part(R, rb, chunk, sizes.cache_rows if s.store else 0))
    return Estimate(role, tuple(parts))


def estimate_server(num_rows: int, dim: int, state_dim: int, store: str, io: DiskIO, request_rows: int) -> Estimate:
    """An embedding server holding ``num_rows`` rows of its shard: its store, its I/O
    buffers, the requests in flight (``request_rows`` rows each way)."""
    rb = 4 * (dim + state_dim)
    parts = [Part("interpreter and torch", BASE_ROLE, "measured constant")]
    if store == "memory":
        parts.append(Part("store", num_rows * (rb + 1), "memory store: every row of the shard"))
    else:
        parts.append(Part("store", 3 * ((num_rows + 7) // 8), "presence bitmaps"))
        parts.append(Part("staging", 2 * io.scratch_bytes(rb) + 4 * request_rows * rb, "I/O buffers, requests"))
        pinned = (io.dirty_bytes or 64 * MIB) + min(io.hint_bytes, 4096 * (request_rows + 1))
        parts.append(Part("store page cache", pinned, "pinned: dirty pages, reads in flight"))
    digest = 2 * io.chunk_rows * rb
    parts.append(Part("evaluation and digest", digest, "a digest or checkpoint chunk"))
    return Estimate("server", tuple(parts))
