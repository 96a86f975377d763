"""NomicBERT's names in the Hugging Face state dict: transformers 5's
("nomic_bert.layers.0.self_attn.q_proj.weight", "cls.predictions.transform.layer_norm.weight"),
which bert_jax writes, and the original release's (nomic-ai/nomic-embed-text-v1.5's
"encoder.layers.0.attn.Wqkv.weight", "emb_ln.weight"), which transformers 5 reads and still
writes from a model it built itself, read by renaming (`LEGACY_RENAMES`) and splitting the fused
[3 * H * D, E] `Wqkv` into q, k and v (`read_legacy`). It has no TF checkpoints. Read by
`bert_jax.checkpoints` through the family's row (`families.FAMILIES["nomic_bert"].conversion`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from bert_jax.models.conversion import HF5_LAYERS, post_ln_conversion

# The original names (regex on a whole key) -> transformers 5's, in order.
LEGACY_RENAMES = (
    (r"(^|\.)emb_ln\.", r"\1embeddings.LayerNorm."),
    (r"(^|\.)encoder\.layers\.", r"\1layers."),
    (r"\.attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.mlp\.fc11\.", ".mlp.up_proj."),
    (r"\.mlp\.fc12\.", ".mlp.gate_proj."),
    (r"\.mlp\.fc2\.", ".mlp.down_proj."),
    (r"\.norm1\.", ".post_attention_layernorm."),
    (r"\.norm2\.", ".post_mlp_layernorm."),
)
_FUSED = re.compile(r"\.attn\.Wqkv\.(weight|bias)$")


def read_legacy(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`state` with the original names made transformers 5's: renamed, and each fused
    `attn.Wqkv` [3 * H * D, ...] cut into `self_attn.{q,k,v}_proj` [H * D, ...] (q first, as
    transformers' `Chunk(dim=0)`); every other key as it is."""
    out: dict[str, np.ndarray] = {}
    for key, value in state.items():
        for pattern, repl in LEGACY_RENAMES:
            key = re.sub(pattern, repl, key)
        fused = _FUSED.search(key)
        if fused is None:
            out[key] = value
            continue
        if value.shape[0] % 3:
            raise ValueError(f"{key} has {value.shape[0]} rows: not q, k and v of equal size")
        for name, part in zip(("q_proj", "k_proj", "v_proj"), np.split(value, 3), strict=True):
            out[key[: fused.start()] + f".self_attn.{name}.{fused.group(1)}"] = part
    return out


CONVERSION = post_ln_conversion("nomic_bert", "cls.predictions", HF5_LAYERS, hf_legacy=read_legacy)
