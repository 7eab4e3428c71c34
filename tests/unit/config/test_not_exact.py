"""Why a run is not ``--mode full``'s bit for bit (``TrainConfig.not_exact``, the summary's
``not_exact``): its reasons, and none for a run that is exact -- one process in any
exact mode, or one trainer with embedding servers. Data-parallel trainers sum their
gradients in the all-reduce's order, so a job of two or more is equal within float
tolerance, not bitwise (docs/distributed.md), and says so as a hotline run does."""

from __future__ import annotations

import pytest

from bagpipe.config.train import (
    DATA_PARALLEL_NOT_EXACT,
    INIT_FROM_STORE_NOT_EXACT,
    ROUNDING_NOT_EXACT,
    TrainConfig,
)

pytestmark = pytest.mark.unit

BASE = dict(data="d", out="o", batch_size=64, steps=10)


@pytest.mark.parametrize(
    "settings",
    [
        dict(mode="full"),
        dict(mode="lookahead"),
        dict(mode="lru"),
        dict(mode="lookahead", trainers=1, servers=2),
    ],
    ids=["full", "lookahead", "lru", "1-trainer-2-servers"],
)
def test_an_exact_run_has_no_reason(settings):
    cfg = TrainConfig.of(**BASE, **settings)
    assert cfg.not_exact == []


def test_data_parallel_trainers_are_within_tolerance_not_bitwise():
    cfg = TrainConfig.of(**BASE, mode="lookahead", trainers=2, servers=1)
    assert cfg.not_exact == [DATA_PARALLEL_NOT_EXACT.format(trainers=2)]
    assert cfg.not_exact[0] == (
        "2 data-parallel trainers: equal to plain training within float tolerance "
        "(gradients summed in another order), not bitwise"
    )
    periodic = TrainConfig.of(**BASE, mode="lookahead", trainers=4, servers=1, cache_sync="periodic:5")
    assert periodic.not_exact == ["cache-sync periodic:5", DATA_PARALLEL_NOT_EXACT.format(trainers=4)]


def test_hotline_and_a_store_s_tables_say_why():
    assert TrainConfig.of(**BASE, mode="hotline").not_exact == [ROUNDING_NOT_EXACT.format(mode="hotline")]
    cfg = TrainConfig.of(**BASE, mode="lookahead", store="disk", store_dir="s", init_from_store=True)
    assert cfg.not_exact == [INIT_FROM_STORE_NOT_EXACT]
