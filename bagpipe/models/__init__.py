"""CTR models over pre-pooled embeddings: DLRM, DeepFM, Wide & Deep and DCN-v2.

Each model is ``forward(dense (B, Dd), pooled (B, F, D)) -> logits (B,)``; the embedding
lookup and pooling live outside the models so a cached embedding layer can be swapped in.
Build one with ``build_model(recipe("dlrm", "kaggle"), num_dense, num_features)``.

``bagpipe.models.config`` (names, recipes, ``ModelConfig``) needs no torch;
``build_model`` loads it on first use.
"""

from bagpipe.models.config import MODEL_NAMES, RECIPE_SIZES, ModelConfig, recipe

__all__ = ["MODEL_NAMES", "RECIPE_SIZES", "ModelConfig", "build_model", "recipe"]


def __getattr__(name: str):
    if name == "build_model":
        from bagpipe.models.registry import build_model

        return build_model
    raise AttributeError(f"module 'bagpipe.models' has no attribute {name!r}")
