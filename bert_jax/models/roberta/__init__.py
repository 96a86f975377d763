"""RoBERTa and XLM-RoBERTa (Hugging Face `model_type` "roberta" and "xlm-roberta": one
architecture, two registry rows): `config.py` holds RobertaConfig, XLMRobertaConfig and the size
presets, `model.py` the encoder (RobertaModel), every Hugging Face task head (`ROLES`), their
XLMRoberta* names (`XLM_ROLES`) and the facts about the parameter tree; `conversion.py` their
names in Hugging Face checkpoints (the same for both), `flops.py` the encoder's model FLOPs.
`ROWS` are the two registry rows, built from them (`models.families` collects them)."""

from bert_jax.models.family import Family
from bert_jax.models.roberta import conversion, flops, model
from bert_jax.models.roberta.config import RobertaConfig, XLMRobertaConfig

# One architecture, two model_types: XLM-RoBERTa's row is RoBERTa's but for its config class (a
# subclass, named by config.json's "xlm-roberta") and class names.
ROWS = (
    Family.of(RobertaConfig, model, flops, conversion.CONVERSION),
    Family.of(XLMRobertaConfig, model, flops, conversion.CONVERSION, roles=model.XLM_ROLES),
)
