"""``--ddp-bucket-mb``: DDP's bucket size reaches the trainers' DDP, one refusal per bad
value (one line each), torch's default when not given, and a distributed-only setting."""

from __future__ import annotations

import pytest

from bagpipe.config.train import TrainConfig
from bagpipe.errors import ConfigError

pytestmark = pytest.mark.unit

JOB = dict(data="d", out="o", steps=10, mode="lookahead", trainers=2, servers=1)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1.0, r"--ddp-bucket-mb must be MiB in \[0, 1024\] \(0: torch's default\), got -1.0"),
        (2048.0, r"--ddp-bucket-mb must be MiB in \[0, 1024\] \(0: torch's default\), got 2048.0"),
        (float("nan"), "ddp_bucket_mb must be a finite number, got nan"),
        (float("inf"), "ddp_bucket_mb must be a finite number, got inf"),
    ],
)
def test_bad_sizes_are_refused_in_one_line(value, message):
    with pytest.raises(ConfigError, match=message) as e:
        TrainConfig.of(**JOB, ddp_bucket_mb=value)
    assert "\n" not in str(e.value)


def test_trainers_wrap_their_model_in_buckets_of_the_size_given(monkeypatch):
    import torch

    from bagpipe.distributed.layout import Layout
    from bagpipe.distributed.trainer import DataParallel

    seen = {}

    def fake_ddp(model, **kwargs):
        seen.update(kwargs)
        return model

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", fake_ddp)

    class Dev:
        pass

    Dev.torch = torch.device("cpu")  # type: ignore[attr-defined]

    for mb, want in ((0.25, {"bucket_cap_mb": 0.25}), (0.0, {})):  # 0: DDP's own default
        dist = TrainConfig.of(**JOB, ddp_bucket_mb=mb).dist
        DataParallel(Layout(2, 1), 0, None, None, dist, Dev()).wrap(torch.nn.Linear(2, 1))  # type: ignore[arg-type]
        assert {k: v for k, v in seen.items() if k == "bucket_cap_mb"} == want
        seen.clear()


def test_it_is_a_distributed_setting():
    with pytest.raises(ConfigError, match="--ddp-bucket-mb"):
        TrainConfig.of(data="d", out="o", steps=10, mode="lookahead", ddp_bucket_mb=0.25)
