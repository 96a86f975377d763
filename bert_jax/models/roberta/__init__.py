"""RoBERTa and XLM-RoBERTa (Hugging Face `model_type` "roberta" and "xlm-roberta": one
architecture, two registry rows): `config.py` holds RobertaConfig, XLMRobertaConfig and the size
presets, `model.py` the encoder (RobertaModel), every Hugging Face task head, their XLMRoberta*
names and the facts the rows (`models.families`) read; `conversion.py` their names in Hugging
Face checkpoints (the same for both), `flops.py` the encoder's model FLOPs."""
