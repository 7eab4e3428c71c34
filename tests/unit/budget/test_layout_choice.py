"""Which row layout a run's disk store gets (``--store-layout``, default ``auto``:
:func:`bagpipe.budget.shape.choose_layout`), and what its memory estimate counts for it.

* ``auto`` picks the frequency layout from half an epoch of training on, the identity
  layout below and for tables whose count would take more than 256 MiB, and says why in
  one line;
* a value given is taken; a data-parallel job's servers keep the identity layout; a store
  the run reopens (``--init-from-store``) keeps its own, and the estimate then counts what
  it keeps (its packed rows and row log), not a count of the split it does not make --
  measured against ``tracemalloc``.
"""

from __future__ import annotations

import numpy as np
import pytest

from bagpipe.budget.shape import AUTO_MAX_COUNT_BYTES, AUTO_MIN_EPOCHS, auto_layout, choose_layout, layout_bytes
from bagpipe.config.train import TrainConfig
from bagpipe.store.layout import LayoutChoice, RowLayout

pytestmark = pytest.mark.unit

DISK = dict(data="d", out="o", mode="lookahead", store="disk")


def test_auto_counts_the_split_from_half_an_epoch_on():
    assert AUTO_MIN_EPOCHS == 0.5
    at = auto_layout(50, 100)
    below = auto_layout(49, 100)
    assert (at.name, at.auto, at.made) == ("frequency", True, True)
    assert "trains 0.5 of an epoch of the train split" in at.why and "counted" in at.why
    assert "trains 1 epoch of" in auto_layout(100, 100).why and "trains 2.5 epochs of" in auto_layout(250, 100).why
    assert below.name == "identity" and "0.49 of an epoch" in below.why and "--store-layout frequency" in below.why
    assert auto_layout(1, 0).name == "frequency"  # a split shorter than a batch: one pass is one batch
    # a table whose count would take more than 256 MiB (MLPerf's 204M rows: 816 MB) is not counted unasked
    assert auto_layout(100, 10, num_rows=AUTO_MAX_COUNT_BYTES // 4).name == "frequency"
    big = auto_layout(100, 10, num_rows=204_000_000)
    assert big.name == "identity" and "counting the uses of 204,000,000 rows takes 778 MiB" in big.why


def test_the_choice_follows_the_options():
    assert choose_layout(TrainConfig.of(data="d", out="o", mode="full", steps=10), 10) is None  # no store
    assert choose_layout(TrainConfig.of(**(DISK | {"store": "memory"}), steps=100), 10) is None
    assert choose_layout(TrainConfig.of(**DISK, steps=100), 10, 1000) == auto_layout(100, 10, 1000)
    assert choose_layout(TrainConfig.of(**DISK, steps=100), 10, 10**9).name == "identity"  # its count: 3.7 GiB
    assert choose_layout(TrainConfig.of(**DISK, steps=2), 10) == auto_layout(2, 10)
    given = choose_layout(TrainConfig.of(**DISK, steps=100, store_layout="identity"), 10)
    assert given == LayoutChoice("identity", "--store-layout identity")
    given = choose_layout(TrainConfig.of(**DISK, steps=2, store_layout="frequency"), 10)
    assert given == LayoutChoice("frequency", "--store-layout frequency")
    job = choose_layout(TrainConfig.of(**DISK, steps=100, trainers=2, servers=1), 10)
    assert job is not None and job.name == "identity" and "server" in job.why


def _frequency_store(path, rows: int = 5000, packed: int = 5000) -> None:
    from bagpipe.store.disk import DiskStore
    from bagpipe.store.init import RowInitializer

    layout = RowLayout(np.arange(packed, dtype=np.int64)[::-1].copy())
    with DiskStore(RowInitializer([rows], 8, 0), 1, path, layout=layout):
        pass


def test_a_reopened_store_keeps_its_layout_and_the_estimate_counts_what_it_keeps(tmp_path):
    import tracemalloc

    from bagpipe.store.disk import DiskStore
    from bagpipe.store.init import RowInitializer

    _frequency_store(tmp_path / "st", rows=50_000, packed=20_000)
    cfg = TrainConfig.of(**DISK, steps=2, store_dir=str(tmp_path / "st"), init_from_store=True)
    kept = choose_layout(cfg, 10)  # a short run: auto would not count, but the store was made packed
    assert kept is not None and (kept.name, kept.made, kept.packed_rows) == ("frequency", False, 20_000)
    assert "keeps the layout" in kept.why
    part = layout_bytes(kept, 50_000, split_lookups=10**9)
    assert part == 36 * 20_000 + (1 << 20)  # its packed rows, no count of the split: it is not made here
    assert part < layout_bytes(LayoutChoice("frequency", "made"), 50_000, split_lookups=10**9)
    tracemalloc.start()
    try:
        with DiskStore(RowInitializer([50_000], 8, 0), 1, tmp_path / "st") as store:
            assert store.layout.num_packed == 20_000
            held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # what the reopened store holds beside its maps: the layout, the row log, the present bits (two copies)
    bits = 2 * (50_000 + 7) // 8
    assert 36 * 20_000 // 2 < held - bits <= part, (held, part)
