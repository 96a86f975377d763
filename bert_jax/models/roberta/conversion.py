"""RoBERTa's and XLM-RoBERTa's names in the Hugging Face state dict ("roberta.encoder.layer.0.
attention.self.query.weight", "lm_head.dense.weight", "classifier.out_proj.weight"), the same for
both models (transformers' XLMRoberta* classes keep the `roberta` prefix); neither has TF
checkpoints. Read by `bert_jax.checkpoints` through the rows (`families.FAMILIES["roberta"]`,
`["xlm-roberta"]`), so transformers 4.x's `flax_model.msgpack` converts too (`hf_flax`).
"""

from __future__ import annotations

import re

from bert_jax.models.conversion import LAYER_INDEX_RE, FamilyConversion, sized_by_config

CONVERSION = FamilyConversion(
    hf_prefix="roberta.",
    hf_roots=("embeddings.", "encoder.", "pooler."),
    structural=r"^(roberta/)?(embeddings|encoder)/",
    tied_decoder="lm_head.decoder.weight",
    word_embeddings="embeddings/word_embeddings/embedding",
    # The MLM bias is `lm_head.bias`, and transformers ties `lm_head.decoder.bias` to it.
    hf_aliases=(("lm_head.bias", "lm_head.decoder.bias"),),
    two_input_kernels=("attention/output/dense/kernel",),
    vocab_keys=re.compile(r"(^|/)embeddings/word_embeddings/embedding$|^lm_head/bias$"),
    layer_index=LAYER_INDEX_RE,
    sized_by_config=sized_by_config("word_embeddings"),
)
