"""MPNet (Hugging Face `model_type` "mpnet"; sentence-transformers' all-mpnet-base-v2):
`config.py` holds MPNetConfig and the size presets, `model.py` the encoder (MPNetModel), every
Hugging Face task head (`ROLES`) and the facts about the parameter tree; `conversion.py` their
names in Hugging Face checkpoints, `flops.py` the encoder's model FLOPs. `ROWS` is the registry
row, built from them (`models.families` collects it)."""

from bert_jax.models.family import Family
from bert_jax.models.mpnet import conversion, flops, model
from bert_jax.models.mpnet.config import MPNetConfig

ROWS = (Family.of(MPNetConfig, model, flops, conversion.CONVERSION),)
