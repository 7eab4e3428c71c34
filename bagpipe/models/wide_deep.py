"""Wide & Deep (Cheng et al., 2016), without its embedding tables.

    output:                  logit (B,)
                                 ^
                  +---------- (sum) ----------+
                  ^                           ^
               [wide]              [deep MLP: ReLU hidden, Linear(., 1)]
          w_d.dense + b                       ^
          + sum_f <w_f, e_f>      concat [dense, flatten(pooled)]  (B, Dd + F*D)
                  ^                           ^
    input:  dense (B, Dd), pooled (B, F, D) = e_1 .. e_F

The wide part's per-field projection w_f (D,) of each pooled embedding replaces the
original's sparse one-hot / cross-product weights (a dim-1 table), so every model reads one
embedding table of dim D (see ``layers.LinearTerm``). No hand-made cross features.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from bagpipe.models.config import ModelConfig
from bagpipe.models.layers import LinearTerm, mlp_head


class WideDeep(nn.Module):
    """Wide & Deep over pre-pooled embeddings: forward(dense (B, Dd), pooled (B, F, D)) -> logits (B,)."""

    def __init__(self, cfg: ModelConfig, num_dense: int, num_features: int):
        super().__init__()
        self.wide = LinearTerm(num_dense, num_features, cfg.embedding_dim)
        self.deep = mlp_head(num_dense + num_features * cfg.embedding_dim, cfg.top_mlp)

    def forward(self, dense: Tensor, pooled: Tensor) -> Tensor:
        """dense (B, Dd), pooled (B, F, D) -> logits (B,)."""
        deep_in = torch.cat([dense, pooled.flatten(1)], dim=1)  # (B, Dd + F*D)
        return self.wide(dense, pooled) + self.deep(deep_in).squeeze(1)
