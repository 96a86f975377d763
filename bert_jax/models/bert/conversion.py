"""BERT's names in other formats: the Hugging Face state dict (`BertForPreTraining`'s
"bert.encoder.layer.0.attention.self.query.weight") and google-research/bert's TF checkpoints
("bert/encoder/layer_0/attention/self/query/kernel", run_classifier.py's "output_weights",
run_squad.py's "cls/squad/output_weights"). Read by `bert_jax.checkpoints` through the family's
row (`families.FAMILIES["bert"].conversion`).
"""

from __future__ import annotations

import re

from bert_jax.models.conversion import (
    LAYER_INDEX_RE,
    TF_NAMES,
    FamilyConversion,
    sized_by_config,
)

CONVERSION = FamilyConversion(
    hf_prefix="bert.",
    hf_roots=("embeddings.", "encoder.", "pooler."),
    structural=r"^(bert/)?(embeddings|encoder)/",
    tied_decoder="cls.predictions.decoder.weight",
    word_embeddings="embeddings/word_embeddings/embedding",
    hf_aliases=(("cls.predictions.bias", "cls.predictions.decoder.bias"),),
    two_input_kernels=("attention/output/dense/kernel",),
    vocab_keys=re.compile(r"(^|/)(embeddings/word_embeddings/embedding|predictions/bias)$"),
    layer_index=LAYER_INDEX_RE,
    sized_by_config=sized_by_config("word_embeddings"),
    tf_config_file="bert_config.json",
    **TF_NAMES,
    tf_num_labels_key="output_weights",
    tf_default_head="BertForPreTraining",
)
