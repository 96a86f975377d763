"""The models: every family's encoder and task heads, and what they are built from.

  families.py     the registry: one `Family` row per architecture (model_type, config and model
                  classes, the facts about its parameter tree); lookups by config, class name or
                  config.json
  bert/           BERT: its config (BertConfig, PRESETS) and modules (BertModel, Bert* heads)
  modernbert/     ModernBERT: its config and modules (ModernBertModel, ModernBert* heads)
  config.py       what every family's config shares (EncoderConfig) and RuntimeConfig
  layers.py       the building blocks (Dense, Embed, Dropout, layer_norm, encoder_inputs)
  attention.py    the attention kernels and the masks they take
  heads.py        the call every head shares (`Head`) and the tied MLM decoder's logits
  outputs.py      the output records (EncoderOutput, MaskedLMOutput, ClassifierOutput, ...)
  params.py       parameter trees of any family: init_params, count_params, stack_layers

A family is one folder plus its row in `families.py`; only the registry imports a family's
folder, and the shared modules name no family (`tests/layering_test.py` checks the imports).
"""
