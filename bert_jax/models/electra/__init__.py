"""ELECTRA (Clark et al. 2020; Hugging Face `model_type` "electra"): `config.py` holds
ElectraConfig and the released sizes, `model.py` the encoder (ElectraModel), every Hugging Face
task head (`ROLES`: the replaced-token discriminator ElectraForPreTraining, the generator
ElectraForMaskedLM, the fine-tuning heads) and the facts about the parameter tree;
`conversion.py` their names in Hugging Face and google-research/electra TF checkpoints,
`flops.py` the encoder's model FLOPs. `ROWS` is its registry row, built from them
(`models.families` collects it)."""

from bert_jax.models.electra import conversion, flops, model
from bert_jax.models.electra.config import ElectraConfig
from bert_jax.models.family import Family

ROWS = (Family.of(ElectraConfig, model, flops, conversion.CONVERSION),)
