"""Learning-rate schedules: a pure function of the step, shared by dense and embedding rates.

Steps are counted from 1 here (``t = step + 1`` for the 0-based step index the loop
uses), as in the MLPerf DLRM reference's ``LRPolicyScheduler`` and as Adam's bias
correction counts them. A schedule gives a *factor* of the base learning rate; the
dense optimizer (``--lr``) and the embedding rows (``--embedding-lr``) apply the same
factor to their own base.

* ``constant``: factor 1 (the base rate exactly, so a run without a schedule is
  bit-identical to one from before schedules existed).
* ``warmup-poly`` (MLPerf DLRM): linear warm-up ``t / W`` for ``t <= W``; then 1 until
  the decay starts at ``t = S``; then ``((N - (t - S)) / N) ** p`` for ``N`` steps, which
  reaches 0 at ``t = S + N`` and stays there; during and after the decay the rate is
  floored at ``lr_min``. (The reference clamps to 1e-7; its older variant froze the rate
  between warm-up and decay at the last warm-up value ``(W - 1) / W``; bagpipe holds 1.)
* ``step``: the same warm-up, then ``gamma ** floor((t - S) / N)`` for ``t >= S``
  (multiplied by ``gamma`` at ``t = S + N``, ``S + 2N``, ...), floored at ``lr_min``.

Because the rate is a function of the step alone, a resumed run continues the schedule
from the checkpoint's step (:meth:`LRSchedule.state` is what a checkpoint records).
"""

from __future__ import annotations

from dataclasses import dataclass

from bagpipe.optim.names import ScheduleName


@dataclass(frozen=True)
class LRSchedule:
    """A learning-rate schedule (see the module docstring); all step counts in steps."""

    kind: ScheduleName = "constant"
    warmup_steps: int = 0
    decay_start: int = 0
    decay_steps: int = 0
    power: float = 2.0
    gamma: float = 0.1
    lr_min: float = 0.0

    def factor(self, t: int) -> float:
        """The factor of the base rate at step ``t`` (1-based), before the ``lr_min`` floor."""
        if self.kind == "constant":
            return 1.0
        W, S, N = self.warmup_steps, self.decay_start, self.decay_steps
        if W > 0 and t <= W:
            return t / W
        if N <= 0 or t < S:
            return 1.0
        if self.kind == "warmup-poly":
            done = min(t - S, N)  # the decay ends at 0 and stays there
            return ((N - done) / N) ** self.power
        return self.gamma ** ((t - S) // N)

    def decaying(self, t: int) -> bool:
        """Whether step ``t`` (1-based) is in the decay phase, where ``lr_min`` floors the rate."""
        return self.kind != "constant" and self.decay_steps > 0 and t >= self.decay_start and t > self.warmup_steps

    def lr(self, base: float, step: int) -> float:
        """The learning rate of 0-based step ``step`` for base rate ``base``."""
        if self.kind == "constant":
            return base
        t = step + 1
        rate = base * self.factor(t)
        return max(self.lr_min, rate) if self.decaying(t) else rate

    def rates(self, step: int, bases: dict[str, float]) -> dict[str, float]:
        """The rate of 0-based step ``step`` for each named base rate."""
        return {k: float(self.lr(b, step)) for k, b in bases.items()}

    def state(self, step: int, bases: dict[str, float]) -> dict:
        """What a checkpoint after ``step`` steps records (plain ints and floats): the
        position (the next step's 0-based index) and the rates that step will use."""
        return {"kind": self.kind, "position": int(step), **self.rates(step, bases)}


def set_lr(optimizer, lr: float) -> None:
    """Give every parameter group of a torch optimizer the learning rate ``lr``."""
    for group in optimizer.param_groups:
        group["lr"] = lr
