"""DeepFM (Guo et al., 2017), without its embedding tables.

    output:                     logit (B,)
                                    ^
                  +------------- (sum) -------------+
                  ^                 ^               ^
          [first order]     [FM second order]   [deep MLP: ReLU hidden, Linear(., 1)]
          w_d.dense + b     0.5 * sum_D(             ^
          + sum_f <w_f,e_f>   (sum_f e_f)^2     concat [dense, flatten(pooled)]
                  ^           - sum_f e_f^2)        (B, Dd + F*D)
                  |                 ^               ^
    input:  dense (B, Dd), pooled (B, F, D) = e_1 .. e_F

The first-order term uses a learned projection w_f (D,) of each pooled field embedding
instead of the usual dim-1 linear embedding table, so every model reads one table of dim D
(see ``layers.LinearTerm``). The FM term covers the F fields only; dense features enter
through the first-order term and the deep MLP.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from bagpipe.models.config import ModelConfig
from bagpipe.models.layers import LinearTerm, mlp_head


def fm_second_order(pooled: Tensor) -> Tensor:
    """Sum of pairwise field interactions sum_{i<j} <e_i, e_j>: (B, F, D) -> (B,)."""
    square_of_sum = pooled.sum(dim=1).square()  # (B, D)
    sum_of_squares = pooled.square().sum(dim=1)  # (B, D)
    return 0.5 * (square_of_sum - sum_of_squares).sum(dim=1)


class DeepFM(nn.Module):
    """DeepFM over pre-pooled embeddings: forward(dense (B, Dd), pooled (B, F, D)) -> logits (B,)."""

    def __init__(self, cfg: ModelConfig, num_dense: int, num_features: int):
        super().__init__()
        self.linear = LinearTerm(num_dense, num_features, cfg.embedding_dim)
        self.deep = mlp_head(num_dense + num_features * cfg.embedding_dim, cfg.top_mlp)

    def forward(self, dense: Tensor, pooled: Tensor) -> Tensor:
        """dense (B, Dd), pooled (B, F, D) -> logits (B,)."""
        deep_in = torch.cat([dense, pooled.flatten(1)], dim=1)  # (B, Dd + F*D)
        return self.linear(dense, pooled) + fm_second_order(pooled) + self.deep(deep_in).squeeze(1)
