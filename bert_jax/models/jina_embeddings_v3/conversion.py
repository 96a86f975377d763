"""Jina-embeddings-v3's names in the Hugging Face state dict, transformers 5's
("roberta.layers.0.self_attn.q_proj.weight", "roberta.layers.0.mlp.fc1.weight",
"lm_head.dense.weight", "classifier.out_proj.weight"; the encoder alone without the `roberta.`
prefix). It has no TF checkpoints. Read by `bert_jax.checkpoints` through the family's row
(`families.FAMILIES["jina_embeddings_v3"].conversion`).
"""

from __future__ import annotations

from bert_jax.models.conversion import FamilyConversion, encoder_names

CONVERSION = FamilyConversion(
    **encoder_names(
        "roberta",
        ("embeddings", "layers"),
        heads_roots=("pooler",),
        mlm_biases=("lm_head/bias",),
    ),
    tied_decoder="lm_head.decoder.weight",
    # The MLM bias is `lm_head.bias`, and transformers ties `lm_head.decoder.bias` to it.
    hf_aliases=(("lm_head.bias", "lm_head.decoder.bias"),),
    two_input_kernels=("self_attn/o_proj/kernel",),
)
