"""DCN-v2 (Wang et al., 2021), parallel form, without its embedding tables.

    output:                         logit (B,)
                                        ^
                                 [Linear(K + H, 1)]
                                        ^
                          concat [x_L, h]  (B, K + H)
                            ^                  ^
            [cross layer L] ...          [deep MLP, ReLU]  (B, H = top_mlp[-1])
            x_{l+1} = x0 * (W_l x_l + b_l) + x_l      ^
                            ^                  |
                            +------ x0 --------+
                                    ^
                 x0 = concat [dense, flatten(pooled)]  (B, K = Dd + F*D)
                                    ^
    input:          dense (B, Dd), pooled (B, F, D)

Full-rank cross layers (W_l is K x K), ``cross_layers`` of them. The cross network and the
deep MLP both read x0 side by side (the paper's "parallel" structure); their outputs are
concatenated and a single Linear gives the logit.

With ``cross_rank`` r > 0 each W_l is the low-rank product U_l V_l (V_l: K -> r without
bias, U_l: r -> K with the layer's bias), as TorchRec's ``LowRankCrossNet``. With
``dcn_stacked`` the model is MLPerf's DLRM-DCNv2: the dense features go through the bottom
MLP (to D), x0 = concat [bottom(dense), flatten(pooled)] (K = (F + 1) D), the cross layers
run over it and the top MLP and a Linear(.., 1) over their output (stacked, not parallel).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from bagpipe.models.config import ModelConfig
from bagpipe.models.layers import mlp


class CrossNetwork(nn.Module):
    """``num_layers`` DCN-v2 cross layers: x0 (B, K) -> x_L (B, K)."""

    def __init__(self, width: int, num_layers: int, rank: int = 0):
        super().__init__()
        if rank:
            self.layers = nn.ModuleList(
                nn.Sequential(nn.Linear(width, rank, bias=False), nn.Linear(rank, width)) for _ in range(num_layers)
            )
        else:
            self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(num_layers))

    def forward(self, x0: Tensor) -> Tensor:
        """x0 (B, K) -> (B, K)."""
        x = x0
        for layer in self.layers:  # over cross layers, not features
            x = x0 * layer(x) + x
        return x


class DCN(nn.Module):
    """DCN-v2 over pre-pooled embeddings: forward(dense (B, Dd), pooled (B, F, D)) -> logits (B,)."""

    def __init__(self, cfg: ModelConfig, num_dense: int, num_features: int):
        super().__init__()
        self.stacked = cfg.dcn_stacked
        if self.stacked:
            self.bottom = mlp(num_dense, cfg.bottom_mlp)
            width = (num_features + 1) * cfg.embedding_dim
            self.cross = CrossNetwork(width, cfg.cross_layers, cfg.cross_rank)
            self.deep = mlp(width, cfg.top_mlp)
            self.head = nn.Linear(cfg.top_mlp[-1], 1)
            return
        width = num_dense + num_features * cfg.embedding_dim
        self.cross = CrossNetwork(width, cfg.cross_layers, cfg.cross_rank)
        self.deep = mlp(width, cfg.top_mlp)
        self.head = nn.Linear(width + cfg.top_mlp[-1], 1)

    def forward(self, dense: Tensor, pooled: Tensor) -> Tensor:
        """dense (B, Dd), pooled (B, F, D) -> logits (B,)."""
        if self.stacked:
            x0 = torch.cat([self.bottom(dense), pooled.flatten(1)], dim=1)  # (B, (F + 1) D)
            return self.head(self.deep(self.cross(x0))).squeeze(1)
        x0 = torch.cat([dense, pooled.flatten(1)], dim=1)  # (B, K)
        return self.head(torch.cat([self.cross(x0), self.deep(x0)], dim=1)).squeeze(1)
