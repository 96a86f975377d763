"""RoBERTa's pretraining recipe (`configs/pretrain.py:arch=roberta`). A short run as a user runs it
(leaving the unigram plateau, exporting transformers' RobertaForMaskedLM with its tokenizer):
tests/pretrain/mlm_run_test.py."""

import pytest

from bert_jax.models import families
from bert_jax.training import objectives
from tests.common import load_config_file


def test_roberta_config_is_the_recipe():
    module = load_config_file("pretrain.py")
    c = module.get_config("arch=roberta")
    cfg = families.config_from_fields(c.model.to_dict())
    assert families.family_of(cfg).model_type == "roberta"
    assert families.family_of(cfg).head_for(objectives.get_objective(c.job).role) == (
        "RobertaForMaskedLM"
    )
    assert c.job == "mlm" and c.data.masked_lm_prob == 0.15 and c.data.dynamic_masking
    assert c.data.full_sentences and c.data.vocab_kind == "bpe" and not c.data.pack_sequences
    opt = c.optimizer
    assert (opt.b1, opt.b2, opt.eps, opt.weight_decay, opt.clip_norm) == (0.9, 0.98, 1e-6, 0.01, 0)
    assert opt.schedule == "linear" and opt.bias_correction
    base, large = (
        module.get_config("size=base,arch=roberta"),
        module.get_config("size=large,arch=roberta"),
    )
    assert base.data.max_seq_length == large.data.max_seq_length == 512
    assert base.global_batch_size == large.global_batch_size == 8192
    assert (base.optimizer.peak_learning_rate, base.optimizer.warmup_steps) == (6e-4, 24_000)
    assert (large.optimizer.peak_learning_rate, large.optimizer.warmup_steps) == (4e-4, 30_000)
    assert base.num_train_steps == large.num_train_steps == 500_000
    assert base.model.vocab_size == 50265 and large.model.num_hidden_layers == 24
    assert base.data.max_predictions_per_seq >= 0.15 * 512
    with pytest.raises(ValueError, match="arch=roberta has sizes"):
        module.get_config("size=mini,arch=roberta")
    with pytest.raises(ValueError, match="one phase"):
        module.get_config("size=base,arch=roberta,phase=2")
