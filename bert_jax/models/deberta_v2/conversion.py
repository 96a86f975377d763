"""DeBERTa-v2's names in the Hugging Face state dict ("deberta.encoder.layer.0.attention.self.
query_proj.weight", "deberta.encoder.rel_embeddings.weight", "cls.predictions.transform.dense.
weight", "pooler.dense.weight") and in DeBERTa's own checkpoints ("lm_predictions.lm_head.bias",
the discriminator's "mask_predictions.classifier.weight"); no TF checkpoints. Read by
`bert_jax.checkpoints` through the row (`families.FAMILIES["deberta-v2"]`).
"""

from __future__ import annotations

import re

from bert_jax.models.conversion import LAYER_INDEX_RE, FamilyConversion

_TABLE = r"(\.weight|/embedding)?$"  # a table's name in either spelling

CONVERSION = FamilyConversion(
    hf_prefix="deberta.",
    hf_roots=("embeddings.", "encoder."),
    structural=r"^(deberta/)?(embeddings|encoder)/",
    # transformers' default (legacy) MLM head ties `cls.predictions.decoder` to the word
    # embeddings and its bias to `cls.predictions.bias`; DeBERTa's `lm_predictions.lm_head`
    # (legacy=False) has no decoder at all.
    tied_decoder="cls.predictions.decoder.weight",
    word_embeddings="embeddings/word_embeddings/embedding",
    hf_aliases=(("cls.predictions.bias", "cls.predictions.decoder.bias"),),
    two_input_kernels=("attention/output/dense/kernel",),
    vocab_keys=re.compile(
        r"(^|/)embeddings/word_embeddings/embedding$|^cls/predictions/bias$"
        r"|^lm_predictions/lm_head/bias$"
    ),
    layer_index=LAYER_INDEX_RE,
    sized_by_config=(
        ("word_embeddings" + _TABLE, "vocab_size", 0),
        ("word_embeddings" + _TABLE, "embedding_width", -1),
        ("position_embeddings" + _TABLE, "max_position_embeddings", 0),
        ("token_type_embeddings" + _TABLE, "type_vocab_size", 0),
        ("rel_embeddings" + _TABLE, "rel_embedding_rows", 0),
    ),
)
