"""Which settings a resumed run may change (``bagpipe/train/resume.py``: ``refused_change``)."""

from __future__ import annotations

import pytest

from bagpipe.train.resume import MAY_CHANGE, refused_change

pytestmark = pytest.mark.unit

RUN = {"seed": 0, "batch_size": 128, "steps": 40, "mode": "lookahead", "cache_sync": "partitioned"}


def test_a_setting_outside_the_list_is_refused_and_one_inside_is_not():
    assert "seed" not in MAY_CHANGE and "steps" in MAY_CHANGE
    assert refused_change(RUN, RUN | {"seed": 7}) == ("seed", 0, 7)
    assert refused_change(RUN, RUN | {"steps": 80, "mode": "lru"}) is None


@pytest.mark.parametrize(
    "was,now,refused",
    [
        ("partitioned", "replicated", False),  # both exact: the same model
        ("replicated", "partitioned", False),
        ("partitioned", "periodic:4", True),  # an exact run would continue approximately
        ("periodic:4", "partitioned", True),  # an approximate run would report as exact
        ("periodic:4", "periodic:8", True),  # another approximation
        ("periodic:4", "periodic:4", False),
    ],
)
def test_the_row_sync_changes_only_between_exact_ones(was, now, refused):
    got = refused_change(RUN | {"cache_sync": was}, RUN | {"cache_sync": now})
    assert got == (("cache_sync", was, now) if refused else None)
