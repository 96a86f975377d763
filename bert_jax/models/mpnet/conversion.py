"""MPNet's names in the Hugging Face state dict ("mpnet.encoder.layer.0.attention.attn.q.weight",
"mpnet.encoder.relative_attention_bias.weight", "lm_head.dense.weight",
"classifier.out_proj.weight"); no TF checkpoints. Read by `bert_jax.checkpoints` through the row
(`families.FAMILIES["mpnet"]`).
"""

from __future__ import annotations

from bert_jax.models.conversion import post_ln_conversion

CONVERSION = post_ln_conversion(
    "mpnet",
    "lm_head",
    ("encoder", "attention/attn/o/kernel"),
    more_tables=(("relative_attention_bias", "relative_attention_num_buckets", 0),),
)
