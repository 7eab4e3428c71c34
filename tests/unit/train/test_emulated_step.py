"""The emulated step (``--emulate-compute``): its delay on a fake clock, the shapes of the
gradients it hands on, and that the run it makes is marked as not training."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from bagpipe.config.compute import parse_compute
from bagpipe.data.batch import Batch
from bagpipe.models import build_model
from bagpipe.models.config import recipe
from bagpipe.train.protocols import StepInput
from bagpipe.train.step.emulated import FORWARD_SHARE, EmulatedStep

pytestmark = pytest.mark.unit

B, F, D, ROWS = 8, 3, 16, 40


class FakeClock:
    """perf_counter and sleep over one number: sleeping advances it, computing does not."""

    def __init__(self):
        self.now, self.slept = 100.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


class Recorder:
    """A RowUpdate that keeps what the step hands it."""

    def __init__(self):
        self.calls = []

    def apply(self, inp, rows_u, grad_u):
        self.calls.append((rows_u.clone(), grad_u.clone()))

    def before_evict(self, plan) -> None:
        pass

    def finish(self) -> None:
        pass

    def phase_seconds(self) -> dict:
        return {}

    def stats(self) -> dict:
        return {}


def _input() -> StepInput:
    g = np.random.default_rng(0)
    rows = torch.from_numpy(g.integers(0, ROWS, size=B * F))
    uniq, inverse = torch.unique(rows, return_inverse=True)
    batch = Batch(
        dense=torch.randn(B, 13),
        rows=rows,
        offsets=torch.arange(B * F + 1),
        labels=torch.from_numpy(g.integers(0, 2, size=B).astype(np.float32)),
        num_features=F,
    )
    return StepInput(
        step=0,
        batch=batch,
        weights=torch.randn(ROWS, D),
        state=torch.zeros(ROWS, 1),
        index=uniq,
        inverse=inverse,
    )


def _step_once(step: EmulatedStep, model, times: dict | None = None) -> dict:
    """One emulated step of ``model`` (plain SGD, a recording row strategy); its times."""
    times = times if times is not None else {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    step(model, torch.optim.SGD(model.parameters(), lr=0.1), Recorder(), _input(), times)
    return times


def _model():
    torch.manual_seed(0)
    cfg = recipe("dlrm", "debug")
    cfg = dataclasses.replace(cfg, embedding_dim=D, bottom_mlp=tuple(cfg.bottom_mlp[:-1]) + (D,))
    return build_model(cfg, 13, F)


@pytest.mark.parametrize(("spec", "want_s"), [("25ms", 0.025), ("1ms/sample", B * 1e-3), ("2ms*3", 0.006)])
def test_the_step_takes_the_calibrated_delay_split_between_forward_and_backward(spec, want_s):
    clock = FakeClock()
    step = EmulatedStep(parse_compute(spec), clock=clock, sleep=clock.sleep)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    times = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    loss = step(model, opt, Recorder(), _input(), times)
    assert np.isfinite(loss)
    assert sum(clock.slept) == pytest.approx(want_s)
    assert times["forward"] == pytest.approx(want_s * FORWARD_SHARE)
    assert times["backward"] == pytest.approx(want_s * (1 - FORWARD_SHARE))
    assert step.report()["delay_ms_per_step"] == pytest.approx(1000 * want_s)
    assert step.report()["trained"] is False


def test_gradients_have_the_real_shapes_and_change_nothing():
    clock = FakeClock()
    step = EmulatedStep(parse_compute("1ms"), clock=clock, sleep=clock.sleep)
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.Adagrad(model.parameters(), lr=0.1)
    rows = Recorder()
    inp = _input()
    step(model, opt, rows, inp, {"forward": 0.0, "backward": 0.0, "optimizer": 0.0})
    # every dense parameter got a gradient of its own shape (what DDP all-reduces), all zero
    for p in model.parameters():
        assert p.grad is not None and p.grad.shape == p.shape
        assert not p.grad.any()
    # the row strategy got the step's U rows and a (U, D) gradient
    ((rows_u, grad_u),) = rows.calls
    U = len(inp.index)
    assert rows_u.shape == grad_u.shape == (U, D)
    assert torch.equal(rows_u, inp.weights[inp.index])
    assert step.report()["row_grad_bytes_per_step"] == U * D * 4
    for a, p in zip(before, model.parameters()):
        assert torch.equal(a, p)


def test_a_compute_slower_than_the_clock_is_not_slept_past():
    """The one-sample forward is real work: the delay is a deadline, not added on top."""

    class Slow(FakeClock):
        def __call__(self):
            self.now += 0.010  # every reading 10 ms later: computing takes time
            return self.now

    clock = Slow()
    step = EmulatedStep(parse_compute("3ms"), clock=clock, sleep=clock.sleep)
    model = _model()
    _step_once(step, model)
    assert clock.slept == []


def test_the_backward_is_spread_over_the_gradients_in_proportion_to_their_weights():
    """Each dense gradient is ready when a real backward would have it (a sleep per
    parameter, its share of the backward by elements), so DDP all-reduces a bucket while
    the rest of the backward runs instead of after all of it."""
    clock = FakeClock()
    step = EmulatedStep(parse_compute("30ms"), clock=clock, sleep=clock.sleep)
    model = _model()
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    _step_once(step, model)
    backward_s = 0.030 * (1 - FORWARD_SHARE)
    slept = [s for s in clock.slept[1:] if s > 1e-12]  # [0]: the forward's
    assert sorted(slept) == pytest.approx(sorted(backward_s * p.numel() / total for p in params))
    assert step.report()["dense_wait_ms_per_step"] == 0.0


def test_what_the_dense_sync_leaves_after_the_backward_is_counted_as_its_wait():
    clock = FakeClock()
    step = EmulatedStep(parse_compute("30ms"), clock=clock, sleep=clock.sleep)
    model = _model()
    first = next(model.parameters())  # its gradient comes last: the last bucket's all-reduce follows it

    def last_bucket(_p):
        clock.now += 0.005

    first.register_post_accumulate_grad_hook(last_bucket)
    times = _step_once(step, model)
    assert step.report()["dense_wait_ms_per_step"] == pytest.approx(5.0)
    assert times["backward"] == pytest.approx(0.030 * (1 - FORWARD_SHARE) + 0.005)


def test_the_dense_wait_leaves_out_the_warm_up_steps():
    clock = FakeClock()
    step = EmulatedStep(parse_compute("30ms"), clock=clock, sleep=clock.sleep, warmup=1)
    model = _model()
    first = next(model.parameters())
    waits = iter([0.050, 0.002, 0.004])  # DDP's first step: one bucket of everything, after the backward

    def last_bucket(_p):
        clock.now += next(waits)

    first.register_post_accumulate_grad_hook(last_bucket)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        step(model, opt, Recorder(), _input(), {"forward": 0.0, "backward": 0.0, "optimizer": 0.0})
    assert step.report()["dense_wait_ms_per_step"] == pytest.approx(3.0)


def test_a_backward_outside_the_step_does_not_sleep_and_another_model_takes_the_hooks_over():
    clock = FakeClock()
    step = EmulatedStep(parse_compute("30ms"), clock=clock, sleep=clock.sleep)
    a, b = _model(), _model()
    for model in (a, b):
        _step_once(step, model)
    slept = len(clock.slept)
    for model in (a, b):  # an evaluation's or a user's backward: no emulated time
        model.zero_grad()
        model(torch.randn(2, 13), torch.randn(2, F, D)).sum().backward()
    assert len(clock.slept) == slept
    # the first model's hooks are gone: stepping it again paces it once, not twice
    before = len(clock.slept)
    _step_once(step, a)
    backward = [x for x in clock.slept[before + 1 :] if x > 1e-12]
    assert len(backward) == len(list(a.parameters()))
    assert sum(backward) == pytest.approx(0.030 * (1 - FORWARD_SHARE))
