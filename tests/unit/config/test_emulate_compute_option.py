"""``--emulate-compute SPEC``: its syntax, its one-line refusals, and the mark it leaves."""

from __future__ import annotations

import pytest

from bagpipe.config.compute import V100_BATCH, V100_STEP_MS, parse_compute
from bagpipe.config.train import TrainConfig
from bagpipe.errors import ConfigError

pytestmark = pytest.mark.unit

JOB = dict(data="d", out="o", steps=10, mode="lookahead", trainers=2, servers=1, digest=False)


@pytest.mark.parametrize(
    ("spec", "per_step", "per_sample"),
    [
        ("25ms", 0.025, 0.0),
        ("1.5s", 1.5, 0.0),
        ("800us", 0.0008, 0.0),
        ("12us/sample", 0.0, 12e-6),
        ("v100-dlrm-kaggle", 0.0, V100_STEP_MS / 1000 / V100_BATCH),
        ("v100-dlrm-kaggle*100", 0.0, 100 * V100_STEP_MS / 1000 / V100_BATCH),
        ("25ms*4", 0.1, 0.0),
    ],
)
def test_spec_syntax(spec, per_step, per_sample):
    c = parse_compute(spec)
    assert c.per_step_s == pytest.approx(per_step) and c.per_sample_s == pytest.approx(per_sample)
    assert c.spec == spec


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("25", "is not a time"),
        ("fast", "is not a time"),
        ("-1ms", "is not a time"),
        ("25 ms/step", "is not a time"),
        ("0ms", "must be a time > 0"),
        ("v100-dlrm-kaggle*0", "the factor after \\* must be a number > 0"),
        ("25ms*x", "the factor after \\* must be a number > 0"),
        ("25ms*inf", "the factor after \\* must be a number > 0"),
        ("601s", "longer than 600 s a step"),
        ("2s/sample", "or 1 s a sample"),
    ],
)
def test_bad_specs_are_refused_in_one_line(spec, message):
    with pytest.raises(ConfigError, match=message) as e:
        TrainConfig.of(**JOB, emulate_compute=spec)
    assert "\n" not in str(e.value) and "--emulate-compute" in str(e.value)


def test_one_process_is_refused():
    with pytest.raises(ConfigError, match="one process has none; add --trainers N --servers S") as e:
        TrainConfig.of(data="d", out="o", steps=10, mode="lookahead", digest=False, emulate_compute="25ms")
    assert "\n" not in str(e.value)


def test_a_digest_is_refused():
    with pytest.raises(ConfigError, match="no parameter digest to claim: add --no-digest"):
        TrainConfig.of(**(JOB | {"digest": True}), emulate_compute="25ms")


def test_the_run_is_marked_as_not_training():
    cfg = TrainConfig.of(**JOB, emulate_compute="v100-dlrm-kaggle*10")
    assert cfg.approximations == ["emulate-compute v100-dlrm-kaggle*10 (did not train)"]
    # every other run is as exact as before
    assert TrainConfig.of(**(JOB | {"digest": True})).approximations == []
