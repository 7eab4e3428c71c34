"""Optimizers: row-wise sparse optimizers for embedding rows, torch optimizers for dense parameters."""

from bagpipe.optim.sparse import (
    OPTIMIZER_NAMES,
    RowWiseAdagrad,
    RowWiseSGD,
    SparseOptimizer,
    build_dense_optimizer,
    build_sparse_optimizer,
)

__all__ = ["OPTIMIZER_NAMES", "RowWiseAdagrad", "RowWiseSGD", "SparseOptimizer", "build_dense_optimizer", "build_sparse_optimizer"]
