"""Training steps: the plain step every mode runs, and its variants beside it.

* :mod:`bagpipe.train.step.plain` -- :func:`train_step`, the step of every mode (and
  :class:`LocalRowUpdate`, the one-process row strategy).
* :mod:`bagpipe.train.step.hotline` -- Hotline's step: a popular and a non-popular
  micro-batch, the cold rows read while the popular one computes.
* :mod:`bagpipe.train.step.slipstream` -- Slipstream's stale-input skip, a wrapper of a
  step (an opt-in approximation).

A mode names its step in the table of modes (``ModeSpec.step``); :data:`STEPS` maps the
name to the function (a :class:`~bagpipe.train.protocols.StepFn`).
"""

from __future__ import annotations

from bagpipe.config.modes import StepName
from bagpipe.train.protocols import StepFn
from bagpipe.train.step.hotline import hotline_step
from bagpipe.train.step.plain import LocalRowUpdate, forward_logits, train_step

#: step name (a mode's ``ModeSpec.step``) -> the step function.
STEPS: dict[StepName, StepFn] = {"plain": train_step, "hotline": hotline_step}

__all__ = ["STEPS", "LocalRowUpdate", "forward_logits", "hotline_step", "train_step"]
