"""Model configuration and named recipes (no torch here: ``--help`` and config checks
import this without loading it; :mod:`bagpipe.models.registry` builds the modules)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from bagpipe.errors import ConfigError

ModelName = Literal["dlrm", "deepfm", "wide_deep", "dcn"]
RecipeName = Literal["debug", "kaggle"]
MODEL_NAMES: tuple[str, ...] = get_args(ModelName)
RECIPE_SIZES: tuple[str, ...] = get_args(RecipeName)


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
    """DCN only: number of full-rank cross layers."""

    interaction_self: bool = False
    """DLRM only: include each vector's dot with itself (the Gram diagonal)."""

    def __post_init__(self) -> None:
        if self.name not in MODEL_NAMES:
            raise ConfigError(f"unknown model {self.name!r}; valid: {', '.join(MODEL_NAMES)}")
        check_positive_int("embedding_dim", self.embedding_dim)
        check_positive_int("cross_layers", self.cross_layers)
        self.bottom_mlp = _layer_sizes("bottom_mlp", self.bottom_mlp, allow_empty=self.name != "dlrm")
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
    """
    if model not in MODEL_NAMES:
        raise ConfigError(f"unknown model {model!r}; valid: {', '.join(MODEL_NAMES)}")
    if size == "debug":
        return ModelConfig(name=model, embedding_dim=8, bottom_mlp=(32, 8), top_mlp=(32, 16), cross_layers=2)
    if size == "kaggle":
        return ModelConfig(
            name=model, embedding_dim=16, bottom_mlp=(512, 256, 64, 16), top_mlp=(512, 256), cross_layers=3
        )
    raise ConfigError(f"unknown recipe size {size!r}; valid: {', '.join(RECIPE_SIZES)}")
