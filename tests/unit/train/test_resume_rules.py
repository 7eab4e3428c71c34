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


def test_the_setting_given_is_named_before_one_derived_from_it():
    """--lr changed: embedding_lr (which follows --lr when not given) changed with it, and
    sorts first; the user changed --lr, so lr is named."""
    old, new = RUN | {"lr": 0.05, "embedding_lr": 0.05}, RUN | {"lr": 0.5, "embedding_lr": 0.5}
    assert refused_change(old, new) == ("lr", 0.05, 0.5)
    assert refused_change(old, old | {"embedding_lr": 0.5}) == ("embedding_lr", 0.05, 0.5)
    recipe = old | {"recipe": "debug", "embedding_dim": 8}
    kaggle = recipe | {"recipe": "kaggle", "embedding_dim": 16, "lr": 0.002, "embedding_lr": 0.002}
    assert refused_change(recipe, kaggle) == ("recipe", "debug", "kaggle")  # not the lr it brought along
    # the schedule left out: its terms fall to their defaults with it, and lr_schedule is named,
    # not lr_decay_start (adding that back alone is refused for want of a schedule)
    step = RUN | {"lr_schedule": "step", "lr_decay_start": 10, "lr_decay_steps": 5, "lr_gamma": 0.5}
    constant = RUN | {"lr_schedule": "constant", "lr_decay_start": 0, "lr_decay_steps": 0, "lr_gamma": 0.1}
    assert refused_change(step, constant) == ("lr_schedule", "step", "constant")


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
