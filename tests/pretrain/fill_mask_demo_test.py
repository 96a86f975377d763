"""The pretraining job's demonstration: held-out lines with a whole word masked, and a model's
top guesses there, for a model of every family."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax.inference import top_predictions
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.families import get_model_class
from bert_jax.models.modernbert.config import ModernBertConfig
from bert_jax.models.params import init_params
from bert_jax.pretrain.fill_mask_demo import FillMaskDemo, fill_mask_demo, masked_examples
from tests.pretrain.conftest import EXCERPT

LENGTH, PREDICTIONS = 48, 4


def _batch(tokenizer, lines):
    """A pretraining batch of `lines` (segment A only), 4 tokens of each masked the way the
    pretraining data masks them: [MASK] in input_ids, the originals in masked_lm_ids."""
    ids = np.full((len(lines), LENGTH), tokenizer.pad_id, np.int32)
    positions = np.zeros((len(lines), PREDICTIONS), np.int32)
    answers = np.zeros_like(positions)
    for i, line in enumerate(lines):
        row = [tokenizer.cls_id, *tokenizer.encode(line)[: LENGTH - 2], tokenizer.sep_id]
        ids[i, : len(row)] = row
        positions[i] = [1, 3, 5, 7]
        answers[i] = ids[i, positions[i]]
        ids[i, positions[i]] = tokenizer.mask_id
    return {
        "input_ids": ids,
        "token_type_ids": np.zeros_like(ids),
        "masked_lm_positions": positions,
        "masked_lm_ids": answers,
        "masked_lm_weights": np.ones(positions.shape, np.float32),
    }


@pytest.fixture
def lines():
    return [line for line in EXCERPT.read_text().splitlines() if len(line.split()) > 8][:6]


def test_masked_examples_undo_the_masks_and_mask_one_whole_word(tiny_tokenizer, lines):
    batch = _batch(tiny_tokenizer, lines)
    features, positions, texts, answers = masked_examples(batch, tiny_tokenizer, 3, 10)
    assert features["input_ids"].shape == (3, 12) and positions.shape == (3, 1)
    for i in range(3):
        row = features["input_ids"][i]
        assert row[0] == tiny_tokenizer.cls_id and (row == tiny_tokenizer.mask_id).sum() == 1
        assert row[positions[i, 0]] == tiny_tokenizer.mask_id
        assert texts[i].count("[MASK]") == 1 and answers[i].isalpha()
        # The word put back in its place gives the line's own words (the batch's masks undone).
        original = tiny_tokenizer.encode(lines[i])[:10]
        assert tiny_tokenizer.id_to_token(original[positions[i, 0] - 1]) == answers[i]
    assert features["attention_mask"].sum() == (features["input_ids"] != 0).sum()


CONFIGS = {  # the pretraining heads of each family
    "BertForPreTraining": BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64,
    ),
    "ModernBertForMaskedLM": ModernBertConfig(
        pad_token_id=0, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, local_attention=4,
    ),
}  # fmt: skip


@pytest.mark.parametrize("head", list(CONFIGS))
def test_demo_shows_each_step_guesses(tiny_tokenizer, lines, tmp_path, head):
    tiny_tokenizer.save(tmp_path)
    demo = fill_mask_demo(_batch(tiny_tokenizer, lines), str(tmp_path / "vocab.txt"), 2)
    assert isinstance(demo, FillMaskDemo) and len(demo.texts) == 2
    config = CONFIGS[head].replace(vocab_size=tiny_tokenizer.vocab_size)
    model = get_model_class(head)(config)
    for step in (0, 30):
        params = nn.meta.unbox(init_params(model, jax.random.PRNGKey(step)))
        demo.predict(model, params, f"step {step}")
    text = demo.format().splitlines()
    assert text[0] == "Held-out lines with a word masked, and the model's top guesses:"
    assert text[1] == f"  {demo.texts[0]}   (masked: {demo.answers[0]})"
    ids, probs = top_predictions(model, params, demo.features, demo.positions)
    guesses = ", ".join(
        f"{tiny_tokenizer.id_to_token(t)} {p:.2f}" for t, p in zip(ids[0, 0], probs[0, 0])
    )
    assert text[2].startswith("    step 0: ") and text[3] == f"    step 30: {guesses}"
    assert len(text) == 1 + 2 * 3


def test_demo_needs_a_tokenizer_file(tiny_tokenizer, lines, tmp_path):
    batch = _batch(tiny_tokenizer, lines)
    assert fill_mask_demo(batch, None) is None
    assert fill_mask_demo(batch, str(tmp_path / "missing.txt")) is None
