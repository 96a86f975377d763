"""Tokenized corpora: flat storage, dropped-and-counted empties, memory-mapped sharing."""

import numpy as np

from bert_jax.pretrain.data.corpus import TokenizedCorpus, tokenize_documents


def test_tokenize_documents_counts_and_offsets(tmp_path, bert_tokenizer):
    documents = [
        [
            "Hello world.",
            "\x00\x01",
            "Good night.",
        ],  # The control-only sentence tokenizes to nothing.
        [""],  # Left empty: dropped.
        ["One sentence only."],
    ]
    corpus, stats = tokenize_documents(documents, bert_tokenizer, batch_size=2)
    assert (stats.documents, stats.sentences, stats.empty_sentences, stats.empty_documents) == (
        2,
        3,
        2,
        1,
    )
    assert stats.one_sentence_documents == 1 and stats.tokens == corpus.tokens.size
    docs = corpus.documents()
    assert len(docs) == 2 and [len(d) for d in docs] == [2, 1]
    assert docs[0][1] == bert_tokenizer.encode("Good night.")
    assert docs[1][0] == bert_tokenizer.encode("One sentence only.")
    corpus.save(str(tmp_path))
    loaded = TokenizedCorpus.load(str(tmp_path))
    assert isinstance(loaded.tokens, np.memmap)
    assert [list(d) for d in loaded.documents()] == [list(d) for d in docs]
    _, again = tokenize_documents(documents, bert_tokenizer)
    _, other = tokenize_documents([["Hello world."]], bert_tokenizer)
    assert again.fingerprint == stats.fingerprint != other.fingerprint
