"""Building blocks shared by the CTR models.

Every ``nn.Linear`` keeps torch's default initialisation, drawn from the global RNG,
so a model is bitwise reproducible when the caller seeds torch before building it.
Nothing here calls ``torch.manual_seed``.

Shapes: B (batch), F (categorical features), D (embedding dim), Dd (dense features).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def mlp(in_dim: int, sizes: tuple[int, ...], *, relu_last: bool = True) -> nn.Sequential:
    """A stack ``Linear -> ReLU -> ... -> Linear [-> ReLU]``: (B, in_dim) -> (B, sizes[-1]).

    ``relu_last=False`` leaves the last layer linear (e.g. for a 1-unit logit layer).
    """
    layers: list[nn.Module] = []
    prev = in_dim
    for i, size in enumerate(sizes):
        layers.append(nn.Linear(prev, size))
        if relu_last or i < len(sizes) - 1:
            layers.append(nn.ReLU())
        prev = size
    return nn.Sequential(*layers)


def mlp_head(in_dim: int, hidden: tuple[int, ...]) -> nn.Sequential:
    """ReLU hidden layers of sizes ``hidden`` and a final ``Linear(..., 1)``: (B, in_dim) -> (B, 1)."""
    return mlp(in_dim, (*hidden, 1), relu_last=False)


class DotInteraction(nn.Module):
    """Pairwise dot products of N vectors (DLRM's feature interaction).

    ``(B, N, D) -> (B, P)`` with P = N(N-1)/2 (strict lower triangle) or N(N+1)/2 when
    ``self_interaction`` (diagonal included). One ``torch.bmm`` builds the (B, N, N) Gram
    matrix; a precomputed flat index of the triangle gathers the wanted entries.
    """

    def __init__(self, num_vectors: int, self_interaction: bool = False):
        super().__init__()
        rows, cols = torch.tril_indices(num_vectors, num_vectors, offset=0 if self_interaction else -1)
        self.num_vectors = num_vectors
        self.register_buffer("tri_index", rows * num_vectors + cols, persistent=False)

    @property
    def num_outputs(self) -> int:
        """P, the number of dot products per sample."""
        return int(self.tri_index.numel())

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, N, D) -> (B, P)."""
        gram = torch.bmm(x, x.transpose(1, 2))  # (B, N, N)
        return gram.flatten(1).index_select(1, self.tri_index)


class LinearTerm(nn.Module):
    """The first-order ("wide") term: a linear map of the dense features plus a learned
    projection of each pooled field embedding to a scalar.

    ``dense (B, Dd), pooled (B, F, D) -> (B,)``:
    ``w_d . dense + b + sum_f <w_f, pooled_f>``.

    The per-field vectors ``w_f`` (F, D) replace the dim-1 "linear embedding table" of the
    original DeepFM / Wide & Deep, so every model reads one embedding table of dim D and the
    embedding lookup stays outside the models. ``w_f`` is initialised like a
    ``Linear(D, 1)`` (uniform in +-1/sqrt(D)). With Dd = 0 only the bias and fields remain.
    """

    def __init__(self, num_dense: int, num_features: int, embedding_dim: int):
        super().__init__()
        self.dense = nn.Linear(num_dense, 1) if num_dense > 0 else None
        self.bias = None if num_dense > 0 else nn.Parameter(torch.zeros(1))
        bound = 1.0 / math.sqrt(embedding_dim)
        self.field_weight = nn.Parameter(torch.empty(num_features, embedding_dim).uniform_(-bound, bound))

    def forward(self, dense: Tensor, pooled: Tensor) -> Tensor:
        """dense (B, Dd), pooled (B, F, D) -> (B,)."""
        fields = (pooled * self.field_weight).sum(dim=(1, 2))
        if self.dense is not None:
            return self.dense(dense).squeeze(1) + fields
        return fields + self.bias
