"""DeBERTa-v2's names in the Hugging Face state dict ("deberta.encoder.layer.0.attention.self.
query_proj.weight", "deberta.encoder.rel_embeddings.weight", "cls.predictions.transform.dense.
weight", "pooler.dense.weight") and in DeBERTa's own checkpoints ("lm_predictions.lm_head.bias",
the discriminator's "mask_predictions.classifier.weight"); no TF checkpoints. Read by
`bert_jax.checkpoints` through the row (`families.FAMILIES["deberta-v2"]`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from bert_jax.models.conversion import FamilyConversion, encoder_names


def mask_predictions_logits(
    state: Mapping[str, np.ndarray], last_hidden_state: np.ndarray, config
) -> np.ndarray:
    """DeBERTa-v3's replaced-token detection head as microsoft/DeBERTa computes it
    (`LMMaskPredictionHead`, which transformers lacks), from the weights named
    "mask_predictions.*": classifier(act(dense(LayerNorm(h[:, :1] + h)))) on the encoder's last
    hidden state h float32 [B, L, E]; returns float32 logits [B, L], one a token."""
    import torch
    from transformers.activations import ACT2FN

    w = {k: torch.tensor(np.asarray(state[f"mask_predictions.{k}"], np.float32))
         for k in ("LayerNorm.weight", "LayerNorm.bias", "dense.weight", "dense.bias",
                   "classifier.weight", "classifier.bias")}  # fmt: skip
    h = torch.tensor(last_hidden_state)
    with torch.no_grad():
        x = torch.nn.functional.layer_norm(
            h[:, :1] + h, (h.shape[-1],), w["LayerNorm.weight"], w["LayerNorm.bias"],
            config.layer_norm_eps,
        )  # fmt: skip
        x = ACT2FN[config.hidden_act](
            torch.nn.functional.linear(x, w["dense.weight"], w["dense.bias"])
        )
        logits = torch.nn.functional.linear(x, w["classifier.weight"], w["classifier.bias"])
    return logits[..., 0].numpy()


CONVERSION = FamilyConversion(
    **encoder_names(
        "deberta",
        ("embeddings", "encoder"),
        mlm_biases=("cls/predictions/bias", "lm_predictions/lm_head/bias"),
        width="embedding_width",
        more_tables=(("rel_embeddings", "rel_embedding_rows", 0),),
    ),
    # transformers' default (legacy) MLM head ties `cls.predictions.decoder` to the word
    # embeddings and its bias to `cls.predictions.bias`; DeBERTa's `lm_predictions.lm_head`
    # (legacy=False) has no decoder at all.
    tied_decoder="cls.predictions.decoder.weight",
    hf_aliases=(("cls.predictions.bias", "cls.predictions.decoder.bias"),),
    two_input_kernels=("attention/output/dense/kernel",),
    reference_heads=(("DebertaV2ForReplacedTokenDetection", mask_predictions_logits),),
)
