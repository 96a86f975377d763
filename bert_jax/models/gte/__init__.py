"""GTE (Zhang et al. 2024; Hugging Face `model_type` "gte", gte-multilingual-base and
gte-base-en-v1.5): `config.py` holds GteConfig, `model.py` the encoder (GteModel), its Hugging
Face task heads (`ROLES`) and the facts about its parameter tree; `conversion.py` its names in
Hugging Face checkpoints, `flops.py` its encoder's model FLOPs. `ROWS` is its registry row,
built from them (`models.families` collects it)."""

import dataclasses

from bert_jax.models.conversion import TF_NAMES
from bert_jax.models.family import Family
from bert_jax.models.gte import conversion, flops, model
from bert_jax.models.gte.config import GteConfig

# No TF checkpoints (`tf_config_file` empty); its table rows carry google-research/bert's TF
# names, which nothing reads.
ROWS = (Family.of(GteConfig, model, flops, dataclasses.replace(conversion.CONVERSION, **TF_NAMES)),)
