"""GTE's names in the Hugging Face state dict: transformers 5's
("gte.layers.0.self_attn.q_proj.weight", "lm_head.layer_norm.weight"), which bert_jax writes,
and the original release's (Alibaba-NLP's "new.encoder.layer.0.attention.qkv_proj.weight",
"mlp.up_gate_proj", "attn_ln", "lm_head.norm"), which transformers 5 reads and still writes
from a model it built itself (under its own `gte.` prefix), read by renaming (`LEGACY_RENAMES`)
and cutting the fused projections (`read_legacy`): `qkv_proj` [3 * H * D, ...] into q, k and v,
`up_gate_proj` [2F, E] into up and gate (up first, as transformers' `Chunk(dim=0)`). It has no
TF checkpoints. Read by `bert_jax.checkpoints` through the family's row
(`families.FAMILIES["gte"].conversion`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from bert_jax.models.conversion import HF5_LAYERS, post_ln_conversion

# The original names (regex on a whole key) -> transformers 5's, in order.
LEGACY_RENAMES = (
    (r"^new\.", "gte."),
    (r"(^|\.)encoder\.layer\.", r"\1layers."),
    (r"\.attention\.o_proj\.", ".self_attn.o_proj."),
    (r"\.attn_ln\.", ".post_attention_layernorm."),
    (r"\.mlp_ln\.", ".post_mlp_layernorm."),
    (r"(^|\.)lm_head\.norm\.", r"\1lm_head.layer_norm."),
)
# A fused projection (regex on a whole key, group 1 "weight" or "bias") -> the names of its
# equal parts along axis 0, in order.
FUSED = (
    (re.compile(r"\.attention\.qkv_proj\.(weight|bias)$"),
     ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    (re.compile(r"\.mlp\.up_gate_proj\.(weight|bias)$"), ("mlp.up_proj", "mlp.gate_proj")),
)  # fmt: skip


def read_legacy(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`state` with the original names made transformers 5's: renamed, and each fused
    projection cut into its equal parts along axis 0 (`FUSED`); every other key as it is."""
    out: dict[str, np.ndarray] = {}
    for key, value in state.items():
        for pattern, repl in LEGACY_RENAMES:
            key = re.sub(pattern, repl, key)
        found = [(m, names) for pattern, names in FUSED for m in [pattern.search(key)] if m]
        if not found:
            out[key] = value
            continue
        fused, names = found[0]
        if value.shape[0] % len(names):
            raise ValueError(
                f"{key} has {value.shape[0]} rows: not {len(names)} parts of equal size"
            )
        for name, part in zip(names, np.split(value, len(names)), strict=True):
            out[key[: fused.start()] + f".{name}.{fused.group(1)}"] = part
    return out


CONVERSION = post_ln_conversion(
    "gte", "lm_head", HF5_LAYERS, bias_on_decoder=True, hf_legacy=read_legacy
)
