"""bert_jax: an exact BERT (and ModernBERT) in JAX/Flax.

import bert_jax
model, params, config, tokenizer, head = bert_jax.from_pretrained(hf_dir, "BertForPreTraining")
out = model.apply({"params": params}, input_ids)
config, params = bert_jax.convert.load_pytorch(hf_dir, model="ModernBertForMaskedLM")
out = bert_jax.ModernBertForMaskedLM(config).apply({"params": params}, input_ids)
"""

from bert_jax import convert, losses
from bert_jax.config import PRESETS, BertConfig, RuntimeConfig
from bert_jax.families import get_model_class
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
    init_params,
)
from bert_jax.modernbert import (
    ModernBertForMaskedLM,
    ModernBertForMultipleChoice,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
)
from bert_jax.modernbert_config import ModernBertConfig
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
    "ModernBertConfig",
    "ModernBertForMaskedLM",
    "ModernBertForMultipleChoice",
    "ModernBertForQuestionAnswering",
    "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification",
    "ModernBertModel",
    "RuntimeConfig",
    "convert",
    "count_params",
    "from_pretrained",
    "get_model_class",
    "init_params",
    "losses",
]
