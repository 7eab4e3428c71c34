"""The training loop's one guard against divergence: a run that diverges stops in one line.

After every step :func:`check_step` looks at what the step produced: the loss (a
Python float), the gradient of every dense parameter and the values of the embedding
rows the step updated (a NaN or infinite row gradient shows there, since every
row-wise optimizer carries it into the row). The first non-finite one stops the run
with :class:`Diverged`, one line naming the step and what went non-finite. The
loop's own error path then writes nothing more: no checkpoint of the poisoned
parameters, no summary; the checkpoints written before stay the run's latest (a
resume continues from the last good one).

A loss that *explodes* stops the run too (:class:`StepGuard`). A click-through model's
loss is a mean log loss: predicting the base rate costs about 0.5-0.7, a badly wrong
model a few units; above :data:`EXPLODED` the logits sit beyond +-100 for most wrong
labels. One such step can be a spike that training recovers from (DLRM with Adagrad at
lr 0.05: 1,752 at step 2, 0.55 by step 20, on the Criteo-Kaggle profile); a loss that
*stays* there :data:`PATIENCE` steps in a row has blown up (too high a learning rate),
and every further step, checkpoint and evaluation would be wasted.

Cost: one ``isfinite().all()`` per dense parameter and one over the step's U x D rows,
reduced to a single host sync per step; the values are only read, so a guarded run
computes bit for bit what an unguarded one does.
"""

from __future__ import annotations

import math

import torch

from bagpipe.errors import BagpipeError

EXPLODED = 100.0
"""A mean log loss above this is exploding."""
PATIENCE = 5
"""Steps in a row above :data:`EXPLODED` that stop the run."""


class Diverged(BagpipeError):
    """A training step produced a NaN or an infinite loss, gradient or row, or the loss exploded."""


class StepGuard:
    """The loop's guard: after every step, :func:`check_step` (non-finite values) and the
    loss's explosion (above :data:`EXPLODED` for :data:`PATIENCE` steps in a row)."""

    def __init__(self, started_from: str | None = None) -> None:
        self.above = 0  # steps in a row above EXPLODED
        self.started_from = started_from  # --init-from-store's folder: its rows may be the cause

    def check(self, step: int, loss: float, model: torch.nn.Module | None = None, inp=None) -> None:
        """After step ``step`` (1-based: the steps done) with mean loss ``loss``; ``model``
        and ``inp`` (the step's input) for the gradients' and rows' check (None: the loss only)."""
        try:
            self._check(step, loss, model, inp)
        except Diverged as e:
            if self.started_from is None:
                raise
            raise Diverged(
                f"{e}; the run started from the rows of {self.started_from} (--init-from-store): a NaN or infinite "
                "value there makes the first step that uses it diverge"
            ) from None

    def _check(self, step: int, loss: float, model: torch.nn.Module | None, inp) -> None:
        if model is not None and inp is not None:
            check_step(step, loss, model, inp)
        elif not math.isfinite(loss):
            raise Diverged(_message(step, f"the loss is {loss}"))
        self.above = self.above + 1 if loss > EXPLODED else 0
        if self.above >= PATIENCE:
            raise Diverged(
                _message(step, f"the loss has stayed above {EXPLODED:g} for {PATIENCE} steps (it is {loss:.3g})")
            )


def check_step(step: int, loss: float, model: torch.nn.Module, inp) -> None:
    """Raise :class:`Diverged` if step ``step`` (1-based: the steps done) left a
    non-finite ``loss``, dense gradient or updated row (``inp``: the step's
    :class:`~bagpipe.train.step.StepInput`)."""
    if not math.isfinite(loss):
        raise Diverged(_message(step, f"the loss is {loss}"))
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flags = [torch.isfinite(g).all() for g in grads]
    rows = inp.weights.index_select(0, inp.index) if inp.index.numel() else None
    if rows is not None:
        flags.append(torch.isfinite(rows).all())
    if flags and not bool(torch.stack(flags).all()):
        names = [
            n for n, p in model.named_parameters() if p.grad is not None and not bool(torch.isfinite(p.grad).all())
        ]
        what = (
            f"the gradient of {names[0]} holds NaN or infinite values"
            if names
            else "an embedding row's gradient made the row NaN or infinite"
        )
        raise Diverged(_message(step, what))


def _message(step: int, what: str) -> str:
    return (
        f"training diverged at step {step}: {what}; stopped without checkpointing it (the run's latest "
        "checkpoint, if any, is from before); start again with a lower --lr / --embedding-lr, or check the data "
        "with `bagpipe check`"
    )
