"""The models: every family's encoder and task heads, and what they are built from.

  families.py     the registry: the `Family` rows every family folder declares (found by
                  pkgutil); lookups by config, class name, role or config.json
  family.py       `Role` (what a model class is for) and `Family`, a registry row (model_type,
                  config class, classes by role, the facts about its parameter tree, its
                  checkpoint names, its FLOPs)
  bert/           BERT: config.py (BertConfig, PRESETS), model.py (BertModel, Bert* heads by
                  role), conversion.py (its Hugging Face names), flops.py; its row in
                  __init__.py (`ROWS`)
  modernbert/     ModernBERT: the same four modules and its row
  roberta/        RoBERTa and XLM-RoBERTa: the same four modules and their two rows
  electra/        ELECTRA (its discriminator and generator among the heads)
  deberta_v2/     DeBERTa-v2/v3 (disentangled attention)
  rtd.py          replaced-token detection's generator and discriminator as one module
  config.py       what every family's config shares (EncoderConfig: checks, config.json both
                  ways) and RuntimeConfig
  layers.py       the building blocks (Dense, Embed, Dropout, layer_norm, encoder_inputs)
  attention.py    the attention kernels and the masks they take
  heads.py        the call every head shares (`Head`) and the tied MLM decoder's logits
  outputs.py      the output records (EncoderOutput, MaskedLMOutput, ClassifierOutput, ...)
  params.py       parameter trees of any family: init_params, count_params, stack_layers
  conversion.py   FamilyConversion: the shape of a family's checkpoint names (its folder fills
                  it), and google-research/bert's TF names

A family is one folder, its rows in its `__init__.py`; only the registry imports a family's
folder, and the shared modules name no family (`tests/layering_test.py` checks the imports).
"""
