"""A run's :class:`~bagpipe.budget.estimate.RunShape`: what its memory depends on, read
from its config, its data and its model.

Two figures are measured rather than computed, both cheaply at start-up:

* the unique rows of a batch (U): the most over the first :data:`SAMPLED_BATCHES`
  batches of the run's stream;
* the rows a plan fetches and writes back (:func:`with_traffic`): the run's planner, for
  the cache the run will have, plans the stream's first batches (planning only) and the
  most of a step after the window filled is kept;
* what one training step saves for backward: the model runs forward on random inputs
  of 4 and of 8 samples under ``torch.autograd.graph.saved_tensors_hooks``; the bytes
  of the distinct storages it saves grow by the same amount per sample (the weights it
  saves do not), which, times B, is the step's activations.
"""

from __future__ import annotations

import dataclasses

import numpy as np

import bagpipe.budget.cgroup as cgroup
from bagpipe.budget.estimate import RunShape, Sizes, _oracle
from bagpipe.config.train import TrainConfig
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream
from bagpipe.errors import CapacityError, DataError
from bagpipe.oracle.planners import build_planner
from bagpipe.oracle.sizing import lookups_per_batch
from bagpipe.store import holds_store
from bagpipe.store.disk import layout_name, read_header
from bagpipe.store.diskio import DiskIO
from bagpipe.store.layout import LayoutChoice

#: Batches of the stream whose unique rows are counted.
SAMPLED_BATCHES = 4
#: Optimizer values per dense parameter (torch's Adagrad: sum; Adam: two moments).
DENSE_STATES = {"sgd": 0, "adagrad": 1, "adam": 2, "partial_rowwise_adam": 2}


def saved_bytes_per_sample(model, num_dense: int, num_features: int, dim: int) -> int:
    """Bytes autograd saves for backward per sample of ``model``'s forward (see the module)."""
    import torch

    def measure(b: int) -> int:
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
            return t

        dense = torch.randn(b, num_dense)
        pooled = torch.randn(b, num_features, dim, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(dense, pooled)
        return sum(seen.values())

    return max(0, (measure(8) - measure(4)) // 4)


def unique_rows(stream: BatchStream, batches: int = SAMPLED_BATCHES) -> int:
    """The most unique rows of the stream's first ``batches`` batches."""
    n = min(batches, max(1, stream.batches_per_epoch))
    return max(len(np.unique(stream.batch(k).rows.numpy())) for k in range(n))


def run_shape(cfg: TrainConfig, dataset: Dataset, stream: BatchStream, batch_size: int | None = None) -> RunShape:
    """The shape of the run ``cfg`` over ``dataset``'s train ``stream`` (``batch_size``: a
    data-parallel trainer's share, default the stream's). A run measures it once, in
    :func:`bagpipe.train.preflight.preflight`, and passes it on."""
    import torch

    from bagpipe.models import build_model
    from bagpipe.optim.names import row_state_dim

    meta = dataset.meta
    mcfg = cfg.arch.model_config()
    D, F = mcfg.embedding_dim, meta.num_features
    B = batch_size or stream.batch_size
    # a throwaway model and random inputs (host only): the run's own draws stay as they are
    with torch.random.fork_rng(devices=[]):
        model = build_model(mcfg, meta.num_dense, F)
        params = sum(p.numel() for p in model.parameters())
        per_sample = saved_bytes_per_sample(model, meta.num_dense, F, D)
    del model
    lookups = lookups_per_batch(meta, stream, cfg.run.steps) * B // stream.batch_size
    unique = min(lookups, unique_rows(stream))
    one = stream.batch(0)
    batch_bytes = sum(t.numel() * t.element_size() for t in (one.labels, one.dense, one.rows, one.offsets))
    id_bytes = one.rows.element_size() * max(1, len(one.rows) // max(1, len(one.labels)))
    split_lookups, sample_lookups = _split_lookups(stream, lookups, B)
    making = frequency_peak(meta.total_rows, split_lookups, sample_lookups)
    layout = choose_layout(cfg, stream.batches_per_epoch, making)
    return RunShape(
        spec=cfg.cache.spec,
        store=cfg.cache.store,
        num_rows=meta.total_rows,
        dim=D,
        state_dim=row_state_dim(cfg.optim.optimizer, D),
        batch_size=B,
        num_features=F,
        lookups=lookups,
        unique=unique * B // stream.batch_size if B != stream.batch_size else unique,
        batch_bytes=batch_bytes * B // stream.batch_size,
        dense_params=params,
        dense_states=DENSE_STATES.get(cfg.optim.optimizer, 2),
        saved_bytes=per_sample * B,
        sample_bytes=4 + 4 * meta.num_dense + id_bytes,
        eval_batch=cfg.data.batch_size,
        largest_table=max(meta.table_sizes),
        layout_bytes=layout_bytes(layout, meta.total_rows, split_lookups, sample_lookups),
        layout=layout,
    )


#: ``--store-layout auto`` counts the train split for a frequency layout when the run trains
#: at least this many epochs of it: the count is one pass over the split's ids, 50-100 times
#: faster than training over them (docs/pipeline.md#the-default-layout---store-layout-auto),
#: and the packed pages save a page of kernel work per row fetched or written back.
AUTO_MIN_EPOCHS = 0.5
#: ... and when making the layout peaks at most this (:func:`layout_bytes`: 4 bytes a table
#: row and 20 a row used while counting, 44 a row used while ordering): Criteo-Kaggle's 33.8M
#: rows fit (1.4 GiB if its split uses every row); a table of MLPerf's size (204M rows) is not
#: counted unless asked for (--store-layout frequency).
AUTO_MAX_LAYOUT_BYTES = 2 << 30


def choose_layout(cfg: TrainConfig, batches_per_epoch: int, making: int = 0) -> LayoutChoice | None:
    """The row layout of the run ``cfg``'s disk store (None: the run has none), with why:
    a store the run reopens (``--init-from-store``, a resume's store) keeps its own; a
    data-parallel job's servers keep the identity layout; ``--store-layout identity`` or
    ``frequency`` is taken as given; ``auto`` (the default) applies :func:`auto_layout` to
    the run's ``--steps``, the split's ``batches_per_epoch`` and ``making``, the peak of making
    the frequency layout (:func:`frequency_peak`). A memory budget that does not hold it, or
    holds it only by shrinking the run's cache or read-ahead, and a disk that does not hold
    its row log, turn ``auto``'s frequency into identity (:mod:`bagpipe.train.preflight`)."""
    c = cfg.cache
    if not (c.spec.store and c.store == "disk"):
        return None
    if cfg.distributed:
        return LayoutChoice("identity", "an embedding server's shard keeps the identity layout")
    # RUN/store is emptied at start; a --store-dir's store is reopened by --init-from-store or a resume
    if c.store_dir and (c.init_from_store or (cfg.run.resume and holds_store(c.store_dir))):
        try:
            name = layout_name(c.store_dir)
            packed = int((read_header(c.store_dir).get("layout") or {}).get("packed_rows", 0))
        except (OSError, DataError, TypeError, ValueError):  # the run's own checks say what is wrong
            name, packed = "identity", 0
        why = f"the store in {c.store_dir} keeps the layout it was made with"
        return LayoutChoice(name, why, made=False, packed_rows=packed if name == "frequency" else 0)
    if c.store_layout != "auto":
        return LayoutChoice(c.store_layout, f"--store-layout {c.store_layout}")
    return auto_layout(cfg.run.steps, batches_per_epoch, making)


def auto_layout(steps: int, batches_per_epoch: int, making: int = 0) -> LayoutChoice:
    """``--store-layout auto``'s rule for a store a run of ``steps`` makes over a split of
    ``batches_per_epoch`` batches, whose frequency layout would take ``making`` bytes at its
    peak (:func:`frequency_peak`; :func:`choose_layout`, and the benchmarks' default store):
    the frequency layout from :data:`AUTO_MIN_EPOCHS` of training on, when ``making`` is at
    most :data:`AUTO_MAX_LAYOUT_BYTES`."""
    epochs = steps / max(1, batches_per_epoch)
    trains = f"{epochs:.2g} of an epoch" if epochs < 1 else f"{epochs:.2g} epoch{'' if epochs == 1 else 's'}"
    if epochs < AUTO_MIN_EPOCHS:
        why = (
            f"the run trains {trains}, under {AUTO_MIN_EPOCHS:g}: counting the whole split would cost more "
            "than it saves"
        )
    elif making > AUTO_MAX_LAYOUT_BYTES:
        why = (
            f"counting and ordering the split's rows could take {making / 2**20:,.0f} MiB, more than the "
            f"{AUTO_MAX_LAYOUT_BYTES >> 20:,} MiB auto spends on it"
        )
    else:
        return LayoutChoice(
            "frequency",
            f"--store-layout auto: the run trains {trains} of the train split, so the rows it uses most "
            "are counted (one pass over the split) and packed at the front of the table file",
            auto=True,
        )
    return LayoutChoice(
        "identity", f"--store-layout auto: {why} (--store-layout frequency counts it anyway)", auto=True
    )


def frequency_peak(num_rows: int, split_lookups: int, sample_lookups: int = 1) -> int:
    """Bytes at the peak of making a frequency layout here (:func:`layout_bytes`)."""
    return layout_bytes(LayoutChoice("frequency", "made here"), num_rows, split_lookups, sample_lookups)


def _split_lookups(stream: BatchStream, lookups: int, batch_size: int) -> tuple[int, int]:
    """(lookups of the whole train split, lookups a sample) for ``lookups`` a batch of ``batch_size``."""
    B = max(1, batch_size)
    return stream.num_samples * lookups // B, lookups // B


def counted(shape: RunShape, dataset: Dataset, stream: BatchStream) -> RunShape:
    """``shape`` with its frequency layout's estimate from the rows the train split really
    uses (:func:`bagpipe.data.frequency.rows_used`: one pass over its ids, 1 byte a row of
    the tables) instead of the bound by its lookups, which can be 30 times too high (a
    skewed split looks its hot rows up again and again); ``shape`` itself where there is
    nothing to count (no frequency layout made here, or counted already)."""
    from bagpipe.data.frequency import rows_used

    lay = shape.layout
    if lay is None or lay.name != "frequency" or not lay.made or lay.used_rows:
        return shape
    used = max(1, rows_used(dataset))
    split_lookups, sample_lookups = _split_lookups(stream, shape.lookups, shape.batch_size)
    bound = layout_bytes(lay, shape.num_rows, split_lookups, sample_lookups)
    with_used = dataclasses.replace(lay, used_rows=used)
    need = layout_bytes(with_used, shape.num_rows, split_lookups, sample_lookups)
    why = (
        f"{lay.why}; the split uses {used:,} rows (counted), so the count takes {need / 2**20:,.0f} MiB "
        f"rather than the {bound / 2**20:,.0f} MiB its lookups bound"
    )
    choice = dataclasses.replace(with_used, why=why)
    return dataclasses.replace(shape, layout=choice, layout_bytes=need)


def without_count(shape: RunShape, why: str) -> RunShape:
    """``shape`` with ``auto``'s frequency layout turned into identity (a budget does not hold its count)."""
    assert shape.layout is not None
    plain = LayoutChoice("identity", f"--store-layout auto: {why}", auto=True)
    return dataclasses.replace(shape, layout=plain, layout_bytes=0)


def layout_bytes(choice: LayoutChoice | None, num_rows: int, split_lookups: int, sample_lookups: int = 1) -> int:
    """Peak memory of a disk store's frequency layout (:mod:`bagpipe.store.layout`) made
    here: while the split is counted 4 bytes a row of the tables and 20 a row used, and a
    counting batch's rows twice (:func:`bagpipe.data.frequency.row_use_counts`:
    ``sample_lookups`` int64 a sample, and their sorted copy), then 44 a row used while
    they are ordered (:func:`bagpipe.store.layout.frequency_layout`); what it keeps, 20
    bytes a packed row, and the store's row log beside it (:mod:`bagpipe.store.rowlog`: 12
    bytes a packed row, 4 more for a flush's snapshot), 36 in all, is less. Plus 1 MiB for
    the constant part (the sort's and the stream's own). A reopened store keeps only the
    36 bytes a packed row (its header's count).
    Measured against ``tracemalloc`` in tests/unit/store/test_stores.py. 0 without one."""
    if choice is None or choice.name != "frequency":
        return 0
    from bagpipe.data.frequency import COUNT_BATCH

    if not choice.made:
        return 36 * choice.packed_rows + (1 << 20)
    used = choice.used_rows or min(num_rows, split_lookups)
    counting = 4 * num_rows + 20 * used + 16 * COUNT_BATCH * sample_lookups
    return max(counting, 44 * used) + (1 << 20)


def with_traffic(shape: RunShape, stream: BatchStream, cache_rows: int, lookahead: int, steps: int) -> RunShape:
    """``shape`` with the most rows a plan fetches and writes back, found by planning
    the stream's first batches with the run's planner (no rows move): 2L + 9 batches for
    the lookahead oracle (its window fills after L), 24 for the others, at most ``steps``.
    With a hot tier, pass its rows in ``cache_rows`` too (the planner then sees every row:
    an upper bound of the cold rows' traffic). A planner that would take half of the
    memory there is (the cgroup's limit, else the machine's) is not built: the estimate
    then counts a batch's unique rows, and the run is sized or refused before it allocates."""
    spec = shape.spec
    if spec.planner is None:
        return shape
    L = max(1, lookahead)
    room = _room()
    if room is not None and _oracle(shape, Sizes(cache_rows, 0, L, 0, DiskIO()))[0] > room // 2:
        return shape
    n = min(steps, max(1, stream.batches_per_epoch) * 4, 2 * L + 9 if spec.looks_ahead else 24)
    planner = build_planner(spec.planner, shape.num_rows, cache_rows, L, None)
    fetch = evict = 0
    first, last = (min(L, n // 2), n - L - 1) if spec.looks_ahead else (min(8, n // 2), n)
    try:
        for plan in planner.plans(stream.numbered(0, n)):
            # after the cache and the window have filled, before the last L plans (whose
            # rows all expire because the stream planned ends)
            if first <= plan.step <= max(first, last):
                fetch = max(fetch, len(plan.fetch_rows))
                evict = max(evict, len(plan.evict_before_rows) + len(plan.evict_after_rows))
    except CapacityError:  # a batch too wide for this cache: the run says so itself; estimate with U
        return shape
    del planner
    return dataclasses.replace(shape, fetch_rows=fetch or shape.unique, evict_rows=evict or shape.unique)


def _room() -> int | None:
    """The memory there is: this process's cgroup's limit, else the machine's (None: unknown)."""
    limit, _ = cgroup.own_limit()
    return limit if limit is not None else cgroup.machine_memory()[0]
