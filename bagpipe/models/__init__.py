"""CTR models over pre-pooled embeddings: DLRM, DeepFM, Wide & Deep and DCN-v2.

Each model is ``forward(dense (B, Dd), pooled (B, F, D)) -> logits (B,)``; the embedding
lookup and pooling live outside the models so a cached embedding layer can be swapped in.
Build one with ``build_model(recipe("dlrm", "kaggle"), num_dense, num_features)``.
"""

from bagpipe.models.registry import MODEL_NAMES, RECIPE_SIZES, ModelConfig, build_model, recipe

__all__ = ["MODEL_NAMES", "RECIPE_SIZES", "ModelConfig", "build_model", "recipe"]
