"""The optimizers' maths and the learning-rate schedules, on tiny tensors.

* Row-wise Adam and partial row-wise Adam against a two-step example computed by hand
  (FBGEMM's update: bias correction with the global step t, decoupled weight decay),
  including the layout of their row state ([m | v] and [v | m]).
* Row-wise Adam on rows that every step touches is torch's dense Adam (with decoupled
  weight decay), which is what the dense parameters use; so is partial row-wise Adam
  with D = 1 (the row mean of one square is the square).
* The schedules' rates at given steps equal their closed forms; ``constant`` returns
  the base rate itself (no schedule changes no bit).
* Every bad optimisation setting is a one-line ConfigError naming the problem.
"""

from __future__ import annotations

import pytest
import torch

from bagpipe.config.train import TrainConfig
from bagpipe.errors import ConfigError
from bagpipe.optim.adam import PartialRowWiseAdam, RowWiseAdam
from bagpipe.optim.build import build_dense_optimizer, build_sparse_optimizer
from bagpipe.optim.names import row_state_dim
from bagpipe.optim.schedule import LRSchedule

pytestmark = pytest.mark.unit

W0 = [[1.0, -2.0]]
GRADS = ([[0.5, -1.0]], [[0.1, 0.2]])


def two_steps(opt, S: int):
    w, s = torch.tensor(W0), torch.zeros(1, S)
    out = []
    for step, g in enumerate(GRADS):
        w, s = opt.update(w, s, torch.tensor(g), step)
        out.append((w, s))
    return out


def test_adam_two_steps_by_hand():
    """lr 0.1, betas (0.9, 0.999), eps 1e-8.

    t = 1: m = 0.1 g1 = (0.05, -0.1); v = 0.001 g1^2 = (0.00025, 0.001); m/(1-0.9) = g1,
    v/(1-0.999) = g1^2, so w moves by 0.1 * g1/|g1| (less eps): w1 = (0.9, -1.9) + ~1e-9.
    t = 2: m = 0.9 m + 0.1 g2 = (0.055, -0.07); v = 0.999 v + 0.001 g2^2 = (0.00025975, 0.001039);
    m/0.19 = (0.2894737, -0.3684211), v/0.001999 = (0.1299400, 0.5197599), so
    w2 = w1 - 0.1 * (0.8030421, -0.5110262) = (0.8196959, -1.8488974).
    """
    (w1, s1), (w2, s2) = two_steps(RowWiseAdam(0.1, 2), 4)
    torch.testing.assert_close(w1, torch.tensor([[0.900000002, -1.900000001]]), rtol=1e-6, atol=0)
    torch.testing.assert_close(s1, torch.tensor([[0.05, -0.1, 0.00025, 0.001]]), rtol=1e-6, atol=0)
    torch.testing.assert_close(w2, torch.tensor([[0.819695906385, -1.84889739399]]), rtol=1e-6, atol=0)
    torch.testing.assert_close(s2, torch.tensor([[0.055, -0.07, 0.00025975, 0.001039]]), rtol=1e-6, atol=0)


def test_partial_rowwise_adam_two_steps_by_hand():
    """lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01; one second moment per row.

    t = 1: v = 0.001 mean(g1^2) = 0.001 * 0.625; v/0.001 = 0.625, sqrt 0.7905694;
    m/0.1 = g1; w1 = w0 - 0.1 * (g1 / 0.7905694 + 0.01 w0) = (0.9357544, -1.8715089).
    t = 2: v = 0.999 * 0.000625 + 0.001 * 0.025 = 0.000649375; v/0.001999 = 0.3248499;
    m = (0.055, -0.07); w2 = w1 - 0.1 * (m/0.19 / 0.5699561 + 0.01 w1) = (0.8840299, -1.8049971).
    """
    (w1, s1), (w2, s2) = two_steps(PartialRowWiseAdam(0.1, 2, weight_decay=0.01), 3)
    torch.testing.assert_close(w1, torch.tensor([[0.935754447597, -1.87150889519]]), rtol=1e-6, atol=0)
    torch.testing.assert_close(s1, torch.tensor([[0.000625, 0.05, -0.1]]), rtol=1e-6, atol=0)
    torch.testing.assert_close(w2, torch.tensor([[0.884029923114, -1.80499713353]]), rtol=1e-6, atol=0)
    torch.testing.assert_close(s2, torch.tensor([[0.000649375, 0.055, -0.07]]), rtol=1e-6, atol=0)


@pytest.mark.parametrize("name,dim", [("adam", 4), ("partial_rowwise_adam", 1)])
def test_rows_touched_every_step_are_torch_adam(name, dim):
    """The dense parameters' optimizer (torch.optim.Adam, decoupled weight decay) and the
    row optimizer agree when every row is updated at every step (within float rounding:
    they order the same maths differently)."""
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(6, dim, generator=g)
    param = torch.nn.Parameter(rows.clone())
    dense = build_dense_optimizer(name, 0.01, [param], weight_decay=0.1)
    sparse = build_sparse_optimizer(name, 0.01, dim, weight_decay=0.1)
    state = torch.zeros(6, sparse.state_dim)
    for step in range(5):
        grad = torch.randn(6, dim, generator=g)
        param.grad = grad.clone()
        dense.step()
        rows, state = sparse.update(rows, state, grad, step)
        torch.testing.assert_close(rows, param.detach(), rtol=1e-5, atol=1e-7)
    m = dense.state[param]["exp_avg"]
    torch.testing.assert_close(state[:, -dim:] if name == "partial_rowwise_adam" else state[:, :dim], m)


def test_state_widths():
    assert [row_state_dim(n, 16) for n in ("sgd", "adagrad", "adam", "partial_rowwise_adam")] == [0, 1, 32, 17]
    assert build_sparse_optimizer("adam", 0.1, 16).state_dim == 32
    assert build_sparse_optimizer("partial_rowwise_adam", 0.1, 16).state_dim == 17
    with pytest.raises(ConfigError, match="unknown optimizer 'lamb'"):
        row_state_dim("lamb", 16)


def test_warmup_poly_closed_form():
    """MLPerf DLRM: warm-up W = 4, decay from S = 10 over N = 5 steps, power 2, floor 1e-3."""
    s = LRSchedule("warmup-poly", warmup_steps=4, decay_start=10, decay_steps=5, power=2.0, lr_min=1e-3)
    base = 0.5
    expected = {
        1: base / 4,
        2: base / 2,
        4: base,
        5: base,
        9: base,
        10: base,
        11: base * (4 / 5) ** 2,
        14: base * (1 / 5) ** 2,
        15: 1e-3,
        100: 1e-3,
    }
    for t, lr in expected.items():
        assert s.lr(base, t - 1) == pytest.approx(lr, rel=1e-15), t


def test_step_schedule_closed_form():
    s = LRSchedule("step", warmup_steps=2, decay_start=5, decay_steps=3, gamma=0.5)
    expected = {1: 0.05, 2: 0.1, 4: 0.1, 5: 0.1, 7: 0.1, 8: 0.05, 11: 0.025, 14: 0.0125}
    for t, lr in expected.items():
        assert s.lr(0.1, t - 1) == pytest.approx(lr, rel=1e-15), t


def test_constant_schedule_is_the_base_rate_itself():
    base = 0.05
    assert LRSchedule().lr(base, 12345) is base
    assert LRSchedule().state(7, {"lr": base}) == {"kind": "constant", "position": 7, "lr": base}


BAD = {
    "embedding lr": ({"embedding_lr": 0.0}, "embedding learning rate must be > 0"),
    "beta": ({"optimizer": "adam", "beta1": 1.0}, "Adam betas must be in [0, 1)"),
    "eps": ({"optimizer": "adam", "eps": 0.0}, "eps must be > 0"),
    "weight decay": ({"optimizer": "adam", "weight_decay": -1.0}, "weight decay must be >= 0"),
    "adam option without adam": (
        {"optimizer": "adagrad", "beta2": 0.99},
        "apply to adam and partial_rowwise_adam, not adagrad",
    ),
    "negative schedule steps": ({"lr_schedule": "step", "lr_decay_steps": -1}, "schedule steps must be >= 0"),
    "schedule steps without schedule": ({"lr_warmup_steps": 5}, "need --lr-schedule warmup-poly or step"),
    "decay before warm-up ends": (
        {"lr_schedule": "warmup-poly", "lr_warmup_steps": 10, "lr_decay_start": 5, "lr_decay_steps": 9},
        "the decay must start after the warm-up",
    ),
    "step without interval": ({"lr_schedule": "step"}, "--lr-schedule step needs --lr-decay-steps N > 0"),
    "gamma": ({"lr_schedule": "step", "lr_decay_steps": 3, "lr_gamma": 1.5}, "lr-gamma must be in (0, 1]"),
    "power": ({"lr_schedule": "warmup-poly", "lr_decay_power": 0.0}, "lr-decay-power must be > 0"),
    "floor": ({"lr_min": -1.0}, "lr-min must be >= 0"),
    "floor above the embedding rate": (
        {"lr_schedule": "step", "lr_decay_steps": 5, "lr": 0.05, "embedding_lr": 0.001, "lr_min": 0.01},
        "--lr-min 0.01 exceeds --embedding-lr 0.001: the decay's floor would raise the rate",
    ),
    "floor above the rate": (
        {"lr_schedule": "warmup-poly", "lr_decay_steps": 3, "lr_min": 0.5},
        "--lr-min 0.5 exceeds --lr 0.05, the embedding rows' rate too: the decay's floor would raise the rate, "
        "not decay it; give --lr-min at most 0.05",
    ),
    "floor above the recipe's rate": (
        {"recipe": "kaggle", "lr_schedule": "step", "lr_decay_steps": 3, "lr_min": 0.01},
        "--lr-min 0.01 exceeds --lr 0.002 (the kaggle recipe's)",
    ),
    "floor of a constant rate": (
        {"lr_min": 0.5},
        "--lr-min applies to --lr-schedule warmup-poly or step, not constant",
    ),
    "unknown schedule": ({"lr_schedule": "cosine"}, "lr_schedule must be one of 'constant', 'warmup-poly', 'step'"),
}


@pytest.mark.parametrize("settings,message", BAD.values(), ids=BAD.keys())
def test_bad_optimisation_settings(settings, message):
    with pytest.raises(ConfigError) as e:
        TrainConfig.of(data="d", out="o", **settings)
    assert message in str(e.value) and "\n" not in str(e.value)
