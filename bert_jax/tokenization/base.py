"""What every tokenizer kind shares: encoding, the special tokens' layout, identity and files.

`SubwordTokenizer` wraps a `tokenizers.Tokenizer` (the Rust library) and knows its family's
special tokens by role: `cls_id` starts a row, `sep_id` ends a segment, `pad_id`, `mask_id` and
`unk_id`. Rows are laid out as transformers' fast tokenizers do (`build_inputs`):

    BERT (WordPiece)               [CLS] A [SEP]    [CLS] A [SEP] B [SEP]       types 0.. 1..
    RoBERTa, XLM-R (BPE, Unigram)  <s> A </s>       <s> A </s></s> B </s>       types all 0

The subclasses (`wordpiece`, `bpe`, `unigram`) say how their files are read and written.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

import numpy as np
from absl import logging
from etils import epath
from tokenizers import AddedToken, Tokenizer

from bert_jax.paths import write_text_whole

# A tokenizer_config.json's mask token that takes the space before it (RoBERTa's and XLM-R's
# `<mask>`), in transformers' serialized form.
MASK_TOKEN_CONFIG = {
    "__type": "AddedToken",
    "content": "<mask>",
    "lstrip": True,
    "rstrip": False,
    "normalized": False,
    "single_word": False,
    "special": True,
}


def add_roberta_special_tokens(
    tokenizer: Tokenizer, leading: Sequence[str], mask: str = "<mask>"
) -> dict[str, int]:
    """Registers fairseq's special tokens on `tokenizer` as RoBERTa's and MPNet's tokenizers do:
    those of `leading` the vocabulary holds, and `mask` taking the space before it. Returns the
    vocabulary with them (token -> id)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    present = [AddedToken(t, special=True, normalized=False) for t in leading if t in vocab]
    tokenizer.add_special_tokens(
        present + [AddedToken(mask, lstrip=True, special=True, normalized=False)]
    )
    return tokenizer.get_vocab(with_added_tokens=True)


class MissingSpecialTokenError(ValueError):
    """The vocabulary lacks one of its family's special tokens."""


def require_model(tokenizer: Tokenizer, source: str, model_class: type, needed_by: str) -> None:
    """Raises ValueError naming `source` unless `tokenizer.model` is a `model_class`."""
    if not isinstance(tokenizer.model, model_class):
        raise ValueError(
            f"{source}: the tokenizer model is {type(tokenizer.model).__name__}, but "
            f"{needed_by} needs a {model_class.__name__} model"
        )


class SubwordTokenizer:
    """A `tokenizers.Tokenizer` and its special tokens by role.

    Attributes:
      tokenizer: the wrapped `tokenizers.Tokenizer` (no padding, no truncation).
      kind: "wordpiece", "bpe" (byte-level, or with byte fallback: Gemma's) or "unigram"
        (SentencePiece).
      vocab_size: V, the number of token ids (ids are 0 .. V-1).
      pad_id, unk_id, cls_id, sep_id, mask_id: ids of the special tokens by role ([CLS] / <s>,
        [SEP] / </s>, ...).
      separators_between_pairs: 1 for BERT's `A [SEP] B`, 2 for RoBERTa's `A </s></s> B`.
      pair_token_types: whether the second segment has token type 1 (BERT) or 0 (RoBERTa).
      lowercase: whether the normalizer lower-cases (None where no BERT normalizer says).
    """

    kind = ""
    # The transformers class that reads `save`'s files (tokenizer_config.json's tokenizer_class).
    tokenizer_class = ""
    # (pad, unk, cls, sep, mask): the special tokens by role, in this order.
    special_tokens: tuple[str, str, str, str, str] = ("", "", "", "", "")
    separators_between_pairs = 1
    pair_token_types = True
    lowercase: bool | None = None

    def __init__(self, tokenizer: Tokenizer, source: str = "<tokenizer>"):
        """Wraps `tokenizer`, checking that it has every special token and contiguous ids.

        Raises:
          MissingSpecialTokenError: a special token is missing; the message names each.
          ValueError: the ids are not contiguous.
        """
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        missing = [t for t in self.special_tokens if t not in vocab]
        if missing:
            raise MissingSpecialTokenError(
                f"{source} lacks the special token(s) {', '.join(missing)}; a {self.kind} "
                f"vocabulary of this family needs all of {', '.join(self.special_tokens)}"
            )
        if sorted(vocab.values()) != list(range(len(vocab))):
            raise ValueError(f"{source}: token ids are not contiguous from 0 to {len(vocab) - 1}")
        # A tokenizer.json may carry padding/truncation settings (e.g. to 128); encode() must not.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.tokenizer = tokenizer
        self.source = source
        self.vocab_size = len(vocab)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            vocab[t] for t in self.special_tokens
        )

    def check_model_vocab_size(self, vocab_size: int) -> None:
        """Raises ValueError unless a model of `vocab_size` token ids reads this vocabulary."""
        if vocab_size != self.vocab_size:
            raise ValueError(
                f"the model's vocab_size={vocab_size} differs from the tokenizer's "
                f"{self.vocab_size} tokens; use the checkpoint's own vocabulary"
            )

    # ---- encoding ----
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without the row's special tokens.

        Args:
          text: any string (bytes are decoded as UTF-8 with replacement). Lone surrogates, control
            characters, emoji and empty strings are all accepted.

        Returns:
          A list of int token ids.
        """
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (in parallel in Rust), without the row's special tokens."""
        texts = [as_text(t) for t in texts]
        try:
            encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        except Exception as e:
            # Rust strings cannot hold lone surrogates; replace them and try once more.
            if not any(has_surrogate(t) for t in texts):
                raise
            logging.log_first_n(logging.WARNING, "replaced lone surrogates in text (%s)", 1, e)
            texts = [replace_surrogates(t) for t in texts]
            encodings = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return [e.ids for e in encodings]

    def tokenize(self, text: str) -> list[str]:
        """Token strings of `text` (WordPiece "##aff", byte-level "Ġworld", Unigram "▁world")."""
        text = as_text(text)
        if has_surrogate(text):
            text = replace_surrogates(text)
        return self.tokenizer.encode(text, add_special_tokens=False).tokens

    def encode_words(
        self, sentences: Sequence[Sequence[str]]
    ) -> list[tuple[list[int], list[int | None]]]:
        """Token ids of sentences given as words (NER's input), each word read as if it followed
        a space in running text, and for each token the index of its word.

        Returns:
          Per sentence, (token ids, word index of each token), without the row's special tokens.
        """
        encodings = self._word_tokenizer().encode_batch(
            [list(words) for words in sentences], is_pretokenized=True, add_special_tokens=False
        )
        return [(e.ids, e.word_ids) for e in encodings]

    def _word_tokenizer(self) -> Tokenizer:
        """The tokenizer that `encode_words` runs (this one, where words need nothing more)."""
        return self.tokenizer

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids, special tokens left out."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def id_to_token(self, token_id: int) -> str:
        """The string of one id."""
        return self.tokenizer.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        """The id of one token string, or None."""
        return self.tokenizer.token_to_id(token)

    @property
    def vocab(self) -> list[str]:
        """Token strings by id."""
        inverse = {i: t for t, i in self.tokenizer.get_vocab(with_added_tokens=True).items()}
        return [inverse[i] for i in range(self.vocab_size)]

    @property
    def mask_token(self) -> str:
        """The mask token's string ("[MASK]" for BERT, "<mask>" for RoBERTa and XLM-R): where it
        stands in a text, the text is masked there."""
        return self.special_tokens[4]

    # ---- rows ----
    def num_special_tokens(self, pair: bool = False) -> int:
        """Special tokens in a row of one segment (2) or a pair (3 for BERT, 4 for RoBERTa)."""
        return 2 + (self.separators_between_pairs if pair else 0)

    def build_inputs(
        self, ids_a: Sequence[int], ids_b: Sequence[int] | None = None
    ) -> tuple[list[int], list[int]]:
        """One row's token ids and token types, as transformers' tokenizer adds specials.

        Args:
          ids_a: the first segment's ids (already truncated).
          ids_b: the second segment's, or None.

        Returns:
          (input ids, token type ids), of equal length: `[CLS] A [SEP]` then, for a pair,
          `B [SEP]` after one separator (BERT, types 1) or two (RoBERTa, types 0).
        """
        row = [self.cls_id, *ids_a, self.sep_id]
        types = [0] * len(row)
        if ids_b is not None:
            second = [self.sep_id] * (self.separators_between_pairs - 1) + [*ids_b, self.sep_id]
            row += second
            types += [int(self.pair_token_types)] * len(second)
        return row, types

    def continuation_mask(self) -> np.ndarray:
        """bool [V]: True where the token continues a word (whole-word masking joins it to the
        token before it); False for special tokens."""
        raise NotImplementedError

    # ---- identity and files ----
    def fingerprint(self) -> str:
        """A short hash of everything that decides the token ids: the tokens by id, the
        normalizer, the splitting, the special tokens' matching and the model's other settings
        (merges, scores; unset and empty settings alike), however the files spelled them."""
        state = json.loads(self.tokenizer.to_str())
        model = {k: v for k, v in state["model"].items() if k != "vocab" and v not in (None, "")}
        if isinstance(state["model"].get("vocab"), list):  # Unigram: the scores
            model["scores"] = [score for _, score in state["model"]["vocab"]]
        added = sorted(
            (a["content"], a["lstrip"], a["rstrip"], a["single_word"], a["special"])
            for a in state.get("added_tokens", [])
        )
        parts = {
            "vocab": self.vocab,
            "added": added,
            "normalizer": state.get("normalizer"),
            "pre_tokenizer": state.get("pre_tokenizer"),
            "model": model,
        }
        blob = json.dumps(parts, sort_keys=True, ensure_ascii=False).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()[:16]

    def tokenizer_config(self, model_max_length: int | None = None) -> dict:
        """tokenizer_config.json: the transformers class that reads `tokenizer.json`
        (`tokenizer_class`), the special tokens by role and, given one, `model_max_length` (the
        most tokens a row may hold; transformers' `AutoTokenizer` truncates to it)."""
        pad, unk, cls, sep, mask = self.special_tokens
        config = {
            "tokenizer_class": self.tokenizer_class,
            **self._config_fields(),
            "cls_token": cls,
            "sep_token": sep,
            "unk_token": unk,
            "pad_token": pad,
            "mask_token": mask,
        }
        if model_max_length is not None:
            config["model_max_length"] = int(model_max_length)
        return config

    def _config_fields(self) -> dict:
        """The kind's own tokenizer_config.json fields (before the special tokens)."""
        return {}

    def files(self, model_max_length: int | None = None) -> dict[str, str]:
        """{file name: text} of what `save` writes: `tokenizer.json`, `tokenizer_config.json`
        (`tokenizer_config(model_max_length)`) and the kind's own vocabulary files."""
        return {
            "tokenizer.json": self.tokenizer.to_str(pretty=True),
            "tokenizer_config.json": json.dumps(
                self.tokenizer_config(model_max_length), indent=2, ensure_ascii=False
            ),
        }

    def save(self, directory: str | os.PathLike, model_max_length: int | None = None) -> None:
        """Writes `files(model_max_length)` into `directory` (through `etils.epath`: a `gs://`
        directory stays a URL), each whole under its name: a directory `transformers.AutoTokenizer`
        and `load_tokenizer` both read, its special tokens (padding too) named."""
        directory = epath.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in self.files(model_max_length).items():
            write_text_whole(directory / name, text)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source!r}, vocab_size={self.vocab_size})"


def as_text(text) -> str:
    """`text` as a str (bytes decoded as UTF-8 with replacement); TypeError for anything else."""
    if isinstance(text, (bytes, bytearray)):
        return bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    return text


def has_surrogate(text: str) -> bool:
    """Whether `text` holds a lone surrogate (which Rust strings cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def replace_surrogates(text: str) -> str:
    """Keeps surrogate pairs; turns lone surrogates into U+FFFD."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def read_tokenizer_json(file: epath.Path) -> Tokenizer:
    """The `tokenizers.Tokenizer` of a tokenizer.json; ValueError naming the file otherwise."""
    try:
        return Tokenizer.from_str(file.read_text(encoding="utf-8"))
    except Exception as e:
        raise ValueError(f"{os.fspath(file)} is not a Hugging Face tokenizer.json: {e}") from e
