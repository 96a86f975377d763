"""BERT (google-research/bert, Hugging Face `model_type` "bert"): `config.py` holds BertConfig
and the size presets, `model.py` the encoder (BertModel), every Hugging Face task head and the
facts its registry row (`models.families`) reads: its parameter names, layer layout and
starting-value paths; `conversion.py` its names in Hugging Face (and TF) checkpoints, `flops.py`
its encoder's model FLOPs."""
