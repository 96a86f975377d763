"""bert_jax: an exact BERT in JAX/Flax.

import bert_jax
config, params = bert_jax.convert.load_pytorch(hf_dir, model="BertForPreTraining")
out = bert_jax.BertForPreTraining(config).apply({"params": params}, input_ids)
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

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
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
    "get_model_class",
    "init_params",
    "losses",
]
