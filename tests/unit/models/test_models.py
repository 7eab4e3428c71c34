"""The CTR models in ``bagpipe.models`` honour their contract.

Proves, for every model name and every recipe size: logits have shape (B,) and are finite;
a backward pass reaches every parameter and the pooled input; building and running under the
same seed is bitwise reproducible. For every model (debug recipe): it can overfit a fixed
batch (BCE falls by > 50% in 200 Adam steps with a learnable pooled input). Also: invalid configs raise ConfigError,
the DLRM dot interaction and the DeepFM FM term match brute-force references, and models
work without dense features (e.g. Avazu).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from bagpipe.errors import ConfigError
from bagpipe.models import MODEL_NAMES, RECIPE_SIZES, ModelConfig, build_model, recipe
from bagpipe.models.deepfm import fm_second_order
from bagpipe.models.layers import DotInteraction

B, DD, NF = 64, 4, 5
# dcn-mlperf is a recipe of dcn alone (the other models refuse it: test_large_tables.py)
CASES = [(m, r) for m, r in itertools.product(MODEL_NAMES, RECIPE_SIZES) if r != "dcn-mlperf" or m == "dcn"]


pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]


def _inputs(cfg: ModelConfig, seed: int = 0, num_dense: int = DD) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, num_dense, generator=g), torch.randn(B, NF, cfg.embedding_dim, generator=g)


def _build(cfg: ModelConfig, seed: int = 0, num_dense: int = DD) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(cfg, num_dense, NF)


@pytest.mark.parametrize("name,size", CASES)
def test_shape_finite_and_gradients(name: str, size: str) -> None:
    cfg = recipe(name, size)
    model = _build(cfg)
    dense, pooled = _inputs(cfg)
    pooled.requires_grad_(True)
    out = model(dense, pooled)
    assert out.shape == (B,) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    out.sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {pname}"
    assert pooled.grad is not None and pooled.grad.abs().sum() > 0


@pytest.mark.parametrize("name,size", CASES)
def test_same_seed_is_bitwise_identical(name: str, size: str) -> None:
    cfg = recipe(name, size)
    dense, pooled = _inputs(cfg)
    a, b = _build(cfg, seed=7)(dense, pooled), _build(cfg, seed=7)(dense, pooled)
    assert torch.equal(a, b)
    assert not torch.equal(a, _build(cfg, seed=8)(dense, pooled))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_overfits_a_fixed_batch(name: str) -> None:
    cfg = recipe(name, "debug")  # the kaggle sizes are covered above; this keeps the file fast
    model = _build(cfg, seed=1)
    dense, pooled0 = _inputs(cfg, seed=1)
    labels = ((dense[:, 0] + pooled0[:, 0].sum(1)) > 0).float()  # a learnable rule
    pooled = torch.nn.Parameter(pooled0.clone())
    opt = torch.optim.Adam([*model.parameters(), pooled], lr=1e-2)
    losses = []
    for _ in range(200):
        loss = F.binary_cross_entropy_with_logits(model(dense, pooled), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], f"{name}: loss {losses[0]:.3f} -> {losses[-1]:.3f}"


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_no_dense_features(name: str) -> None:
    cfg = recipe(name, "debug")
    dense, pooled = _inputs(cfg, num_dense=0)
    out = _build(cfg, num_dense=0)(dense, pooled)
    assert out.shape == (B,) and torch.isfinite(out).all()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(name="nope"),
        dict(name="dcn", embedding_dim=0),
        dict(name="dlrm", embedding_dim=16, bottom_mlp=(64, 8)),
        dict(name="dlrm", bottom_mlp=()),
        dict(name="deepfm", top_mlp=()),
        dict(name="wide_deep", top_mlp=(64, -1)),
        dict(name="dlrm", bottom_mlp=(0, 16)),
        dict(name="dcn", cross_layers=0),
    ],
)
def test_bad_config_raises(kwargs: dict) -> None:
    with pytest.raises(ConfigError) as e:
        ModelConfig(**kwargs)
    assert "\n" not in str(e.value)


def test_bad_names_raise() -> None:
    with pytest.raises(ConfigError, match="dlrm, deepfm, wide_deep, dcn"):
        recipe("nope", "debug")
    with pytest.raises(ConfigError):
        recipe("dlrm", "huge")
    cfg = recipe("dlrm", "debug")
    cfg.name = "nope"
    with pytest.raises(ConfigError, match="valid"):
        build_model(cfg, DD, NF)
    with pytest.raises(ConfigError):
        build_model(recipe("dcn", "debug"), DD, 0)


def test_kaggle_dlrm_recipe() -> None:
    cfg = recipe("dlrm", "kaggle")
    assert (cfg.embedding_dim, cfg.bottom_mlp, cfg.top_mlp) == (16, (512, 256, 64, 16), (512, 256))
    as_read: Any = [32, 16]  # a list, as a TOML file or JSON gives it (the field is typed as a tuple)
    assert ModelConfig(name="dlrm", bottom_mlp=as_read).bottom_mlp == (32, 16)  # lists are accepted


@pytest.mark.parametrize("self_interaction", [False, True])
def test_dot_interaction_matches_reference(self_interaction: bool) -> None:
    x = torch.randn(3, 4, 5)
    want = [(x[:, i] * x[:, j]).sum(1) for i in range(4) for j in range(4) if j < i or (self_interaction and j == i)]
    assert torch.allclose(DotInteraction(4, self_interaction)(x), torch.stack(want, 1), atol=1e-6)


def test_fm_second_order_matches_pairwise_sum() -> None:
    e = torch.randn(3, NF, 6, dtype=torch.float64)
    want = sum((e[:, i] * e[:, j]).sum(1) for i in range(NF) for j in range(i + 1, NF))
    assert torch.allclose(fm_second_order(e), want)
