"""ModernBERT's pretraining recipe (`configs/pretrain.py:arch=modernbert`): MLM only at 30% masking,
packed rows, StableAdamW, WSD; its heads per objective. A run as a user runs it (leaving the
unigram plateau, exporting transformers' ModernBertForMaskedLM): tests/pretrain/mlm_run_test.py."""

import pytest

from bert_jax.models import families
from bert_jax.pretrain import run
from bert_jax.training import objectives
from tests.common import load_config_file


def test_modernbert_config_is_the_recipe():
    module = load_config_file("pretrain.py")
    c = module.get_config("arch=modernbert")
    cfg = families.config_from_fields(c.model.to_dict())
    assert families.family_of(cfg).model_type == "modernbert" and cfg.num_hidden_layers == 3
    assert c.job == "mlm" and c.data.masked_lm_prob == 0.3 and c.data.pack_sequences
    assert c.optimizer.name == "stable_adamw" and c.optimizer.schedule == "wsd"
    assert not c.optimizer.clip_norm and not c.runtime.scan_layers
    base1 = module.get_config("size=base,arch=modernbert")
    base2 = module.get_config("size=base,arch=modernbert,phase=2")
    assert (base1.data.max_seq_length, base1.model.global_rope_theta) == (1024, 10_000.0)
    assert (base2.data.max_seq_length, base2.model.global_rope_theta) == (8192, 160_000.0)
    assert base2.model.local_rope_theta == 10_000.0
    # Phase 2 keeps phase 1's tokens a step.
    assert base1.global_batch_size * 1024 == base2.global_batch_size * 8192
    # The paper's fully decoupled weight decay 1e-5, in optax's (learning-rate-scaled) terms.
    assert base1.optimizer.weight_decay * base1.optimizer.peak_learning_rate == pytest.approx(1e-5)
    large = module.get_config("size=large,arch=modernbert,tpu=v5e-16")
    assert large.topology == "v5e:4x4" and large.model.num_hidden_layers == 28
    with pytest.raises(ValueError, match="arch=modernbert has sizes"):
        module.get_config("size=mini,arch=modernbert")
    with pytest.raises(ValueError, match="unknown arch"):
        module.get_config("arch=gpt2")
    with pytest.raises(ValueError, match="no ModernBERT recipe for tpu='v4-32'"):
        module.get_config("size=large,arch=modernbert,tpu=v4-32")
    # Only the compiled (size, phase) recipes of a slice (benchmarks/RESULTS_tpu.md).
    assert large.num_microbatches > 1 and large.runtime.remat_policy == "dots"
    with pytest.raises(ValueError, match="no ModernBERT recipe for size=large,phase=2"):
        module.get_config("size=large,arch=modernbert,tpu=v5e-16,phase=2")


def test_the_objectives_heads_in_each_family():
    modern = families.FAMILIES["modernbert"]
    assert modern.head_for(objectives.get_objective("mlm").role) == "ModernBertForMaskedLM"
    assert families.FAMILIES["bert"].head_for("BertForPreTraining") == "BertForPreTraining"
    for name in ("classification", "token_classification", "question_answering"):
        assert modern.head_for(objectives.get_objective(name).role).startswith("ModernBertFor")
    with pytest.raises(ValueError, match="modernbert has no pretraining head"):
        modern.head_for(objectives.get_objective("pretraining").role)


def test_a_position_table_start_is_refused_for_rope():
    config = load_config_file("pretrain.py").get_config("arch=modernbert")
    config.position_embeddings_init, config.mlm_bias_init = "sinusoid", "zeros"
    cfg = families.config_from_fields(config.model.to_dict())
    with pytest.raises(ValueError, match="modernbert has no position embeddings"):
        run.starting_values(config, run.check_config(config), cfg, data=None)
