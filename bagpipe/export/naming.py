"""TorchRec's state_dict names for an exported model, where TorchRec has the same module.

Tables: always ``sparse_arch.embedding_bag_collection.embedding_bags.<table>.weight``
(num_embeddings, D), as an ``EmbeddingBagCollection`` of sum-pooled tables named after
the features names them (``C1``..``C26`` for Criteo), one feature per table.

Dense layers of DLRM with dense features and without the self-interaction (the
architecture of ``torchrec.models.dlrm.DLRM``), with B bottom and T top layers:

====================================  ==============================================
bagpipe                               TorchRec
====================================  ==============================================
``bottom.{2i}.weight|bias``           ``dense_arch.model._mlp.{i}._linear.weight|bias``
``top.{2i}.weight|bias`` (i < T)      ``over_arch.model.0._mlp.{i}._linear.weight|bias``
``top.{2T}.weight|bias`` (the logit)  ``over_arch.model.1.weight|bias``
====================================  ==============================================

The first top layer reads ``[x (D), dots]``; bagpipe orders the dots of N = F + 1 vectors
as the strict lower triangle (i > j, row by row), TorchRec as the strict upper triangle
(i < j), so that layer's dot columns are permuted (:func:`interaction_permutation`).
Every other model (DeepFM, Wide & Deep, DCN-v2: TorchRec's versions differ in
architecture; DLRM without dense features or with ``interaction_self``) keeps bagpipe's
own parameter names, and the export says so (``"naming": "bagpipe"``).
"""

from __future__ import annotations

import torch

from bagpipe.models.config import ModelConfig

TABLE_PREFIX = "sparse_arch.embedding_bag_collection.embedding_bags."


def table_key(name: str) -> str:
    """The state_dict name of table ``name``."""
    return f"{TABLE_PREFIX}{name}.weight"


def torchrec_naming(cfg: ModelConfig, num_dense: int) -> bool:
    """Whether TorchRec's DLRM has exactly this architecture (so its names apply)."""
    return cfg.name == "dlrm" and num_dense > 0 and not cfg.interaction_self


def interaction_permutation(n: int) -> torch.Tensor:
    """For each of TorchRec's strict-upper-triangle interaction outputs over n vectors,
    its index in bagpipe's strict-lower-triangle order."""
    lr, lc = torch.tril_indices(n, n, offset=-1)
    pos = {(int(i), int(j)): k for k, (i, j) in enumerate(zip(lr, lc))}
    ur, uc = torch.triu_indices(n, n, offset=1)
    return torch.tensor([pos[(int(j), int(i))] for i, j in zip(ur, uc)], dtype=torch.long)


def _dlrm_names(cfg: ModelConfig) -> dict[str, str]:
    names = {}
    for i in range(len(cfg.bottom_mlp)):
        for p in ("weight", "bias"):
            names[f"bottom.{2 * i}.{p}"] = f"dense_arch.model._mlp.{i}._linear.{p}"
    T = len(cfg.top_mlp)
    for i in range(T + 1):
        for p in ("weight", "bias"):
            names[f"top.{2 * i}.{p}"] = f"over_arch.model.0._mlp.{i}._linear.{p}" if i < T else f"over_arch.model.1.{p}"
    return names


def to_export(state: dict[str, torch.Tensor], cfg: ModelConfig, num_dense: int, num_features: int) -> tuple[dict, str]:
    """(the dense state_dict under its exported names, ``"torchrec"`` or ``"bagpipe"``)."""
    if not torchrec_naming(cfg, num_dense):
        return dict(state), "bagpipe"
    names = _dlrm_names(cfg)
    out = {names[k]: v for k, v in state.items()}
    D = cfg.embedding_dim
    w = state["top.0.weight"]
    perm = interaction_permutation(num_features + 1)
    out[names["top.0.weight"]] = torch.cat([w[:, :D], w[:, D:].index_select(1, perm)], dim=1)
    return out, "torchrec"


def from_export(
    tensors: dict[str, torch.Tensor], cfg: ModelConfig, num_dense: int, num_features: int, naming: str
) -> dict:
    """The inverse of :func:`to_export`: bagpipe's dense state_dict."""
    if naming == "bagpipe":
        return dict(tensors)
    names = _dlrm_names(cfg)
    state = {k: tensors[v] for k, v in names.items()}
    D = cfg.embedding_dim
    w = state["top.0.weight"]
    inverse = torch.argsort(interaction_permutation(num_features + 1))
    state["top.0.weight"] = torch.cat([w[:, :D], w[:, D:].index_select(1, inverse)], dim=1)
    return state
