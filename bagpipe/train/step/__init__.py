"""Training steps: the plain step every mode runs, and its variants beside it.

* :mod:`bagpipe.train.step.plain` -- :func:`train_step`, the step of every mode (and
  :class:`LocalRowUpdate`, the one-process row strategy).
* :mod:`bagpipe.train.step.hotline` -- Hotline's step: a popular and a non-popular
  micro-batch, the cold rows read while the popular one computes.
* :mod:`bagpipe.train.step.slipstream` -- Slipstream's stale-input skip, a wrapper of a
  step (an opt-in approximation).
* :mod:`bagpipe.train.step.emulated` -- ``--emulate-compute``: a delay in place of forward
  and backward, everything around it real (benchmarks of the data path; not training).

A mode names its step in the table of modes (``ModeSpec.step``); :data:`STEPS` maps the
name to the function (a :class:`~bagpipe.train.protocols.StepFn`); :func:`step_for` picks a
run's step (the emulated one when ``--emulate-compute`` is on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bagpipe.config.compute import parse_compute
from bagpipe.config.modes import StepName
from bagpipe.train.protocols import StepFn
from bagpipe.train.step.emulated import EmulatedStep
from bagpipe.train.step.hotline import hotline_step
from bagpipe.train.step.plain import LocalRowUpdate, forward_logits, train_step

if TYPE_CHECKING:
    from bagpipe.config.train import TrainConfig

#: step name (a mode's ``ModeSpec.step``) -> the step function.
STEPS: dict[StepName, StepFn] = {"plain": train_step, "hotline": hotline_step}


def step_for(cfg: TrainConfig) -> StepFn:
    """The step of run ``cfg``: its mode's, or the emulated step of ``--emulate-compute``."""
    spec = cfg.approx.emulate_compute
    if spec is None:
        return STEPS[cfg.cache.spec.step]
    return EmulatedStep(parse_compute(spec), warmup=cfg.run.warmup_steps)


__all__ = ["STEPS", "EmulatedStep", "LocalRowUpdate", "forward_logits", "hotline_step", "step_for", "train_step"]
