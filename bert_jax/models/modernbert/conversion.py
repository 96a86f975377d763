"""ModernBERT's names in the Hugging Face state dict ("model.layers.0.attn.Wqkv.weight",
"head.dense.weight", "decoder.bias"); it has no TF checkpoints. Read by `bert_jax.checkpoints`
through the family's row (`families.FAMILIES["modernbert"].conversion`).
"""

from __future__ import annotations

from bert_jax.models.conversion import FamilyConversion, encoder_names

_NAMES = encoder_names(
    "model",
    ("embeddings", "layers", "final_norm"),
    word_table="tok_embeddings",
    mlm_biases=("decoder/bias",),
)

CONVERSION = FamilyConversion(
    # Its layers are never stacked: each is `layers_<i>`.
    **{**_NAMES, "structural": r"^(model/)?(embeddings|layers_\d+|final_norm)/"},
    tied_decoder="decoder.weight",
    two_input_kernels=("attn/Wo/kernel",),
)
