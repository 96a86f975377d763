"""ModernBERT (Warner et al. 2024; Hugging Face `model_type` "modernbert"): `config.py` holds
ModernBertConfig, `model.py` the encoder (ModernBertModel), its Hugging Face task heads
(`ROLES`) and the facts about its parameter tree: its parameter names, layer layout and
starting-value paths; `conversion.py` its names in Hugging Face checkpoints, `flops.py` its
encoder's model FLOPs. `ROWS` is its registry row, built from them (`models.families` collects
it)."""

import dataclasses

from bert_jax.models.conversion import TF_NAMES
from bert_jax.models.family import Family
from bert_jax.models.modernbert import conversion, flops, model
from bert_jax.models.modernbert.config import ModernBertConfig

# No TF checkpoints (`tf_config_file` empty); its table rows keep the TF names they have always
# had (google-research/bert's), which nothing reads.
ROWS = (
    Family.of(
        ModernBertConfig, model, flops, dataclasses.replace(conversion.CONVERSION, **TF_NAMES)
    ),
)
