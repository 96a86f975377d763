"""Fine-tuning from a RoBERTa checkpoint: the task reads the byte-level BPE tokenizer beside the
weights (no `finetune.tokenizer`), lays out RoBERTa's rows (`<s> question </s></s> context </s>`,
token types 0 for its one-row type table) and learns (the same small files as run_test.py)."""

import json

import jax
import numpy as np
import pytest

from bert_jax import tokenization
from bert_jax.checkpoints import hf
from bert_jax.finetune import run as finetune_run
from bert_jax.models.families import get_model_class
from bert_jax.models.params import init_params
from bert_jax.models.roberta.config import RobertaConfig
from tests.finetune.run_test import NAMES, WORDS, finetune_config, squad_file


@pytest.fixture(scope="module")
def roberta_dir(tmp_path_factory):
    """A randomly initialized 1-layer RoBERTa with a byte-level BPE vocabulary of the test words,
    saved as transformers saves RobertaForMaskedLM, its tokenizer files beside it."""
    out = tmp_path_factory.mktemp("roberta")
    words = WORDS + NAMES + ["good", "bad", "what", "who", "is", "the", "answer", "."]
    tokenizer = tokenization.train_byte_level_bpe([" ".join(words)] * 3, min_frequency=1)
    cfg = RobertaConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=66,
        type_vocab_size=1, layer_norm_eps=1e-5,
    )  # fmt: skip
    head = "RobertaForMaskedLM"
    params = init_params(get_model_class(head)(cfg), jax.random.PRNGKey(0))
    hf.save_pytorch(cfg, jax.device_get(params), out, head, overwrite=True)
    tokenizer.save(out)
    return out


@pytest.mark.e2e
def test_question_answering_reads_the_checkpoints_bpe_tokenizer(tmp_path, roberta_dir):
    rng = np.random.default_rng(3)
    squad_file(tmp_path / "train-v1.1.json", rng, 240)
    squad_file(tmp_path / "dev-v1.1.json", rng, 48)
    config = finetune_config(
        "squad1", tmp_path, "", init_from=str(roberta_dir),
        **{"finetune.doc_stride": 16, "finetune.max_query_length": 8},
    )  # fmt: skip
    tokenizer = finetune_run.find_tokenizer(config)
    assert isinstance(tokenizer, tokenization.ByteLevelBPETokenizer)
    results = finetune_run.train_and_evaluate(config, str(tmp_path / "run"))
    assert results["mean"]["exact"] > 50 and results["mean"]["f1"] > 50, results["mean"]
    exported = tmp_path / "run" / "hf"
    config_json = json.loads((exported / "config.json").read_text())
    assert config_json["architectures"] == ["RobertaForQuestionAnswering"]
    # The export carries the tokenizer that transformers reads for RoBERTa.
    assert tokenization.load_tokenizer(exported).fingerprint() == tokenizer.fingerprint()
