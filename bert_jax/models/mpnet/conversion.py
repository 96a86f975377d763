"""MPNet's names in the Hugging Face state dict ("mpnet.encoder.layer.0.attention.attn.q.weight",
"mpnet.encoder.relative_attention_bias.weight", "lm_head.dense.weight",
"classifier.out_proj.weight"); no TF checkpoints. Read by `bert_jax.checkpoints` through the row
(`families.FAMILIES["mpnet"]`).
"""

from __future__ import annotations

from bert_jax.models.conversion import FamilyConversion, encoder_names

CONVERSION = FamilyConversion(
    **encoder_names(
        "mpnet",
        ("embeddings", "encoder"),
        heads_roots=("pooler",),
        mlm_biases=("lm_head/bias",),
        more_tables=(("relative_attention_bias", "relative_attention_num_buckets", 0),),
    ),
    tied_decoder="lm_head.decoder.weight",
    # The MLM bias is `lm_head.bias`, and transformers ties `lm_head.decoder.bias` to it.
    hf_aliases=(("lm_head.bias", "lm_head.decoder.bias"),),
    two_input_kernels=("attention/attn/o/kernel",),
)
