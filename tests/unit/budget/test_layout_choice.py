"""Which row layout a run's disk store gets (``--store-layout``, default ``auto``:
:func:`bagpipe.budget.shape.choose_layout`), and what its memory estimate counts for it.

* ``auto`` picks the frequency layout from half an epoch of training on, the identity
  layout below and where making the layout could take more than 2 GiB, and says why in
  one line; where the disk does not hold its row log, or a memory budget holds its count
  only by shrinking the read-ahead, it keeps the identity layout instead;
* a config.json from before ``auto`` (which says "identity" for every run) still reads;
* a value given is taken; a data-parallel job's servers keep the identity layout; a store
  the run reopens (``--init-from-store``) keeps its own, and the estimate then counts what
  it keeps (its packed rows and row log), not a count of the split it does not make --
  measured against ``tracemalloc``.
"""

from __future__ import annotations

import numpy as np
import pytest

from bagpipe.budget.shape import (
    AUTO_MAX_LAYOUT_BYTES,
    AUTO_MIN_EPOCHS,
    auto_layout,
    choose_layout,
    frequency_peak,
    layout_bytes,
)
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
    # making the layout may peak at 2 GiB (Criteo-Kaggle's 33.8M rows fit; MLPerf's 204M do not, unasked)
    assert auto_layout(100, 10, making=AUTO_MAX_LAYOUT_BYTES).name == "frequency"
    big = auto_layout(100, 10, making=AUTO_MAX_LAYOUT_BYTES + 1)
    assert big.name == "identity" and "could take 2,048 MiB, more than the 2,048 MiB auto spends" in big.why
    assert frequency_peak(33_762_577, 10**9, 26) <= AUTO_MAX_LAYOUT_BYTES < frequency_peak(204_000_000, 10**9, 26)


def test_the_choice_follows_the_options():
    assert choose_layout(TrainConfig.of(data="d", out="o", mode="full", steps=10), 10) is None  # no store
    assert choose_layout(TrainConfig.of(**(DISK | {"store": "memory"}), steps=100), 10) is None
    assert choose_layout(TrainConfig.of(**DISK, steps=100), 10, 1000) == auto_layout(100, 10, 1000)
    too_big = choose_layout(TrainConfig.of(**DISK, steps=100), 10, 2**31 + 1)
    assert too_big is not None and too_big.name == "identity"
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


def test_a_config_json_from_before_auto_still_reads_and_identity_is_harmless_where_it_does_not_apply():
    """config.json of a run made before ``auto`` says "identity" for every run (it was the
    default); a resume re-reads it. A file or command saying identity for a memory store is
    what happens anyway; with --init-from-store (which keeps the store's layout) it is refused."""
    from bagpipe.errors import ConfigError

    old = TrainConfig.of(data="d", out="o", mode="full", steps=10).to_json()
    old["cache"]["store_layout"] = "identity"
    assert TrainConfig.from_json(old).cache.store_layout == "auto"
    assert TrainConfig.of(**(DISK | {"store": "memory"}), steps=10, store_layout="identity")
    assert TrainConfig.of(**DISK, steps=10, trainers=2, servers=1, store_layout="identity")
    with pytest.raises(ConfigError, match="--store-layout applies to a store this run makes"):
        TrainConfig.of(**DISK, steps=10, store_dir="x", init_from_store=True, store_layout="identity")


def test_a_disk_too_small_for_the_row_log_keeps_the_identity_layout(tiny_data, tmp_path, monkeypatch):
    """The disk-space check holds auto's frequency layout (its packed rows and row log) and,
    where only the identity layout fits, gives it up rather than refusing the run."""
    import bagpipe.train.space as space
    from bagpipe.budget.shape import run_shape, without_count
    from bagpipe.data.shards import Dataset
    from bagpipe.data.stream import train_stream
    from bagpipe.errors import ConfigError
    from bagpipe.train.preflight import store_space

    cfg = TrainConfig.of(data=tiny_data, out=str(tmp_path / "run"), mode="lookahead", store="disk", steps=100,
                         batch_size=128, progress=False)  # fmt: skip
    dataset = Dataset(tiny_data)
    stream = train_stream(dataset, cfg.data, cfg.run.seed)
    shape = run_shape(cfg, dataset, stream)
    assert shape.layout is not None and shape.layout.name == "frequency"

    def need(s) -> int:  # what the check asks for, read from its refusal with no space at all
        monkeypatch.setattr(space, "free_bytes", lambda d: (str(d), 0))
        with pytest.raises(ConfigError) as e:
            space.check_store_space(cfg, s, None)
        number, unit = str(e.value).split("needs up to ")[1].split(" ")[:2]
        return int(float(number.replace(",", "")) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit])

    packed, plain = need(shape), need(without_count(shape, "-"))
    assert plain < packed
    monkeypatch.setattr(space, "free_bytes", lambda d: (str(d), (plain + packed) // 2))
    kept = store_space(cfg, shape, None)
    assert kept.layout is not None and kept.layout.name == "identity" and kept.layout_bytes == 0
    assert "the disk does not hold the frequency layout's packed rows and row log" in kept.layout.why
    monkeypatch.setattr(space, "free_bytes", lambda d: (str(d), plain // 2))
    with pytest.raises(ConfigError, match="this run's disk store needs up to"):
        store_space(cfg, shape, None)
