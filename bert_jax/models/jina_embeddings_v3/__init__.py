"""Jina-embeddings-v3 (Sturua et al. 2024; Hugging Face `model_type` "jina_embeddings_v3"):
`config.py` holds JinaEmbeddingsV3Config, `model.py` the encoder (JinaEmbeddingsV3Model), its
Hugging Face task heads (`ROLES`) and the facts about its parameter tree; `conversion.py` its
names in Hugging Face checkpoints, `flops.py` its encoder's model FLOPs. `ROWS` is its registry
row, built from them (`models.families` collects it)."""

from bert_jax.models.family import Family
from bert_jax.models.jina_embeddings_v3 import conversion, flops, model
from bert_jax.models.jina_embeddings_v3.config import JinaEmbeddingsV3Config

ROWS = (Family.of(JinaEmbeddingsV3Config, model, flops, conversion.CONVERSION),)
