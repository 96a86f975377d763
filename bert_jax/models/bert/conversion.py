"""BERT's names in other formats: the Hugging Face state dict (`BertForPreTraining`'s
"bert.encoder.layer.0.attention.self.query.weight") and google-research/bert's TF checkpoints
("bert/encoder/layer_0/attention/self/query/kernel", run_classifier.py's "output_weights",
run_squad.py's "cls/squad/output_weights"). Read by `bert_jax.checkpoints` through the family's
row (`families.FAMILIES["bert"].conversion`).
"""

from __future__ import annotations

from bert_jax.models.conversion import BERT_LAYERS, TF_NAMES, post_ln_conversion

CONVERSION = post_ln_conversion(
    "bert",
    "cls.predictions",
    BERT_LAYERS,
    tf_config_file="bert_config.json",
    **TF_NAMES,
    tf_num_labels_key="output_weights",
    tf_default_head="BertForPreTraining",
)
