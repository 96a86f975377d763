"""ModernBERT's names in the Hugging Face state dict ("model.layers.0.attn.Wqkv.weight",
"head.dense.weight", "decoder.bias"); it has no TF checkpoints. Read by `bert_jax.checkpoints`
through the family's row (`families.FAMILIES["modernbert"].conversion`).
"""

from __future__ import annotations

import re

from bert_jax.models.conversion import LAYER_INDEX_RE, FamilyConversion, sized_by_config

CONVERSION = FamilyConversion(
    hf_prefix="model.",
    hf_roots=("embeddings.", "layers.", "final_norm."),
    structural=r"^(model/)?(embeddings|layers_\d+|final_norm)/",
    tied_decoder="decoder.weight",
    word_embeddings="embeddings/tok_embeddings/embedding",
    two_input_kernels=("attn/Wo/kernel",),
    vocab_keys=re.compile(r"(^|/)embeddings/tok_embeddings/embedding$|^decoder/bias$"),
    layer_index=LAYER_INDEX_RE,
    sized_by_config=sized_by_config("tok_embeddings"),
)
