"""RoBERTa's and XLM-RoBERTa's names in the Hugging Face state dict ("roberta.encoder.layer.0.
attention.self.query.weight", "lm_head.dense.weight", "classifier.out_proj.weight"), the same for
both models (transformers' XLMRoberta* classes keep the `roberta` prefix); neither has TF
checkpoints. Read by `bert_jax.checkpoints` through the rows (`families.FAMILIES["roberta"]`,
`["xlm-roberta"]`), so transformers 4.x's `flax_model.msgpack` converts too (`hf_flax`).
"""

from __future__ import annotations

from bert_jax.models.conversion import FamilyConversion, encoder_names

CONVERSION = FamilyConversion(
    **encoder_names(
        "roberta",
        ("embeddings", "encoder"),
        heads_roots=("pooler",),
        mlm_biases=("lm_head/bias",),
    ),
    tied_decoder="lm_head.decoder.weight",
    # The MLM bias is `lm_head.bias`, and transformers ties `lm_head.decoder.bias` to it.
    hf_aliases=(("lm_head.bias", "lm_head.decoder.bias"),),
    two_input_kernels=("attention/output/dense/kernel",),
)
