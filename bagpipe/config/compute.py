"""``--emulate-compute SPEC``: the delay that replaces a trainer's forward and backward in
a benchmark of the data path (:class:`bagpipe.train.step.emulated.EmulatedStep`).

SPEC is ``BASE`` or ``BASE*K``:

* ``25ms`` (also ``s``, ``us``): a fixed time per step;
* ``12us/sample``: a time per sample of the trainer's batch (its 1/N slice of the
  global batch), e.g. measured from a real run;
* a named profile (:data:`COMPUTE_PROFILES`), a time per sample: ``v100-dlrm-kaggle``;
* ``*K`` multiplies it by K > 0 (a dilated profile: ``v100-dlrm-kaggle*100`` is a
  V100 slowed 100 times; quote it in a shell).

This module imports nothing of bagpipe beyond the config's checks, so the config stays light.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from bagpipe.config.typed import need

#: The V100 step time the profile ``v100-dlrm-kaggle`` assumes: forward + backward (and
#: the dense optimizer) of the DLRM Criteo-Kaggle recipe on one trainer's batch of
#: :data:`V100_BATCH` samples, in ms. AN ASSUMPTION: neither ../shared/docs/background.md
#: nor the BagPipe paper's abstract gives it. It is issue 31's estimate that this
#: machine's one-thread compute (66-70 ms per 1024-sample step, docs/distributed.md) is
#: ~10x a V100's, scaled to 2048 samples: ~13 ms. ``bench cluster --gpu-step-ms`` replaces it.
V100_STEP_MS = 13.0
V100_BATCH = 2048

#: name -> seconds per sample.
COMPUTE_PROFILES: dict[str, float] = {"v100-dlrm-kaggle": V100_STEP_MS / 1000 / V100_BATCH}

#: A step longer than this is a typo, not a benchmark.
MAX_STEP_S = 600.0
MAX_SAMPLE_S = 1.0

_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_TIME = re.compile(r"^(?P<num>[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)(?P<unit>s|ms|us)(?P<per>/sample)?$")
_FORMS = "25ms (a step), 12us/sample, or " + " / ".join(COMPUTE_PROFILES) + ", each optionally *K"


@dataclass(frozen=True)
class EmulatedCompute:
    """A parsed SPEC: seconds a step takes for a batch of ``samples``."""

    spec: str
    per_step_s: float = 0.0
    per_sample_s: float = 0.0

    def seconds(self, samples: int) -> float:
        """The emulated forward + backward of one step over ``samples`` samples."""
        return self.per_step_s + self.per_sample_s * samples


def parse_compute(spec: str) -> EmulatedCompute:
    """The :class:`EmulatedCompute` of ``spec``; a one-line ConfigError for a bad one."""
    text = spec.strip()
    base, star, factor = text.partition("*")
    k = 1.0
    if star:
        try:
            k = float(factor)
        except ValueError:
            k = float("nan")
        need(
            math.isfinite(k) and k > 0,
            f"--emulate-compute {spec!r}: the factor after * must be a number > 0, got {factor!r}",
        )
    if base in COMPUTE_PROFILES:
        out = EmulatedCompute(text, per_sample_s=COMPUTE_PROFILES[base] * k)
    else:
        m = _TIME.match(base)
        need(m is not None, f"--emulate-compute {spec!r} is not a time: use {_FORMS}")
        assert m is not None
        value = float(m["num"]) * _UNITS[m["unit"]] * k
        need(value > 0, f"--emulate-compute {spec!r} must be a time > 0")
        out = EmulatedCompute(text, **({"per_sample_s": value} if m["per"] else {"per_step_s": value}))
    need(
        out.per_step_s <= MAX_STEP_S and out.per_sample_s <= MAX_SAMPLE_S,
        f"--emulate-compute {spec!r} is longer than {MAX_STEP_S:g} s a step or {MAX_SAMPLE_S:g} s a sample",
    )
    return out
