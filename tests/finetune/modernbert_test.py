"""Fine-tuning from a ModernBERT checkpoint (`init_from` a transformers ModernBERT directory):
every kind of task head, chosen from the registry in ModernBERT's family, learns and exports
transformers' ModernBert* class (the same small files as run_test.py)."""

import json
import shutil

import jax
import numpy as np
import pytest

from bert_jax.checkpoints import hf
from bert_jax.finetune import run as finetune_run
from bert_jax.models.families import get_model_class
from bert_jax.models.modernbert.config import ModernBertConfig
from bert_jax.models.params import init_params
from tests.finetune.run_test import (  # noqa: F401  (the fixture)
    conll_file,
    finetune_config,
    regression_files,
    sentiment_files,
    squad_file,
    swag_files,
    vocab,
)


@pytest.fixture(scope="module")
def modernbert_dir(tmp_path_factory, vocab):  # noqa: F811
    """A randomly initialized 2-layer ModernBERT (a global and a local layer, window 8) with the
    test vocabulary, saved as transformers saves ModernBertForMaskedLM."""
    out = tmp_path_factory.mktemp("modernbert")
    with open(vocab / "vocab.txt") as f:
        size = sum(1 for _ in f)
    cfg = ModernBertConfig(
        vocab_size=size, pad_token_id=0, hidden_size=32, intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=2, global_attn_every_n_layers=2,
        local_attention=16, max_position_embeddings=64,
    )  # fmt: skip
    head = "ModernBertForMaskedLM"
    params = init_params(get_model_class(head)(cfg), jax.random.PRNGKey(0))
    hf.save_pytorch(cfg, jax.device_get(params), out, head, overwrite=True)
    shutil.copy(vocab / "vocab.txt", out / "vocab.txt")
    return out


def _run(config, tmp_path, head):
    results = finetune_run.train_and_evaluate(config, str(tmp_path / "run"))
    exported = json.loads((tmp_path / "run" / "hf" / "config.json").read_text())
    assert exported["model_type"] == "modernbert" and exported["architectures"] == [head]
    return results["mean"]


@pytest.mark.e2e  # about 25 s; packed rows equal padded: tests/models/modernbert_test.py
def test_classification_and_packed_rows(tmp_path, vocab, modernbert_dir):  # noqa: F811
    sentiment_files(tmp_path)
    for pack in (False, True):  # packed rows hold ~4 sentences: more epochs, as run_test's
        config = finetune_config(
            "custom", tmp_path, vocab, init_from=str(modernbert_dir),
            **{"finetune.pack": pack, "finetune.num_epochs": 12 if pack else 4},
        )  # fmt: skip
        mean = _run(config, tmp_path / f"pack{pack}", "ModernBertForSequenceClassification")
        assert mean["accuracy"] > 0.9, (pack, mean)


# With -m full, for CI's time (about 13 s): a regression head is the classification head
# with one output (conformance_test trains ModernBERT's), and run_test's BERT run learns the
# regression objective.
@pytest.mark.full
def test_regression(tmp_path, vocab, modernbert_dir):  # noqa: F811
    regression_files(tmp_path, np.random.default_rng(1))
    config = finetune_config(
        "custom", tmp_path, vocab, init_from=str(modernbert_dir),
        **{"finetune.regression": True, "finetune.label_column": "score",
           "finetune.num_epochs": 6},
    )  # fmt: skip
    assert _run(config, tmp_path, "ModernBertForSequenceClassification")["pearson"] > 0.7


@pytest.mark.e2e
def test_token_classification(tmp_path, vocab, modernbert_dir):  # noqa: F811
    rng = np.random.default_rng(2)
    conll_file(tmp_path / "train.txt", rng, 200)
    conll_file(tmp_path / "valid.txt", rng, 48)
    config = finetune_config("conll2003", tmp_path, vocab, init_from=str(modernbert_dir))
    assert _run(config, tmp_path, "ModernBertForTokenClassification")["entity_f1"] > 0.8


@pytest.mark.e2e
def test_question_answering(tmp_path, vocab, modernbert_dir):  # noqa: F811
    rng = np.random.default_rng(3)
    squad_file(tmp_path / "train-v1.1.json", rng, 240)
    squad_file(tmp_path / "dev-v1.1.json", rng, 48)
    config = finetune_config(
        "squad1", tmp_path, vocab, init_from=str(modernbert_dir),
        **{"finetune.doc_stride": 16, "finetune.max_query_length": 8},
    )  # fmt: skip
    mean = _run(config, tmp_path, "ModernBertForQuestionAnswering")
    assert mean["exact"] > 50 and mean["f1"] > 50, mean


@pytest.mark.e2e
def test_multiple_choice(tmp_path, vocab, modernbert_dir):  # noqa: F811
    swag_files(tmp_path, np.random.default_rng(4))
    config = finetune_config(
        "swag", tmp_path, vocab, init_from=str(modernbert_dir), **{"finetune.num_epochs": 5}
    )
    assert _run(config, tmp_path, "ModernBertForMultipleChoice")["accuracy"] > 0.6
