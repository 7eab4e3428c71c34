"""A loss that explodes stops the run: one line naming the step.

A click-through model's loss is a mean log loss: predicting the base rate costs about
0.5-0.7, a badly wrong model a few units. A mean log loss above :data:`EXPLODED` means
the logits sit beyond +-100 for most wrong labels. One such step can be a spike that
training recovers from (DLRM with Adagrad at lr 0.05: 1,752 at step 2, 0.55 by step
20, on the Criteo-Kaggle profile); a loss that *stays* there :data:`PATIENCE` steps in a
row has blown up (too high a learning rate), and every further step, checkpoint and
evaluation would be wasted. A NaN or infinite loss stops the run at once. The check
reads the step's loss, a Python float the loop has anyway, so a checked run computes
exactly what an unchecked one does.
"""

from __future__ import annotations

import math

from bagpipe.errors import BagpipeError

EXPLODED = 100.0
"""A mean log loss above this is exploding."""
PATIENCE = 5
"""Steps in a row above :data:`EXPLODED` that stop the run."""


class Diverged(BagpipeError):
    """Training's loss exploded (or is not finite)."""


class LossGuard:
    """Watches every step's loss; :meth:`check` raises :class:`Diverged` when it explodes."""

    def __init__(self) -> None:
        self.above = 0  # steps in a row above EXPLODED

    def check(self, step: int, loss: float) -> None:
        """After step ``step`` (1-based: the steps done) with mean loss ``loss``."""
        if not math.isfinite(loss):
            raise Diverged(_message(step, f"the loss is {loss}"))
        self.above = self.above + 1 if loss > EXPLODED else 0
        if self.above >= PATIENCE:
            raise Diverged(
                _message(step, f"the loss has stayed above {EXPLODED:g} for {PATIENCE} steps (it is {loss:.3g})")
            )


def _message(step: int, what: str) -> str:
    return (
        f"training diverged at step {step}: {what}; stopped without checkpointing it (the run's latest checkpoint, "
        "if any, is from before); lower --lr / --embedding-lr"
    )
