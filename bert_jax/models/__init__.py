"""The models: every family's encoder and task heads, and what they are built from.

  families.py     the registry: one `Family` row per architecture (model_type, config and model
                  classes, the facts about its parameter tree, its checkpoint names, its FLOPs);
                  lookups by config, class name or config.json
  bert/           BERT: config.py (BertConfig, PRESETS), model.py (BertModel, Bert* heads),
                  conversion.py (its Hugging Face and TF names), flops.py
  modernbert/     ModernBERT: the same four modules
  roberta/        RoBERTa and XLM-RoBERTa (two registry rows): the same four modules
  config.py       what every family's config shares (EncoderConfig) and RuntimeConfig
  layers.py       the building blocks (Dense, Embed, Dropout, layer_norm, encoder_inputs)
  attention.py    the attention kernels and the masks they take
  heads.py        the call every head shares (`Head`) and the tied MLM decoder's logits
  outputs.py      the output records (EncoderOutput, MaskedLMOutput, ClassifierOutput, ...)
  params.py       parameter trees of any family: init_params, count_params, stack_layers
  conversion.py   FamilyConversion: the shape of a family's checkpoint names (its folder fills it)

A family is one folder plus its row in `families.py`; only the registry imports a family's
folder, and the shared modules name no family (`tests/layering_test.py` checks the imports).
"""
