"""ModernBERT (Warner et al. 2024; Hugging Face `model_type` "modernbert"): `config.py` holds
ModernBertConfig, `model.py` the encoder (ModernBertModel), its Hugging Face task heads and the
facts its registry row (`models.families`) reads: its parameter names, layer layout and
starting-value paths; `conversion.py` its names in Hugging Face (and TF) checkpoints, `flops.py`
its encoder's model FLOPs."""
