"""Model configuration and named recipes (no torch here: ``--help`` and config checks
import this without loading it; :mod:`bagpipe.models.registry` builds the modules)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from bagpipe.errors import ConfigError

ModelName = Literal["dlrm", "deepfm", "wide_deep", "dcn"]
RecipeName = Literal["debug", "kaggle", "dcn-mlperf"]
MODEL_NAMES: tuple[str, ...] = get_args(ModelName)
RECIPE_SIZES: tuple[str, ...] = get_args(RecipeName)

#: The optimizer settings a recipe is known to train with, used where a run does not give
#: them (:func:`bagpipe.config.train.with_recipe_settings`). ``dcn-mlperf``: MLPerf Training's
#: DLRM-DCNv2 reference trains with Adagrad at a learning rate of 0.005; the default 0.05
#: made its loss explode (7.7e11 within 8 steps of batch 1024 on the criteo-1tb profile).
#: ``kaggle``: Adagrad at 0.002. The default 0.05 spiked every model's loss at step 2 on
#: the shipped Criteo and Avazu samples (DLRM on Criteo: 3,461, so 347 as the mean of steps
#: 1-10): torch's Adagrad starts from a zero accumulator, so its first step moves every dense
#: weight by the full rate, lr * g / |g|, which at 0.05 outweighs the initial weights of
#: 512-wide layers (about 1/sqrt(512) = 0.044). 0.002 was the largest rate measured with no
#: step above the first on both samples and all four models (docs/optimizers.md).
RECIPE_OPTIMIZER: dict[str, dict[str, object]] = {
    "dcn-mlperf": {"optimizer": "adagrad", "lr": 0.005},
    "kaggle": {"optimizer": "adagrad", "lr": 0.002},
}


@dataclass(kw_only=True)
class ModelConfig:
    """Architecture of one CTR model. Validated on construction (``ConfigError``)."""

    name: str
    """Which model: one of ``MODEL_NAMES``."""

    embedding_dim: int = 16
    """D, the width of every embedding table and of each pooled field vector."""

    bottom_mlp: tuple[int, ...] = (512, 256, 64, 16)
    """DLRM only: hidden sizes of the MLP over the dense features; the last must equal
    ``embedding_dim`` (its output joins the dot interaction)."""

    top_mlp: tuple[int, ...] = (512, 256)
    """Hidden sizes of the final MLP (DLRM's top MLP, the deep part of the others); the
    1-unit output layer is added automatically."""

    cross_layers: int = 3
    """DCN only: number of cross layers."""

    cross_rank: int = 0
    """DCN only: rank r of each cross layer's weight, W = U V (V: K -> r, U: r -> K), as
    MLPerf's DCN-v2 (r = 512); 0 for full-rank K x K weights."""

    dcn_stacked: bool = False
    """DCN only: the stacked form of MLPerf DLRM-DCNv2 (dense features through
    ``bottom_mlp``, whose last size must equal D; the cross layers over [that output,
    the pooled embeddings]; then ``top_mlp`` and the logit). False: the parallel form
    (cross layers and deep MLP side by side over [dense, embeddings]; no bottom MLP)."""

    interaction_self: bool = False
    """DLRM only: include each vector's dot with itself (the Gram diagonal)."""

    def __post_init__(self) -> None:
        if self.name not in MODEL_NAMES:
            raise ConfigError(f"unknown model {self.name!r}; valid: {', '.join(MODEL_NAMES)}")
        check_positive_int("embedding_dim", self.embedding_dim)
        check_positive_int("cross_layers", self.cross_layers)
        if isinstance(self.cross_rank, bool) or not isinstance(self.cross_rank, int) or self.cross_rank < 0:
            raise ConfigError(f"cross_rank must be an int >= 0, got {self.cross_rank!r}")
        if not isinstance(self.dcn_stacked, bool):
            raise ConfigError(f"dcn_stacked must be a bool, got {self.dcn_stacked!r}")
        stacked = self.name == "dcn" and self.dcn_stacked
        self.bottom_mlp = _layer_sizes("bottom_mlp", self.bottom_mlp, allow_empty=self.name != "dlrm" and not stacked)
        if stacked and self.bottom_mlp[-1] != self.embedding_dim:
            raise ConfigError(
                f"dcn (stacked): bottom_mlp last size {self.bottom_mlp[-1]} must equal embedding_dim {self.embedding_dim}"
            )
        self.top_mlp = _layer_sizes("top_mlp", self.top_mlp, allow_empty=False)
        if self.name == "dlrm" and self.bottom_mlp[-1] != self.embedding_dim:
            raise ConfigError(
                f"dlrm: bottom_mlp last size {self.bottom_mlp[-1]} must equal embedding_dim {self.embedding_dim}"
            )
        if not isinstance(self.interaction_self, bool):
            raise ConfigError(f"interaction_self must be a bool, got {self.interaction_self!r}")


def check_positive_int(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{field} must be a positive int, got {value!r}")


def _layer_sizes(field: str, sizes: object, *, allow_empty: bool) -> tuple[int, ...]:
    if not isinstance(sizes, (tuple, list)):
        raise ConfigError(f"{field} must be a tuple of positive ints, got {sizes!r}")
    if not sizes and not allow_empty:
        raise ConfigError(f"{field} must not be empty")
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s <= 0:
            raise ConfigError(f"{field} sizes must be positive ints, got {tuple(sizes)!r}")
    return tuple(sizes)


def recipe(model: str, size: str) -> ModelConfig:
    """A named configuration.

    ``debug``: D = 8 and tiny MLPs, trains in seconds on a CPU.
    ``kaggle``: DLRM's Criteo Kaggle recipe (D = 16, bottom 512-256-64-16, top 512-256-1);
    the other models use the same D and a 512-256 deep MLP (DCN: 3 cross layers), so all four
    are of comparable size.
    ``dcn-mlperf`` (``dcn`` only): MLPerf Training's DLRM-DCNv2 (D = 128, bottom MLP
    512-256-128, three DCN-v2 cross layers of rank 512 over the 27 vectors, top MLP
    1024-1024-512-256-1), to be trained with Adagrad on the ``criteo-1tb`` profile.
    """
    if model not in MODEL_NAMES:
        raise ConfigError(f"unknown model {model!r}; valid: {', '.join(MODEL_NAMES)}")
    if size == "dcn-mlperf":
        if model != "dcn":
            raise ConfigError(f"recipe dcn-mlperf is MLPerf's DLRM-DCNv2: use it with model dcn, not {model}")
        return ModelConfig(
            name="dcn",
            embedding_dim=128,
            bottom_mlp=(512, 256, 128),
            top_mlp=(1024, 1024, 512, 256),
            cross_layers=3,
            cross_rank=512,
            dcn_stacked=True,
        )
    if size == "debug":
        return ModelConfig(name=model, embedding_dim=8, bottom_mlp=(32, 8), top_mlp=(32, 16), cross_layers=2)
    if size == "kaggle":
        return ModelConfig(
            name=model, embedding_dim=16, bottom_mlp=(512, 256, 64, 16), top_mlp=(512, 256), cross_layers=3
        )
    raise ConfigError(f"unknown recipe size {size!r}; valid: {', '.join(RECIPE_SIZES)}")
