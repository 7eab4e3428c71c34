"""DLRM (Naumov et al., 2019), without its embedding tables.

    output:                       logit (B,)
                                     ^
                      [top MLP: ReLU hidden layers, Linear(., 1)]
                                     ^
                      concat [x, dots]  (B, D + P)
                        ^               ^
                        |     [dot interaction: tril of Z Z^T]  (B, P)
                        |               ^
                        |     Z = stack [x, e_1 .. e_F]  (B, F+1, D)
                        |        ^              ^
                        +--------+              |
                        |                       |
              x = [bottom MLP, ReLU]      e_1 .. e_F  pooled embeddings
                        ^                       ^
    input:        dense (B, Dd)           pooled (B, F, D)

P = N(N-1)/2 with N = F+1 (N(N+1)/2 with ``interaction_self``). With Dd = 0 there is no
bottom MLP: Z = pooled, N = F, and the top MLP sees only the dots.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from bagpipe.errors import ConfigError
from bagpipe.models.config import ModelConfig
from bagpipe.models.layers import DotInteraction, mlp, mlp_head


class DLRM(nn.Module):
    """DLRM over pre-pooled embeddings.

    forward(dense (B, Dd), pooled (B, F, D)) -> logits (B,).
    The bottom MLP (B, Dd) -> (B, D) has a ReLU after every layer, including the last, as
    in facebookresearch/dlrm; the logit layer has no sigmoid.
    """

    def __init__(self, cfg: ModelConfig, num_dense: int, num_features: int):
        super().__init__()
        d = cfg.embedding_dim
        self.bottom = mlp(num_dense, cfg.bottom_mlp) if num_dense > 0 else None
        n = num_features + (1 if self.bottom is not None else 0)
        self.interaction = DotInteraction(n, cfg.interaction_self)
        top_in = (d if self.bottom is not None else 0) + self.interaction.num_outputs
        if top_in == 0:
            raise ConfigError("dlrm: no dense features and a single field leave nothing to interact")
        self.top = mlp_head(top_in, cfg.top_mlp)

    def forward(self, dense: Tensor, pooled: Tensor) -> Tensor:
        """dense (B, Dd), pooled (B, F, D) -> logits (B,)."""
        if self.bottom is None:
            return self.top(self.interaction(pooled)).squeeze(1)
        x = self.bottom(dense)  # (B, D)
        z = torch.cat([x.unsqueeze(1), pooled], dim=1)  # (B, F+1, D)
        return self.top(torch.cat([x, self.interaction(z)], dim=1)).squeeze(1)
