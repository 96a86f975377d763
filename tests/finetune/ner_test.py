"""CoNLL NER: reading, first-sub-token labels, long sentences, decoding back to word tags."""

import numpy as np
import pytest

from bert_jax.data import batching
from bert_jax.finetune import metrics, ner
from tests.finetune.conftest import TESTDATA

CONLL_FILE = TESTDATA / "conll_tiny.txt"


def test_read_conll():
    sentences = ner.read_conll(CONLL_FILE)
    assert len(sentences) == 4
    assert sentences[0].words[:4] == ("Schwarzenegger", "visited", "the", "Bundesliga")
    assert sentences[0].tags[:4] == ("I-PER", "O", "O", "I-MISC")
    assert sentences[1].words[0] == "U.S."
    assert sentences[1].tags == ("I-LOC", "O", "O", "I-ORG", "I-ORG", "O", "B-ORG", "I-ORG", "O")
    assert sentences[2] == ner.NerExample(
        ("Peter", "Blackburn"), ("I-PER", "I-PER"), f"{CONLL_FILE}:24"
    )
    assert sentences[3].words == ("BRUSSELS", "1996-08-22")  # Two blank lines are one break.
    assert sentences[0].where == f"{CONLL_FILE}:3"
    assert ner.collect_labels(sentences) == (
        "O",
        "I-LOC",
        "I-MISC",
        "B-ORG",
        "I-ORG",
        "I-PER",
    )
    # IOB1 entities as conlleval reads them.
    true = [list(s.tags) for s in sentences]
    assert metrics.get_entities(true[1]) == [("LOC", 0, 0), ("ORG", 3, 4), ("ORG", 6, 7)]


def test_bad_conll_input(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("EU NNP B-NP B-ORG\nrejects\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: 1 column\(s\) in 'rejects'"):
        ner.read_conll(path)
    path.write_text("-DOCSTART- -X- -X- O\n\n")
    with pytest.raises(ValueError, match="has no sentences"):
        ner.read_conll(path)
    path.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nGerman JJ B-NP B-MSC\n")
    sentences = ner.read_conll(path)
    with pytest.raises(ValueError, match=r"bad.txt:4 \(word 1, 'German'\): tag 'B-MSC' is not one"):
        ner.featurize(sentences, None, ner.CONLL2003_LABELS, 16)


def _first_subtoken_positions(tokenizer, words):
    positions, position = [], 1
    for word in words:
        positions.append(position)
        position += max(1, len(tokenizer.encode(word)))
    return positions


def test_labels_on_first_subtokens(tokenizer):
    sentences = ner.read_conll(CONLL_FILE)
    labels = ner.collect_labels(sentences)
    features, rows, stats = ner.featurize(sentences, tokenizer, labels, max_seq_length=32)
    assert {k: (v.shape, v.dtype) for k, v in features.items()} == {
        "input_ids": ((4, 32), np.int32),
        "token_type_ids": ((4, 32), np.int32),
        "attention_mask": ((4, 32), np.int32),
        "labels": ((4, 32), np.int32),
        "label_weights": ((4, 32), np.float32),
        "example_weights": ((4,), np.float32),
    }
    assert (stats.sentences, stats.rows, stats.split_sentences) == (4, 4, 0)
    # Words split into several pieces: only the first piece carries the label.
    assert len(tokenizer.encode("Schwarzenegger")) > 1 and len(tokenizer.encode("U.S.")) == 4
    for i, sentence in enumerate(sentences):
        positions = _first_subtoken_positions(tokenizer, sentence.words)
        np.testing.assert_array_equal(np.flatnonzero(features["label_weights"][i]), positions)
        np.testing.assert_array_equal(
            features["labels"][i, positions], [labels.index(t) for t in sentence.tags]
        )
        assert features["labels"][i][features["label_weights"][i] == 0].max() == 0
        ids = [tokenizer.cls_id]
        for word in sentence.words:
            ids += tokenizer.encode(word)
        ids.append(tokenizer.sep_id)
        np.testing.assert_array_equal(features["input_ids"][i, : len(ids)], ids)
        assert features["attention_mask"][i].sum() == len(ids)
    # Decoding the gold labels gives back the tags, and a perfect F1.
    decoded = ner.decode(features["labels"], features, rows, labels)
    assert decoded == [list(s.tags) for s in sentences]
    assert metrics.entity_f1([list(s.tags) for s in sentences], decoded) == 1.0


def test_long_sentences_split_or_truncate(tokenizer):
    words = tuple(f"Word{i}" for i in range(30))  # "word", "##N" pieces: 2-3 tokens a word.
    tags = tuple("B-PER" if i % 7 == 0 else "I-PER" if i % 7 == 1 else "O" for i in range(30))
    sentence = ner.NerExample(words, tags, "x:1")
    short = ner.NerExample(("Hi",), ("O",), "x:40")
    labels = ner.CONLL2003_LABELS
    features, rows, stats = ner.featurize([sentence, short], tokenizer, labels, max_seq_length=16)
    assert stats.split_sentences == 1 and stats.rows == len(rows.sentence_index) > 3
    assert rows.sentence_index.tolist() == [0] * (stats.rows - 1) + [1]
    assert rows.num_words[:-1].sum() == 30
    assert features["attention_mask"].sum(1).max() <= 16
    # Every word is labelled exactly once across the rows.
    decoded = ner.decode(features["labels"], features, rows, labels)
    assert decoded == [list(tags), ["O"]]

    features, rows, stats = ner.featurize(
        [sentence, short], tokenizer, labels, max_seq_length=16, long_sentences="truncate"
    )
    assert stats.truncated_sentences == 1 and stats.rows == 2
    kept = int(rows.num_words[0])
    assert stats.dropped_words == 30 - kept
    decoded = ner.decode(features["labels"], features, rows, labels)
    assert decoded[0] == list(tags[:kept]) + ["O"] * (30 - kept)

    # A word longer than a row keeps its first pieces (its label survives); counted.
    long_word = ner.NerExample(("Pneumonoultramicroscopicsilicovolcanoconiosis",), ("B-MISC",))
    features, rows, stats = ner.featurize([long_word], tokenizer, labels, max_seq_length=6)
    assert stats.truncated_words == 1 and features["label_weights"][0, 1] == 1.0
    assert ner.decode(features["labels"], features, rows, labels) == [["B-MISC"]]


def test_words_without_tokens_get_unk(tokenizer):
    sentence = ner.NerExample(("Zero", "\u200b", "width"), ("B-MISC", "I-MISC", "O"))
    features, rows, stats = ner.featurize([sentence], tokenizer, ner.CONLL2003_LABELS, 12)
    assert stats.empty_words == 1
    assert features["input_ids"][0, 2] == tokenizer.unk_id
    assert features["label_weights"][0].sum() == 3
    decoded = ner.decode(features["labels"], features, rows, ner.CONLL2003_LABELS)
    assert decoded == [["B-MISC", "I-MISC", "O"]]


def test_packed_and_batched_ner_predictions_decode(tokenizer):
    sentences = ner.read_conll(CONLL_FILE) * 3
    labels = ner.collect_labels(sentences)
    features, rows, _ = ner.featurize(sentences, tokenizer, labels, max_seq_length=32)
    packed, info = batching.pack(features, max_segments=4, max_seq_length=48)
    assert info.num_rows < len(sentences)
    # A "model" that predicts the gold label at each packed position, run over padded batches.
    outputs, indices = [], []
    for batch, idx in batching.batches(
        packed, 2, bucket_boundaries=(16, 32, 48), return_indices=True
    ):
        outputs.append(batch["labels"])
        indices.append(idx)
    per_row = batching.unbatch(outputs, indices, info.num_rows)
    predictions = batching.unpack_tokens(per_row, info, width=32)
    decoded = ner.decode(predictions, features, rows, labels)
    assert decoded == [list(s.tags) for s in sentences]
