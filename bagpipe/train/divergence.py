"""A loss that explodes stops the run: one line naming the step.

A click-through model's loss is a mean log loss: predicting the base rate costs about
0.5-0.7, a badly wrong model a few units. A mean log loss above :data:`EXPLODED` means
the logits sit beyond +-100 for most wrong labels -- the parameters have blown up (too
high a learning rate) -- and every further step, checkpoint and evaluation would be
wasted. A NaN or infinite loss is the same. The check reads the step's loss, a Python
float the loop has anyway, so a checked run computes exactly what an unchecked one does.
"""

from __future__ import annotations

import math

from bagpipe.errors import BagpipeError

EXPLODED = 100.0
"""A mean log loss above this has exploded."""


class Diverged(BagpipeError):
    """A training step's loss exploded (or is not finite)."""


def check_loss(step: int, loss: float) -> None:
    """Raise :class:`Diverged` if the loss of step ``step`` (1-based: the steps done) exploded."""
    if math.isfinite(loss) and loss <= EXPLODED:
        return
    raise Diverged(
        f"training diverged at step {step}: the loss reached {loss:.3g} (a mean log loss above {EXPLODED:g}: "
        "the parameters blew up); stopped without checkpointing it (the run's latest checkpoint, if any, is from "
        "before); lower --lr / --embedding-lr"
    )
