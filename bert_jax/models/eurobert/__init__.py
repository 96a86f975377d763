"""EuroBERT (Boizard et al. 2025; Hugging Face `model_type` "eurobert"): `config.py` holds
EuroBertConfig, `model.py` the encoder (EuroBertModel) on the shared pre-norm layers
(`models.prenorm`), its Hugging Face task heads (`ROLES`) and the facts about its parameter tree;
`conversion.py` its names in Hugging Face checkpoints, `flops.py` its encoder's model FLOPs.
`ROWS` is its registry row, built from them (`models.families` collects it)."""

from bert_jax.models.eurobert import conversion, flops, model
from bert_jax.models.eurobert.config import EuroBertConfig
from bert_jax.models.family import Family

ROWS = (Family.of(EuroBertConfig, model, flops, conversion.CONVERSION),)
