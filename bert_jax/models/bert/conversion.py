"""BERT's names in other formats: the Hugging Face state dict (`BertForPreTraining`'s
"bert.encoder.layer.0.attention.self.query.weight") and google-research/bert's TF checkpoints
("bert/encoder/layer_0/attention/self/query/kernel", run_classifier.py's "output_weights",
run_squad.py's "cls/squad/output_weights"). Read by `bert_jax.checkpoints` through the family's
row (`families.FAMILIES["bert"].conversion`).
"""

from __future__ import annotations

import re

from bert_jax.models.conversion import LAYER_INDEX_RE, FamilyConversion, sized_by_config

# The heads' parameters saved by google-research/bert's scripts under other names.
TF_RENAMES = (
    (r"^cls/predictions/bias$", "cls/predictions/output_bias"),
    (r"^cls/seq_relationship/kernel$", "cls/seq_relationship/output_weights"),
    (r"^cls/seq_relationship/bias$", "cls/seq_relationship/output_bias"),
    (r"^classifier/kernel$", "output_weights"),  # run_classifier.py
    (r"^classifier/bias$", "output_bias"),
    (r"^qa_outputs/kernel$", "cls/squad/output_weights"),  # run_squad.py
    (r"^qa_outputs/bias$", "cls/squad/output_bias"),
    (r"/embedding$", ""),
    (r"LayerNorm/scale$", "LayerNorm/gamma"),
    (r"LayerNorm/bias$", "LayerNorm/beta"),
)

# How google-research/bert names a parameter in TF: `FamilyConversion.tf_key`.
TF_NAMES = dict(
    tf_prefix="bert/",
    tf_top_level=("bert/", "cls/", "classifier/", "qa_outputs/"),
    tf_renames=TF_RENAMES,
    tf_out_weights=r"(^|/)(seq_relationship|classifier|qa_outputs)/kernel$",
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
