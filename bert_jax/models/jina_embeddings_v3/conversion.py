"""Jina-embeddings-v3's names in the Hugging Face state dict, transformers 5's
("roberta.layers.0.self_attn.q_proj.weight", "roberta.layers.0.mlp.fc1.weight",
"lm_head.dense.weight", "classifier.out_proj.weight"; the encoder alone without the `roberta.`
prefix). It has no TF checkpoints. Read by `bert_jax.checkpoints` through the family's row
(`families.FAMILIES["jina_embeddings_v3"].conversion`).
"""

from __future__ import annotations

from bert_jax.models.conversion import HF5_LAYERS, post_ln_conversion

CONVERSION = post_ln_conversion("roberta", "lm_head", HF5_LAYERS)
