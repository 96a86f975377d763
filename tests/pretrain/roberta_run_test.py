"""RoBERTa's and XLM-RoBERTa's pretraining recipes (`configs/pretrain.py:arch=roberta`,
`arch=xlm-roberta`), and a few steps of XLM-R's from scratch on a Unigram vocabulary. A longer
run as a user runs it (leaving the unigram plateau, exporting transformers' masked LM with its
tokenizer): tests/pretrain/mlm_run_test.py."""

import json
import math

import pytest

from bert_jax import tokenization
from bert_jax.models import families
from bert_jax.pretrain.data import build
from bert_jax.training import objectives
from tests import family_fixtures
from tests.common import load_config_file
from tests.conformance_test import train_py, train_rows


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


def test_xlm_roberta_config_is_the_recipe():
    """XLM-R's paper's batch, updates and vocabulary; RoBERTa's rates, optimizer and rows."""
    module = load_config_file("pretrain.py")
    c = module.get_config("arch=xlm-roberta")
    cfg = families.config_from_fields(c.model.to_dict())
    assert families.family_of(cfg).model_type == "xlm-roberta" and cfg.vocab_size == 8192
    assert families.family_of(cfg).head_for(objectives.get_objective(c.job).role) == (
        "XLMRobertaForMaskedLM"
    )
    assert c.data.vocab_kind == "unigram" and c.data.source == "default"
    for size in ("tiny", "base", "large"):
        xlmr = module.get_config(f"size={size},arch=xlm-roberta")
        roberta = module.get_config(f"size={size},arch=roberta")
        assert xlmr.job == "mlm" and xlmr.data.masked_lm_prob == 0.15 and xlmr.data.dynamic_masking
        assert xlmr.data.full_sentences and not xlmr.data.pack_sequences
        assert xlmr.optimizer.to_dict() == roberta.optimizer.to_dict()  # the paper gives none
        assert xlmr.data.max_seq_length == roberta.data.max_seq_length
        if size != "tiny":
            assert xlmr.data.max_seq_length == 512 and xlmr.data.source == "records"
            assert (xlmr.global_batch_size, xlmr.num_train_steps) == (8192, 1_500_000)
            assert xlmr.model.vocab_size == 250002 and xlmr.model.model_type == "xlm-roberta"
    base, large = (module.get_config(f"size={s},arch=xlm-roberta") for s in ("base", "large"))
    assert (base.model.num_hidden_layers, base.model.hidden_size) == (12, 768)
    assert (large.model.num_hidden_layers, large.model.hidden_size) == (24, 1024)
    assert (base.optimizer.peak_learning_rate, base.optimizer.warmup_steps) == (6e-4, 24_000)
    assert (large.optimizer.peak_learning_rate, large.optimizer.warmup_steps) == (4e-4, 30_000)
    with pytest.raises(ValueError, match="arch=xlm-roberta has sizes"):
        module.get_config("size=mini,arch=xlm-roberta")
    with pytest.raises(ValueError, match="one phase"):
        module.get_config("size=base,arch=xlm-roberta,phase=2")
    with pytest.raises(ValueError, match="GPU recipes are BERT's, not xlm-roberta's"):
        module.get_config("size=base,arch=xlm-roberta,gpu=h100")


# e2e (about 20 s): the recipe's run on XLM-R's Unigram tokenizer is conformance_test's
# test_pretraining_with_the_familys_recipe[xlm-roberta]; this one starts from scratch.
@pytest.mark.e2e
def test_xlm_roberta_recipe_trains_from_scratch_on_a_unigram_vocabulary(tmp_path):
    """`arch=xlm-roberta,size=tiny` for three steps from scratch (no init_from: the recipe's
    starting values) on records of a Unigram vocabulary trained on the excerpt, exported as
    XLMRobertaForMaskedLM with that tokenizer."""
    recipe = family_fixtures.load_config("pretrain.py", "arch=xlm-roberta")
    tokenizer = tokenization.train_unigram(family_fixtures.training_texts(), vocab_size=600)
    options = build.PretrainingOptions(
        max_seq_length=32,
        max_predictions_per_seq=5,
        masked_lm_prob=recipe.data.masked_lm_prob,
        next_sentence_prediction=False,
        static_masking=False,
        dupe_factor=1,
        full_sentences=True,
    )
    data = tmp_path / "data"
    build.build_pretraining_shards(
        family_fixtures.documents(), data, tokenizer, options, num_shards=2, num_workers=1,
        progress=False,
    )  # fmt: skip
    train_py(
        "pretrain.py:arch=xlm-roberta,size=tiny",
        tmp_path / "run",
        **{"model.vocab_size": tokenizer.vocab_size},
        **{"data.source": "records", "data.paths": str(data)},
        **{"data.max_seq_length": 32, "data.max_predictions_per_seq": 5},
        global_batch_size=8,
        num_train_steps=3,
        eval_every_steps=3,
        num_eval_steps=1,
        log_every_steps=1,
        checkpoint_every_steps=3,
    )
    rows = train_rows(tmp_path / "run")
    assert sorted(rows) == [1, 2, 3] and all(math.isfinite(r["train/loss"]) for r in rows.values())
    hf_dir = tmp_path / "run" / "hf"
    written = json.loads((hf_dir / "config.json").read_text())
    assert written["model_type"] == "xlm-roberta"
    assert written["architectures"] == ["XLMRobertaForMaskedLM"]
    assert written["vocab_size"] == 600
    exported = tokenization.load_tokenizer(hf_dir)
    assert exported.kind == "unigram" and exported.fingerprint() == tokenizer.fingerprint()
