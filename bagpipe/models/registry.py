"""The model registry: name -> ``nn.Module`` class.

``build_model(cfg, num_dense, num_features)`` returns an ``nn.Module`` whose
``forward(dense (B, Dd), pooled (B, F, D)) -> logits (B,)``. The embedding lookup is not
part of any model: the caller pools embeddings and passes the pooled tensor.
"""

from __future__ import annotations

from torch import nn

from bagpipe.errors import ConfigError
from bagpipe.models.config import MODEL_NAMES, ModelConfig, check_positive_int
from bagpipe.models.dcn import DCN
from bagpipe.models.deepfm import DeepFM
from bagpipe.models.dlrm import DLRM
from bagpipe.models.wide_deep import WideDeep

MODELS: dict[str, type[nn.Module]] = {"dlrm": DLRM, "deepfm": DeepFM, "wide_deep": WideDeep, "dcn": DCN}


def build_model(cfg: ModelConfig, num_dense: int, num_features: int) -> nn.Module:
    """Instantiate ``cfg.name`` for Dd = ``num_dense`` dense and F = ``num_features``
    categorical features. Parameters come from torch's global RNG: seed before calling."""
    if cfg.name not in MODELS:
        raise ConfigError(f"unknown model {cfg.name!r}; valid: {', '.join(MODEL_NAMES)}")
    if isinstance(num_dense, bool) or not isinstance(num_dense, int) or num_dense < 0:
        raise ConfigError(f"num_dense must be an int >= 0, got {num_dense!r}")
    check_positive_int("num_features", num_features)
    return MODELS[cfg.name](cfg, num_dense, num_features)
