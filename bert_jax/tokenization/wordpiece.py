"""BERT WordPiece tokenization on Hugging Face `tokenizers` (the Rust library).

`tokenization.load_tokenizer(path)` reads a BERT `vocab.txt` or a `tokenizer.json` and returns a
`WordPieceTokenizer`, a thin wrapper that knows BERT's special tokens:

    tok = load_tokenizer("uncased_L-12_H-768_A-12/vocab.txt")   # lowercase inferred: True
    tok.encode("Hello, world!")        # -> [7592, 1010, 2088, 999]  (no [CLS]/[SEP] added)
    tok.cls_id, tok.sep_id, tok.mask_id, tok.pad_id, tok.unk_id, tok.vocab_size

The pipeline is the original's, as `transformers.BertTokenizerFast` builds it: `BertNormalizer`
(drop control characters and U+FFFD, whitespace to spaces, put spaces around CJK ideographs so
each is one token, optionally lower-case and strip accents), `BertPreTokenizer` (split on
whitespace and punctuation) and greedy longest-match-first WordPiece with "##" continuation pieces
and `[UNK]` for unknown words or words longer than `max_input_chars_per_word`. Token ids equal
`BertTokenizerFast`'s for the same vocab; the literal strings "[CLS]", "[MASK]", ... in text map to
their special ids, as there.

`load_tokenizer(path, match_original=True)` matches google-research/bert's `FullTokenizer` instead
where that differs from `BertTokenizerFast` and `tokenizers` components can match it (docs/data.md,
"Differences from google-research/bert's `FullTokenizer`").

`train_wordpiece(texts, vocab_size)` learns a new vocabulary (the `bert-jax-train-wordpiece`
command wraps it).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence

import numpy as np
from absl import logging
from etils import epath
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import trainers as tokenizer_trainers

from bert_jax.tokenization.base import (
    MissingSpecialTokenError,
    SubwordTokenizer,
    read_tokenizer_json,
    require_model,
)

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
# In the order `train_wordpiece` numbers them (HF's): [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4.
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
CONTINUATION_PREFIX = "##"
# transformers.BertTokenizerFast's value; google-research/bert's tokenization.py uses 200.
MAX_INPUT_CHARS_PER_WORD = 100
ORIGINAL_MAX_INPUT_CHARS_PER_WORD = 200

# google-research/bert's `_clean_text` drops NUL, U+FFFD and categories Cc and Cf except tab,
# newline and carriage return; BertNormalizer's clean_text drops every category C*, private use
# (Co) too.
_ORIGINAL_DROPPED = r"(?![\t\n\r])[\x00\x{FFFD}\p{Cc}\p{Cf}]"
# Python's str.lower() (which the original calls) writes a capital sigma that ends a word as the
# final form; BertNormalizer lower-cases character by character, always to "σ". The rule
# (Unicode's Final_Sigma): a cased letter, then case-ignorable characters, before; no
# case-ignorable characters then a cased letter after.
_FINAL_SIGMA = r"(?<=\p{Cased}\p{Case_Ignorable}*)\x{03A3}(?!\p{Case_Ignorable}*\p{Cased})"
# The original's CJK block list has U+2B820-U+2CEAF; BertNormalizer's starts at U+2B920.
_CJK_MISSING_FROM_BERT_NORMALIZER = r"[\x{2B820}-\x{2B91F}]"


class WordPieceTokenizer(SubwordTokenizer):
    """A `tokenizers.Tokenizer` with a WordPiece model and BERT's special tokens.

    Attributes (besides `base.SubwordTokenizer`'s):
      lowercase: whether the normalizer lower-cases (None if it is not a `BertNormalizer`).
    """

    kind = "wordpiece"
    tokenizer_class = "BertTokenizer"
    special_tokens = SPECIAL_TOKENS

    def __init__(self, tokenizer: Tokenizer, source: str = "<tokenizer>"):
        """Wraps `tokenizer`, checking that it is WordPiece and has every special token.

        Raises:
          ValueError: the model is not WordPiece, or the ids are not contiguous.
          MissingSpecialTokenError: a special token is missing; the message names each.
        """
        require_model(tokenizer, source, models.WordPiece, "BERT")
        super().__init__(tokenizer, source)
        self.lowercase = _bert_normalizer_state(tokenizer).get("lowercase")

    def continuation_mask(self) -> np.ndarray:
        """bool [V]: True where the token is a "##" continuation piece (for whole-word masking)."""
        return np.array([t.startswith(CONTINUATION_PREFIX) for t in self.vocab], dtype=bool)

    def fingerprint(self) -> str:
        """A short hash of everything that decides the token ids (vocab, normalizer, splitting)."""
        parts = {
            "vocab": self.vocab,
            "normalizer": _state(self.tokenizer.normalizer),
            "pre_tokenizer": _state(self.tokenizer.pre_tokenizer),
            "unk": self.tokenizer.model.unk_token,
            "max_input_chars_per_word": self.tokenizer.model.max_input_chars_per_word,
            "prefix": self.tokenizer.model.continuing_subword_prefix,
        }
        blob = json.dumps(parts, sort_keys=True, ensure_ascii=False).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()[:16]

    def _config_fields(self) -> dict:
        """`BertTokenizer`'s own field: whether it lower-cases (and strips accents) the text."""
        return {"do_lower_case": bool(self.lowercase)}

    def files(self, model_max_length: int | None = None) -> dict[str, str]:
        """`tokenizer.json` (for `transformers.PreTrainedTokenizerFast`), a
        `tokenizer_config.json` naming `BertTokenizer` and `vocab.txt` (google-research/bert's)."""
        return {
            **super().files(model_max_length),
            "vocab.txt": "".join(t + "\n" for t in self.vocab),
        }

    def __repr__(self) -> str:
        return (
            f"WordPieceTokenizer({self.source!r}, vocab_size={self.vocab_size}, "
            f"lowercase={self.lowercase})"
        )


def bert_normalizer(
    lowercase: bool | None, strip_accents: bool | None
) -> normalizers.BertNormalizer:
    """BERT's normalizer: control characters dropped, whitespace made spaces, spaces put around
    CJK ideographs, the text lower-cased if `lowercase` and its accents stripped if
    `strip_accents` (None: as `lowercase`)."""
    return normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=True,
        strip_accents=strip_accents,
        lowercase=lowercase,
    )


def wordpiece_model(
    vocab: dict[str, int],
    max_input_chars_per_word: int | None = None,
    unk_token: str = UNK,
    prefix: str = CONTINUATION_PREFIX,
) -> models.WordPiece:
    """BERT's greedy longest-match-first WordPiece over `vocab` (token -> id): words it cannot
    spell, or longer than `max_input_chars_per_word` (None: `MAX_INPUT_CHARS_PER_WORD`), become
    `unk_token`; `prefix` starts the pieces that continue a word. Returns the model."""
    if max_input_chars_per_word is None:
        max_input_chars_per_word = MAX_INPUT_CHARS_PER_WORD
    return models.WordPiece(
        vocab,
        unk_token=unk_token,
        max_input_chars_per_word=max_input_chars_per_word,
        continuing_subword_prefix=prefix,
    )


def _state(component) -> object:
    return json.loads(component.__getstate__()) if component is not None else None


def _bert_normalizer_state(tokenizer: Tokenizer) -> dict:
    """The settings of the tokenizer's BertNormalizer (alone or in a Sequence), or {}."""
    state = _state(tokenizer.normalizer) or {}
    for part in [state, *state.get("normalizers", [])]:
        if part.get("type") == "BertNormalizer":
            return part
    return {}


def _matches_original(tokenizer: Tokenizer) -> bool:
    """Whether the pipeline is `match_original`'s (its pre-tokenizer isolates the CJK block)."""
    state = _state(tokenizer.pre_tokenizer) or {}
    patterns = [p.get("pattern") for p in state.get("pretokenizers", [])]
    return {"Regex": _CJK_MISSING_FROM_BERT_NORMALIZER} in patterns


# ---- Building and loading ----


def _bert_pipeline(
    tokenizer: Tokenizer,
    lowercase: bool | None,
    strip_accents: bool | None,
    match_original: bool = False,
) -> Tokenizer:
    """Sets BERT's normalizer, pre-tokenizer, decoder and [CLS]/[SEP] template on `tokenizer`.

    With `match_original`, the normalizer first cleans the text as google-research/bert does (and
    marks final sigmas when lower-casing), the pre-tokenizer isolates the CJK characters that
    BertNormalizer misses, and the special tokens are not matched in the text.
    """
    if lowercase is not None and match_original:
        tokenizer.normalizer = normalizers.Sequence(
            [normalizers.Replace(Regex(_ORIGINAL_DROPPED), "")]
            + ([normalizers.Replace(Regex(_FINAL_SIGMA), "\u03c2")] if lowercase else [])
            + [
                normalizers.BertNormalizer(
                    clean_text=False,
                    handle_chinese_chars=True,
                    strip_accents=strip_accents,
                    lowercase=lowercase,
                )
            ]
        )
    elif lowercase is not None:
        tokenizer.normalizer = bert_normalizer(lowercase, strip_accents)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if match_original:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_CJK_MISSING_FROM_BERT_NORMALIZER), "isolated"),
                pre_tokenizers.BertPreTokenizer(),
            ]
        )
    tokenizer.decoder = decoders.WordPiece(prefix=CONTINUATION_PREFIX)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    present = [t for t in SPECIAL_TOKENS if t in vocab]
    if not match_original:  # Added tokens are matched in the raw text; the original splits them.
        tokenizer.add_special_tokens(present)
    if CLS in vocab and SEP in vocab:
        tokenizer.post_processor = WordPieceTokenizer.template_processing(tokenizer)
    return tokenizer


def read_vocab_txt(path: str | os.PathLike) -> dict[str, int]:
    """token -> id from a vocab.txt (one token a line), rejecting duplicate or blank lines.

    Raises:
      ValueError: the file is not UTF-8, is empty, or has a blank or repeated line.
    """
    path = os.fspath(path)
    raw = epath.Path(path).read_bytes()  # a local file or a URL (gs://...)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}); is it a vocab.txt?") from e
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    vocab: dict[str, int] = {}
    for i, line in enumerate(lines):
        token = line.rstrip("\r")
        if not token.strip():
            raise ValueError(f"{path}: line {i + 1} is blank; a vocab.txt has one token a line")
        if token in vocab:
            raise ValueError(
                f"{path}: token {token!r} appears on lines {vocab[token] + 1} and {i + 1}"
            )
        vocab[token] = i
    if not vocab:
        raise ValueError(f"{path} is empty")
    return vocab


def _infer_lowercase(vocab: Iterable[str]) -> bool:
    """An uncased vocab has no upper-case letters outside bracketed special tokens."""
    for token in vocab:
        if token.startswith("[") and token.endswith("]"):
            continue
        if token != token.lower():
            return False
    return True


def load_wordpiece(
    file: epath.Path,
    lowercase: bool | None = None,
    *,
    strip_accents: bool | None = None,
    max_input_chars_per_word: int | None = None,
    match_original: bool = False,
) -> WordPieceTokenizer:
    """A BERT WordPiece tokenizer from a `vocab.txt` or a WordPiece `tokenizer.json`
    (`tokenization.load_tokenizer` documents the arguments)."""
    path = os.fspath(file)
    if path.endswith(".json"):
        tokenizer = _from_tokenizer_json(file, lowercase, strip_accents, match_original)
    else:
        tokenizer = _from_vocab_txt(
            path, lowercase, strip_accents, max_input_chars_per_word, match_original
        )
    if match_original and max_input_chars_per_word is None:
        max_input_chars_per_word = ORIGINAL_MAX_INPUT_CHARS_PER_WORD
    if max_input_chars_per_word is not None:
        tokenizer.model.max_input_chars_per_word = max_input_chars_per_word
    return WordPieceTokenizer(tokenizer, source=path)


def _from_tokenizer_json(
    file: epath.Path,
    lowercase: bool | None,
    strip_accents: bool | None,
    match_original: bool,
) -> Tokenizer:
    """The WordPiece `Tokenizer` of a tokenizer.json, with `load_tokenizer`'s overrides."""
    path = os.fspath(file)
    tokenizer = read_tokenizer_json(file)
    require_model(tokenizer, path, models.WordPiece, "BERT")
    overrides = lowercase is not None or strip_accents is not None
    if (match_original or overrides) and (match_original or _matches_original(tokenizer)):
        # Rebuilt from its vocabulary, so that the special tokens are no added tokens.
        current = _bert_normalizer_state(tokenizer)
        if not overrides:
            strip_accents = current.get("strip_accents")
        if lowercase is None:
            lowercase = bool(current.get("lowercase", False))
        model = wordpiece_model(
            tokenizer.get_vocab(with_added_tokens=True),
            tokenizer.model.max_input_chars_per_word,
            tokenizer.model.unk_token,
            tokenizer.model.continuing_subword_prefix,
        )
        tokenizer = _bert_pipeline(Tokenizer(model), lowercase, strip_accents, True)
    elif overrides:
        if lowercase is None:
            current = _state(tokenizer.normalizer) or {}
            lowercase = bool(current.get("lowercase", False))
        tokenizer.normalizer = bert_normalizer(lowercase, strip_accents)
    return tokenizer


def _from_vocab_txt(
    path: str,
    lowercase: bool | None,
    strip_accents: bool | None,
    max_input_chars_per_word: int | None,
    match_original: bool,
) -> Tokenizer:
    """A BERT WordPiece `Tokenizer` over a vocab.txt, lowercase inferred when None."""
    vocab = read_vocab_txt(path)
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise MissingSpecialTokenError(
            f"{path} lacks the special token(s) {', '.join(missing)}; a BERT vocabulary "
            f"needs all of {', '.join(SPECIAL_TOKENS)}"
        )
    if lowercase is None:
        lowercase = _infer_lowercase(vocab)
        logging.info("%s: inferred lowercase=%s from the vocabulary", path, lowercase)
    model = wordpiece_model(vocab, max_input_chars_per_word)
    return _bert_pipeline(Tokenizer(model), lowercase, strip_accents, match_original)


def learn_pieces(
    texts: Iterable[str],
    vocab_size: int,
    special_tokens: Sequence[str],
    *,
    lowercase: bool,
    strip_accents: bool | None,
    min_frequency: int,
    limit_alphabet: int,
    show_progress: bool,
) -> list[str]:
    """Learns WordPiece pieces over BERT's normalizer and splitting with
    `tokenizers.trainers.WordPieceTrainer` (`train_wordpiece` documents the arguments;
    `special_tokens` count towards `vocab_size`).

    Returns:
      The learned tokens ("##" continuation pieces among them), the special tokens left out,
      sorted.
    """
    tokenizer = Tokenizer(
        models.WordPiece(unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)
    )
    tokenizer.normalizer = bert_normalizer(lowercase, strip_accents)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = tokenizer_trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix=CONTINUATION_PREFIX,
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(texts, trainer)
    learned = tokenizer.get_vocab(with_added_tokens=True)
    return sorted(t for t in learned if t not in special_tokens)


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int = 8192,
    *,
    lowercase: bool = True,
    strip_accents: bool | None = None,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    show_progress: bool = False,
) -> WordPieceTokenizer:
    """Learns a WordPiece vocabulary with `tokenizers.trainers.WordPieceTrainer`.

    The special tokens get ids 0-4 ([PAD], [UNK], [CLS], [SEP], [MASK]) and the other tokens are
    numbered in sorted order, so the ids depend only on the set of pieces learned. That set is not
    quite deterministic: the trainer breaks ties between equally frequent merges in hash order, so
    two trainings can differ in a few rare pieces. Save the result and reuse it (the default
    corpus's vocabulary ships with the package for this reason:
    `pretrain.data.default_corpus.DEFAULT_CORPUS_VOCAB`).

    Args:
      texts: the training text, any number of strings (lines or documents).
      vocab_size: the size of the vocabulary, special tokens included.
      lowercase: learn an uncased vocabulary (and lower-case when encoding).
      strip_accents: None follows `lowercase`.
      min_frequency: pieces seen fewer times are not added.
      limit_alphabet: at most this many distinct characters.
      show_progress: the trainer's progress bar.

    Returns:
      The trained tokenizer.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size={vocab_size} leaves no room beyond the special tokens")
    rest = learn_pieces(
        texts,
        vocab_size,
        SPECIAL_TOKENS,
        lowercase=lowercase,
        strip_accents=strip_accents,
        min_frequency=min_frequency,
        limit_alphabet=limit_alphabet,
        show_progress=show_progress,
    )
    vocab = {t: i for i, t in enumerate(list(SPECIAL_TOKENS) + rest)}
    canonical = _bert_pipeline(Tokenizer(wordpiece_model(vocab)), lowercase, strip_accents)
    return WordPieceTokenizer(canonical, source=f"<trained WordPiece, {len(vocab)} tokens>")
