"""BERT (google-research/bert, Hugging Face `model_type` "bert"): `config.py` holds BertConfig
and the size presets, `model.py` the encoder (BertModel), every Hugging Face task head (`ROLES`)
and the facts about its parameter tree: its parameter names, layer layout and starting-value
paths; `conversion.py` its names in Hugging Face (and TF) checkpoints, `flops.py` its encoder's
model FLOPs. `ROWS` is its registry row, built from them (`models.families` collects it)."""

from bert_jax.models.bert import conversion, flops, model
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.family import Family

ROWS = (
    Family(
        "bert",
        BertConfig,
        model.ROLES,
        model.ENCODER_NAME,
        layers_path=model.LAYERS_PATH,
        layer_name=model.LAYER_NAME,
        scanned_layer=model.SCANNED_LAYER,
        starting_paths=model.STARTING_PATHS,
        encoder_flops=flops.encoder_forward_flops,
        conversion=conversion.CONVERSION,
    ),
)
