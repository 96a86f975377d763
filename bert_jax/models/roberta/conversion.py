"""RoBERTa's and XLM-RoBERTa's names in the Hugging Face state dict ("roberta.encoder.layer.0.
attention.self.query.weight", "lm_head.dense.weight", "classifier.out_proj.weight"), the same for
both models (transformers' XLMRoberta* classes keep the `roberta` prefix); neither has TF
checkpoints. Read by `bert_jax.checkpoints` through the rows (`families.FAMILIES["roberta"]`,
`["xlm-roberta"]`), so transformers 4.x's `flax_model.msgpack` converts too (`hf_flax`).
"""

from __future__ import annotations

from bert_jax.models.conversion import BERT_LAYERS, post_ln_conversion

CONVERSION = post_ln_conversion("roberta", "lm_head", BERT_LAYERS)
