"""DeBERTa-v2 and -v3 (Hugging Face `model_type` "deberta-v2"): `config.py` holds DebertaV2Config
and the DeBERTa-v3 presets, `model.py` the encoder (DebertaV2Model), every Hugging Face task head,
the v3 replaced-token-detection discriminator (`ROLES`) and the facts about the parameter tree;
`conversion.py` their names in Hugging Face checkpoints, `flops.py` the encoder's model FLOPs.
`ROWS` is the registry row, built from them (`models.families` collects it)."""

from bert_jax.models.deberta_v2 import conversion, flops, model
from bert_jax.models.deberta_v2.config import DebertaV2Config
from bert_jax.models.family import Family

ROWS = (Family.of(DebertaV2Config, model, flops, conversion.CONVERSION),)
