"""BERT (google-research/bert, Hugging Face `model_type` "bert"): `config.py` holds BertConfig
and the size presets, `model.py` the encoder (BertModel), every Hugging Face task head (`ROLES`)
and the facts about its parameter tree: its parameter names, layer layout and starting-value
paths; `conversion.py` its names in Hugging Face (and TF) checkpoints, `flops.py` its encoder's
model FLOPs. `ROWS` is its registry row, built from them (`models.families` collects it)."""

from bert_jax.models.bert import conversion, flops, model
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.family import Family

ROWS = (Family.of(BertConfig, model, flops, conversion.CONVERSION),)
