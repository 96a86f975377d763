"""Token classification (named entities) in the CoNLL-2003 format.

Readers: `read_conll` (one word per line, the word first and the tag last; blank lines end
sentences, `-DOCSTART-` lines are skipped), `read_conll_tfds`, and `read_conll_hub` (the Hub's
Parquet of `conll2003`, which the task reads when `data_dir` holds no train.txt). Tags may be IOB1
or IOB2 (`metrics.entity_scores` reads both). Each word is tokenized on its own, its label on its
first sub-token; a sentence longer than `max_seq_length - 2` tokens is split at word boundaries
(`long_sentences="split"`) or cut ("truncate"), both counted (docs/finetune_data.md, "Named
entities"):

    input_ids        int32   [N, L]   [CLS] sub-tokens [SEP], 0 ([PAD]) past the end
    token_type_ids   int32   [N, L]   0
    attention_mask   int32   [N, L]
    labels           int32   [N, L]   tag id on each word's first sub-token, 0 elsewhere
    label_weights    float32 [N, L]   1.0 on each word's first sub-token, 0.0 elsewhere
    example_weights  float32 [N]      1.0 (`batching.batches` adds 0.0 fillers)

`NerRows` records which sentence and words each row holds, and `decode` turns per-token
predictions back into one tag per word per sentence for `metrics.entity_scores`.

Bad input raises with the file and line: a line with one column, a tag outside the label set.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from absl import logging
from etils import epath

from bert_jax import tokenization
from bert_jax.data import tables, text_io
from bert_jax.finetune import metrics
from bert_jax.finetune import task as task_lib

# tfds conll2003's `ner` ClassLabel order, and the Hub's `ner_tags`.
CONLL2003_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")


@dataclasses.dataclass(frozen=True)
class NerExample:
    """One sentence.

    Attributes:
      words: the words.
      tags: one tag per word.
      where: "path:line" of the sentence's first word (for error messages).
    """

    words: tuple[str, ...]
    tags: tuple[str, ...]
    where: str = ""


def read_conll(
    path: str | os.PathLike, *, word_column: int = 0, tag_column: int = -1
) -> list[NerExample]:
    """Reads a CoNLL-format file: one word a line, blank lines between sentences.

    Args:
      path: e.g. eng.train or train.txt.
      word_column: the column of the word.
      tag_column: the column of the tag (default the last).

    Returns:
      The sentences in file order.

    Raises:
      ValueError: an empty file, a line without the tag column; the message names the line.
    """
    path = os.fspath(path)
    sentences: list[NerExample] = []
    words: list[str] = []
    tags: list[str] = []
    first_line = 0
    needed = max(word_column, tag_column) + 1 if tag_column >= 0 else 2
    with text_io.open_text(path) as f:
        for line_number, line in enumerate(f, start=1):
            columns = line.split()
            if not columns or columns[0] == "-DOCSTART-":
                if words:
                    sentences.append(NerExample(tuple(words), tuple(tags), f"{path}:{first_line}"))
                words, tags = [], []
                continue
            if len(columns) < needed:
                raise ValueError(
                    f"{path}:{line_number}: {len(columns)} column(s) in {line.rstrip()!r}; "
                    f"expected a word and a tag (at least {needed} columns)"
                )
            if not words:
                first_line = line_number
            words.append(columns[word_column])
            tags.append(columns[tag_column])
    if words:
        sentences.append(NerExample(tuple(words), tuple(tags), f"{path}:{first_line}"))
    if not sentences:
        raise ValueError(f"{path} has no sentences (is it empty?)")
    return sentences


def read_conll_tfds(
    split: str,
    *,
    name: str = "conll2003",
    data_dir: str | os.PathLike | None = None,
    download: bool = False,
) -> list[NerExample]:
    """Reads tfds `conll2003` ("train", "dev" or "test") from a local `data_dir` (`tf` extra)."""
    builder = text_io.tfds_builder(name, data_dir, download)
    tag_names = builder.info.features["ner"].feature.names
    sentences = []
    for i, record in enumerate(text_io.tfds_records(builder, split)):
        words = tuple(text_io.as_str(w) for w in record["tokens"])
        tags = tuple(tag_names[int(t)] for t in record["ner"])
        sentences.append(NerExample(words, tags, f"tfds:{name}/{split}[{i}]"))
    if not sentences:
        raise ValueError(f"tfds:{name}/{split} has no sentences")
    return sentences


def read_conll_hub(files: Sequence[str]) -> list[NerExample]:
    """Reads the Hub's Parquet files of one CoNLL-2003 split (local or gs://), streamed.

    Raises:
      ValueError: a missing column, a null row, a tag id outside the label names, tokens and
        tags of different lengths; the message names the file and row.
    """
    sentences = []
    for path in files:
        text_io.note_read(path)
        names = tables.class_label_names(path).get("ner_tags") or list(CONLL2003_LABELS)
        for row, record in tables.iter_rows(path, ("tokens", "ner_tags")):
            where = f"{path}: row {row}"
            words, ids = record["tokens"], record["ner_tags"]
            if words is None or ids is None or len(words) != len(ids):
                raise ValueError(f"{where}: tokens {words!r:.60} and ner_tags {ids!r:.60} differ")
            bad = [i for i in ids if not 0 <= i < len(names)]
            if bad:
                raise ValueError(f"{where}: ner_tags {bad} outside the {len(names)} label names")
            if words:
                sentences.append(NerExample(tuple(words), tuple(names[i] for i in ids), where))
    if not sentences:
        raise ValueError(f"{', '.join(files)} has no sentences")
    return sentences


def collect_labels(examples: Sequence[NerExample]) -> tuple[str, ...]:
    """The tags used, "O" first, then sorted by type and B before I."""
    tags = {t for e in examples for t in e.tags}
    rest = sorted(tags - {"O"}, key=lambda t: (t[2:], t[:2]))
    return ("O", *rest) if "O" in tags else tuple(rest)


@dataclasses.dataclass
class NerRows:
    """Which words each feature row holds (host-side, for `decode`).

    Attributes:
      sentence_index: int32 [N], the sentence of each row.
      word_start: int32 [N], the index of the row's first word in its sentence.
      num_words: int32 [N], how many words the row holds.
      sentence_lengths: int32 [num sentences], the words of each sentence.
    """

    sentence_index: np.ndarray
    word_start: np.ndarray
    num_words: np.ndarray
    sentence_lengths: np.ndarray


@dataclasses.dataclass
class NerStats:
    """Counts of one featurization.

    Attributes:
      sentences: sentences featurized.
      rows: feature rows made.
      split_sentences: sentences longer than max_seq_length split into several rows.
      truncated_sentences: sentences cut (`long_sentences="truncate"`).
      dropped_words: words cut off by truncation (they are predicted "O" by `decode`).
      truncated_words: words with more sub-tokens than a row holds (later sub-tokens cut).
      empty_words: words the tokenizer turned into nothing (given [UNK]).
    """

    sentences: int = 0
    rows: int = 0
    split_sentences: int = 0
    truncated_sentences: int = 0
    dropped_words: int = 0
    truncated_words: int = 0
    empty_words: int = 0

    def log(self) -> None:
        """Logs the counts, with warnings for anything split, cut or replaced."""
        logging.info("NER: %d sentences in %d rows", self.sentences, self.rows)
        for name, value in dataclasses.asdict(self).items():
            if name not in ("sentences", "rows") and value:
                logging.warning("NER: %s = %d", name, value)

    def to_dict(self) -> dict:
        """The counts as a JSON-able dict."""
        return dataclasses.asdict(self)


def _word_pieces(
    tokenizer: tokenization.SubwordTokenizer,
    examples: Sequence[NerExample],
    stats: NerStats,
) -> list[list[list[int]]]:
    """Sub-token ids of each word of each sentence ([UNK] for words that give none)."""
    encodings = tokenizer.encode_words([e.words for e in examples])
    result = []
    for example, (ids, word_ids) in zip(examples, encodings):
        pieces: list[list[int]] = [[] for _ in example.words]
        for token_id, word in zip(ids, word_ids):
            pieces[word].append(token_id)
        for word_pieces in pieces:
            if not word_pieces:
                word_pieces.append(tokenizer.unk_id)
                stats.empty_words += 1
        result.append(pieces)
    return result


def featurize(
    examples: Sequence[NerExample],
    tokenizer: tokenization.SubwordTokenizer,
    label_names: Sequence[str],
    max_seq_length: int,
    *,
    long_sentences: str = "split",
) -> tuple[dict[str, np.ndarray], NerRows, NerStats]:
    """Token classification features (keys in the module docstring).

    Args:
      examples: the sentences.
      tokenizer: the WordPiece tokenizer.
      label_names: the tags in id order (e.g. `CONLL2003_LABELS` or `collect_labels(train)`).
      max_seq_length: L.
      long_sentences: "split" a sentence that does not fit into several rows at word boundaries,
        or "truncate" it.

    Returns:
      (features with leading axis N rows, where each row's words come from, counts).

    Raises:
      ValueError: a tag not in `label_names` (naming the file, line and word).
    """
    if long_sentences not in ("split", "truncate"):
        raise ValueError(f"long_sentences must be 'split' or 'truncate', not {long_sentences!r}")
    if max_seq_length < 3:
        raise ValueError("max_seq_length must be >= 3")
    label_id = {name: i for i, name in enumerate(label_names)}
    _check_tags(examples, label_id, label_names)
    stats = NerStats(sentences=len(examples))
    budget = max_seq_length - 2
    rows: list[_Row] = []
    for sentence, (example, pieces) in enumerate(
        zip(examples, _word_pieces(tokenizer, examples, stats))
    ):
        chunks = _chunk_words(pieces, budget, stats)
        if len(chunks) > 1:
            if long_sentences == "truncate":
                stats.truncated_sentences += 1
                stats.dropped_words += len(pieces) - chunks[0][1]
                chunks = chunks[:1]
            else:
                stats.split_sentences += 1
        tags = [label_id[tag] for tag in example.tags]
        rows += [_row(sentence, start, end, pieces, tags, budget) for start, end in chunks]
    stats.rows = len(rows)
    features = _pad_rows(rows, tokenizer, max_seq_length)
    num_words = np.array(
        [int(np.sum(features["label_weights"][i])) for i in range(len(rows))], dtype=np.int32
    )
    info = NerRows(
        sentence_index=np.array([r.sentence for r in rows], dtype=np.int32),
        word_start=np.array([r.word_start for r in rows], dtype=np.int32),
        num_words=num_words,
        sentence_lengths=np.array([len(e.words) for e in examples], dtype=np.int32),
    )
    return features, info, stats


def _check_tags(
    examples: Sequence[NerExample], label_id: dict[str, int], label_names: Sequence[str]
) -> None:
    """Raises ValueError naming the place of a word count mismatch or an unknown tag."""
    for example in examples:
        if len(example.words) != len(example.tags):
            raise ValueError(
                f"{example.where}: {len(example.words)} words, {len(example.tags)} tags"
            )
        for k, tag in enumerate(example.tags):
            if tag not in label_id:
                raise ValueError(
                    f"{example.where} (word {k + 1}, {example.words[k]!r}): tag {tag!r} is not "
                    f"one of the labels {list(label_names)}"
                )


class _Row(NamedTuple):
    """One feature row before padding: its words' sub-tokens, without [CLS] and [SEP]."""

    sentence: int
    word_start: int
    ids: list[int]
    labels: list[int]  # The word's tag id on its first sub-token, 0 on the others.
    weights: list[float]  # 1.0 on first sub-tokens, 0.0 on the others.


def _row(
    sentence: int, start: int, end: int, pieces: list[list[int]], tags: list[int], budget: int
) -> _Row:
    """The row of words [start, end) of a sentence, each cut to `budget` sub-tokens."""
    ids, labels, weights = [], [], []
    for word in range(start, end):
        word_ids = pieces[word][:budget]
        ids += word_ids
        labels += [tags[word]] + [0] * (len(word_ids) - 1)
        weights += [1.0] + [0.0] * (len(word_ids) - 1)
    return _Row(sentence, start, ids, labels, weights)


def _pad_rows(
    rows: Sequence[_Row], tokenizer: tokenization.SubwordTokenizer, max_seq_length: int
) -> dict[str, np.ndarray]:
    """The feature arrays [N, L] (example_weights [N]): [CLS] row [SEP], then padding."""
    n = len(rows)
    features = {
        "input_ids": np.full((n, max_seq_length), tokenizer.pad_id, dtype=np.int32),
        "token_type_ids": np.zeros((n, max_seq_length), dtype=np.int32),
        "attention_mask": np.zeros((n, max_seq_length), dtype=np.int32),
        "labels": np.zeros((n, max_seq_length), dtype=np.int32),
        "label_weights": np.zeros((n, max_seq_length), dtype=np.float32),
        "example_weights": np.ones(n, dtype=np.float32),
    }
    for i, row in enumerate(rows):
        length = len(row.ids) + 2
        features["input_ids"][i, :length] = [tokenizer.cls_id, *row.ids, tokenizer.sep_id]
        features["attention_mask"][i, :length] = 1
        features["labels"][i, 1 : length - 1] = row.labels
        features["label_weights"][i, 1 : length - 1] = row.weights
    return features


def _chunk_words(pieces: list[list[int]], budget: int, stats: NerStats) -> list[tuple[int, int]]:
    """[start, end) word ranges of consecutive words that fit in `budget` sub-tokens each."""
    chunks, start, used = [], 0, 0
    for word, word_pieces in enumerate(pieces):
        size = len(word_pieces)
        if size > budget:
            stats.truncated_words += 1
            size = budget
        if used + size > budget:
            chunks.append((start, word))
            start, used = word, 0
        used += size
    chunks.append((start, len(pieces)))
    return chunks


def decode(
    predictions: np.ndarray | Sequence[np.ndarray],
    features: dict[str, np.ndarray],
    rows: NerRows,
    label_names: Sequence[str],
) -> list[list[str]]:
    """Tags per word per sentence from per-token predicted tag ids.

    Args:
      predictions: int [N, L'] predicted tag ids per row (argmax of the logits; L' may be cut by
        dynamic padding as long as it covers every row's tokens).
      features: the features `featurize` returned (their `label_weights` mark first sub-tokens).
      rows: the `NerRows` `featurize` returned.
      label_names: the tags in id order.

    Returns:
      One list of tags per sentence, one tag per word ("O" for words cut by truncation).
    """
    if len(predictions) != len(rows.sentence_index):
        raise ValueError(
            f"{len(rows.sentence_index)} rows but {len(predictions)} predictions; drop the batch "
            "fillers (example_weights 0) first"
        )
    tags = [["O"] * int(n) for n in rows.sentence_lengths]
    for i, prediction in enumerate(predictions):
        positions = np.flatnonzero(features["label_weights"][i])
        prediction = np.asarray(prediction)
        if len(positions) and positions[-1] >= prediction.shape[0]:
            raise ValueError(f"row {i}: predictions cover {prediction.shape[0]} tokens")
        sentence, start = int(rows.sentence_index[i]), int(rows.word_start[i])
        for k, position in enumerate(positions):
            tags[sentence][start + k] = label_names[int(prediction[position])]
    return tags


# ---- The fine-tuning task ----

FILES = ("train.txt", "valid.txt", "test.txt")


def _load(ft, tokenizer):
    """TaskData of CoNLL-2003: the files in data_dir (else the Hub's Parquet layout there; or
    tensorflow-datasets)."""

    def read(which, split):
        if ft.source == "tfds":
            return read_conll_tfds(split, data_dir=ft.tfds_data_dir or None)
        return task_lib.read_split(
            ft, which, FILES, split, ("conll2003",), read_conll, read_conll_hub
        )

    train = read(0, "train")
    if train is None:
        raise ValueError(
            "conll2003 needs config.finetune.data_dir (train.txt, or the Hub's "
            "conll2003/train-*.parquet) or train_file"
        )
    train = task_lib.subsample(train, ft.max_train_examples, 0)
    labels = collect_labels(train)
    features, _, stats = featurize(train, tokenizer, labels, ft.max_seq_length)
    logging.info("NER train: %s", stats)
    evals = []
    for which, split in ((1, "validation"), (2, "test")):
        examples = read(which, split)
        if examples:
            examples = task_lib.subsample(examples, ft.max_eval_examples, 1)
            f, rows, _ = featurize(examples, tokenizer, labels, ft.max_seq_length)
            name = "dev" if which == 1 else "test"
            evals.append(task_lib.EvalSet(name, f, examples, True, rows))
    return task_lib.TaskData("token_classification", len(labels), tuple(labels), features, evals)


def _score(data, eval_set, outputs, ft, out_dir):
    """Entity-level F1 (conlleval), and `<split>_predictions.txt`: word, gold tag, predicted."""
    del ft
    tags = decode(
        np.argmax(outputs["logits"], -1), eval_set.features, eval_set.extra, data.label_names
    )
    gold = [list(e.tags) for e in eval_set.examples]
    if out_dir is not None:
        path = epath.Path(out_dir) / f"{eval_set.name}_predictions.txt"
        with path.open("w", encoding="utf-8") as f:
            for example, predicted in zip(eval_set.examples, tags):
                for word, g, p in zip(example.words, example.tags, predicted):
                    f.write(f"{word} {g} {p}\n")
                f.write("\n")
    return {"entity_f1": metrics.entity_f1(gold, tags)}


TASK = task_lib.FinetuneTask(
    "conll2003",
    _load,
    _score,
    files=FILES,
    packable=True,
    objective="token_classification",
    num_labels=len(CONLL2003_LABELS),
)
