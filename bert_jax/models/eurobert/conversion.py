"""EuroBERT's names in the Hugging Face state dict ("model.layers.0.self_attn.q_proj.weight",
"lm_head.weight", "dense.weight", "classifier.weight"); it has no TF checkpoints. Read by
`bert_jax.checkpoints` through the family's row (`families.FAMILIES["eurobert"].conversion`).

`lm_head.weight` is the tied decoder only under `tie_word_embeddings`; an untied head (the
released models') holds it as its own kernel, `lm_head/kernel`.
"""

from __future__ import annotations

import re

from bert_jax.models.conversion import LAYER_INDEX_RE, FamilyConversion, sized_by_config

CONVERSION = FamilyConversion(
    hf_prefix="model.",
    hf_roots=("embed_tokens.", "layers.", "norm."),
    # The layers are `layers_<i>`, or one scanned `layers`.
    structural=r"^(model/)?(embed_tokens|layers(_\d+)?|norm)/",
    tied_decoder="lm_head.weight",
    word_embeddings="embed_tokens/embedding",
    two_input_kernels=("self_attn/o_proj/kernel",),
    vocab_keys=re.compile(r"(^|/)embed_tokens/embedding$"),
    layer_index=LAYER_INDEX_RE,
    sized_by_config=sized_by_config("embed_tokens"),
)
