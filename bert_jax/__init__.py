"""bert_jax: an exact BERT in JAX/Flax.

import bert_jax
model, params, config, tokenizer, head = bert_jax.from_pretrained(hf_dir, "BertForPreTraining")
out = model.apply({"params": params}, input_ids)
"""

from bert_jax import convert, losses
from bert_jax.config import PRESETS, BertConfig, RuntimeConfig
from bert_jax.model import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    count_params,
    get_model_class,
    init_params,
)
from bert_jax.pretrained import Pretrained, from_pretrained

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "Pretrained",
    "BertConfig",
    "BertForMaskedLM",
    "BertForMultipleChoice",
    "BertForNextSentencePrediction",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
    "RuntimeConfig",
    "convert",
    "count_params",
    "from_pretrained",
    "get_model_class",
    "init_params",
    "losses",
]
