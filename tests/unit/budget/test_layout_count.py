"""A frequency layout in a memory budget that does not hold its estimate bounded by the
split's lookups: the rows the split uses are counted (one pass) and the checks run again
on the count, so ``auto`` keeps the frequency layout where the count fits and
``--store-layout frequency`` is refused only where even the count does not fit."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import bagpipe.train.preflight as preflight
from bagpipe.budget.shape import counted, layout_bytes, run_shape, without_count
from bagpipe.budget.sizing import BudgetError, Fit
from bagpipe.config.train import TrainConfig
from bagpipe.data.frequency import rows_used
from bagpipe.data.shards import Dataset
from bagpipe.data.stream import BatchStream, train_stream

pytestmark = pytest.mark.unit


def _run(tiny_data, tmp_path, **kw):
    cfg = TrainConfig.of(data=tiny_data, out=str(tmp_path / "run"), mode="lookahead", store="disk", steps=400,
                         batch_size=128, progress=False, **kw)  # fmt: skip
    dataset = Dataset(tiny_data)
    stream = train_stream(dataset, cfg.data, cfg.run.seed)
    return cfg, dataset, stream, run_shape(cfg, dataset, stream)


def test_the_count_is_the_splits_distinct_rows_and_tightens_the_estimate(tiny_data, tmp_path):
    cfg, dataset, stream, shape = _run(tiny_data, tmp_path)
    split = BatchStream(dataset, "train", 4096, shuffle=False, drop_last=False)
    want = len(np.unique(np.concatenate([b.rows.numpy() for b in split.batches()])))
    assert rows_used(dataset) == want
    exact = counted(shape, dataset, stream)
    assert exact.layout is not None and exact.layout.used_rows == want
    assert exact.layout.name == "frequency" and exact.layout.auto
    B = shape.batch_size
    split_lookups = stream.num_samples * shape.lookups // B
    assert exact.layout_bytes == layout_bytes(exact.layout, shape.num_rows, split_lookups, shape.lookups // B)
    assert want < split_lookups and exact.layout_bytes < shape.layout_bytes  # the tiny split repeats its rows
    assert f"the split uses {want:,} rows (counted)" in exact.layout.why
    assert counted(exact, dataset, stream) is exact  # counted once
    plain = without_count(shape, "-")
    assert counted(plain, dataset, stream) is plain  # the identity layout counts nothing


class _Budget:
    """_memory_checks stand-in: a budget that holds a layout estimate up to ``limit`` bytes."""

    def __init__(self, limit: int):
        self.limit = limit
        self.seen: list[int] = []

    def __call__(self, cfg, dataset, stream, shape, together):
        self.seen.append(shape.layout_bytes)
        if shape.layout_bytes > self.limit:
            raise BudgetError("memory budget 1 MiB is too small")
        return preflight.MemoryCheck(Fit(None, None, None), None, shape=shape)  # type: ignore[arg-type]


@pytest.mark.parametrize("layout", ["auto", "frequency"])
def test_a_budget_between_the_count_and_the_bound_keeps_the_frequency_layout(tiny_data, tmp_path, monkeypatch, layout):
    cfg, dataset, stream, shape = _run(tiny_data, tmp_path, store_layout=layout)
    exact = counted(shape, dataset, stream)
    budget = _Budget((exact.layout_bytes + shape.layout_bytes) // 2)
    monkeypatch.setattr(preflight, "_memory_checks", budget)
    got = preflight.memory_checks(cfg, dataset, stream, shape)
    assert got.shape is not None and got.shape.layout is not None and exact.layout is not None
    assert (got.shape.layout.name, got.shape.layout.used_rows) == ("frequency", exact.layout.used_rows)
    assert budget.seen == [shape.layout_bytes, exact.layout_bytes]  # the bound first, then the count


def test_where_even_the_count_does_not_fit_auto_keeps_identity_and_frequency_is_refused(
    tiny_data, tmp_path, monkeypatch
):
    cfg, dataset, stream, shape = _run(tiny_data, tmp_path)
    exact = counted(shape, dataset, stream)
    monkeypatch.setattr(preflight, "_memory_checks", _Budget(exact.layout_bytes - 1))
    got = preflight.memory_checks(cfg, dataset, stream, shape)
    assert got.shape is not None and got.shape.layout is not None and got.shape.layout.name == "identity"
    mib = f"{exact.layout_bytes / 2**20:,.0f} MiB"
    assert f"the memory budget does not hold the frequency layout's count of the split ({mib})" in got.shape.layout.why
    given = dataclasses.replace(cfg, cache=dataclasses.replace(cfg.cache, store_layout="frequency"))
    with pytest.raises(BudgetError, match="too small"):
        preflight.memory_checks(given, dataset, stream, run_shape(given, dataset, stream))


@pytest.mark.parametrize("layout", ["auto", "frequency"])
def test_the_checks_lines_are_said_once_when_the_count_is_tried(tiny_data, tmp_path, monkeypatch, caplog, layout):
    """The checks on the bound log (a budget note, the fit) and fail; the checks on the count
    are kept: each line is said once, the failed try's not at all."""
    import logging

    cfg, dataset, stream, shape = _run(tiny_data, tmp_path, store_layout=layout)
    exact = counted(shape, dataset, stream)
    inner = _Budget((exact.layout_bytes + shape.layout_bytes) // 2)

    def noisy(cfg, dataset, stream, shape, together):
        logging.getLogger("bagpipe.budget").warning(f"checked a layout of {shape.layout_bytes} bytes")
        return inner(cfg, dataset, stream, shape, together)

    monkeypatch.setattr(preflight, "_memory_checks", noisy)
    with caplog.at_level(logging.INFO):
        preflight.memory_checks(cfg, dataset, stream, shape)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("checked a layout")]
    assert said == [f"checked a layout of {exact.layout_bytes} bytes"]
