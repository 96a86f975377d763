"""What every tokenizer kind shares: encoding, the special tokens' layout, identity and files.

`SubwordTokenizer` wraps a `tokenizers.Tokenizer` (the Rust library) and knows its family's
special tokens by role: `cls_id` starts a row, `sep_id` ends a segment, `pad_id`, `mask_id` and
`unk_id`. Rows are laid out as transformers' fast tokenizers do (`build_inputs`):

    BERT (WordPiece)               [CLS] A [SEP]    [CLS] A [SEP] B [SEP]       types 0.. 1..
    RoBERTa, XLM-R (BPE, Unigram)  <s> A </s>       <s> A </s></s> B </s>       types all 0

The subclasses (`wordpiece`, `bpe`, `unigram`) say how their files are read and written;
`DecoderBPETokenizer` is what the decoder families' BPE vocabularies (`llama3`, `gemma`) share.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Container, Sequence
from typing import Any

import numpy as np
from absl import logging
from etils import epath
from tokenizers import AddedToken, Tokenizer, normalizers, processors

from bert_jax.paths import write_text_whole

# fairseq's dictionary's special tokens (bos, pad, eos, unk, mask), RoBERTa's and XLM-R's (MPNet's
# but for its unknown token): the first four lead the vocabulary in this order, <mask> comes last.
FAIRSEQ_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
BOS, PAD, EOS, UNK, MASK = FAIRSEQ_SPECIAL_TOKENS

# A tokenizer_config.json's mask token that takes the space before it (RoBERTa's and XLM-R's
# `<mask>`), in transformers' serialized form.
MASK_TOKEN_CONFIG = {
    "__type": "AddedToken",
    "content": MASK,
    "lstrip": True,
    "rstrip": False,
    "normalized": False,
    "single_word": False,
    "special": True,
}


def add_special_tokens(
    tokenizer: Tokenizer, tokens: Sequence[str], lstrip: Container[str] = ()
) -> None:
    """Registers `tokens` on `tokenizer`, in this order, as special tokens matched whole in the
    raw text (not normalized); those in `lstrip` take the space before them (a mask token)."""
    tokenizer.add_special_tokens(
        [AddedToken(t, lstrip=t in lstrip, special=True, normalized=False) for t in tokens]
    )


def add_roberta_special_tokens(
    tokenizer: Tokenizer, leading: Sequence[str], mask: str = MASK
) -> dict[str, int]:
    """Registers fairseq's special tokens on `tokenizer` as RoBERTa's and MPNet's tokenizers do:
    those of `leading` the vocabulary holds, and `mask` taking the space before it. Returns the
    vocabulary with them (token -> id)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    add_special_tokens(tokenizer, [*(t for t in leading if t in vocab), mask], lstrip={mask})
    return tokenizer.get_vocab(with_added_tokens=True)


def roberta_processing(
    vocab: dict[str, int], add_prefix_space: bool = False, bos: str = BOS, eos: str = EOS
) -> processors.RobertaProcessing:
    """RoBERTa's rows (`<s> A </s>`, `<s> A </s></s> B </s>`) as `RobertaProcessing`, given the
    vocabulary (token -> id) holding `bos` and `eos`; offsets trimmed, `add_prefix_space` as the
    byte-level step's."""
    return processors.RobertaProcessing(
        (eos, vocab[eos]), (bos, vocab[bos]), trim_offsets=True, add_prefix_space=add_prefix_space
    )


def rows_template(
    cls: tuple[str, int],
    sep: tuple[str, int],
    separators_between_pairs: int = 1,
    pair_token_types: bool = True,
) -> processors.TemplateProcessing:
    """The `TemplateProcessing` that lays rows out as `SubwordTokenizer.build_inputs` does.

    Args:
      cls, sep: (token, id) of the token that starts a row and of the one that ends a segment.
      separators_between_pairs: `sep` tokens between a pair's segments (1 BERT's, 2 RoBERTa's).
      pair_token_types: whether the second segment has token type 1 (else 0).

    Returns:
      The template: `cls A sep` and, for a pair, `cls A sep B sep` (with two separators,
      `cls A sep sep B sep`).
    """
    (cls_token, _), (sep_token, _) = cls, sep
    second = int(pair_token_types)
    separators = " ".join([f"{sep_token}:0"] * separators_between_pairs)
    return processors.TemplateProcessing(
        single=f"{cls_token}:0 $A:0 {sep_token}:0",
        pair=f"{cls_token}:0 $A:0 {separators} $B:{second} {sep_token}:{second}",
        special_tokens=[cls, sep],
    )


# The roles of `SubwordTokenizer.special_tokens`, in its order.
SPECIAL_TOKEN_ROLES = ("pad", "unk", "cls", "sep", "mask")


def special_token_role(role: str) -> property:
    """A read-only property giving the special token of `role` (one of `SPECIAL_TOKEN_ROLES`)
    from its owner's `special_tokens` (pad, unk, cls, sep, mask)."""
    index = SPECIAL_TOKEN_ROLES.index(role)
    return property(
        lambda self: self.special_tokens[index], doc=f"The {role} token (`special_tokens`)."
    )


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
    # What starts a token that begins a word ("Ġ", "▁"; `continuation_mask`), or "" where the
    # kind marks continuations instead (WordPiece's "##").
    word_start = ""
    # Whether the mask token takes the space before it (RoBERTa's `<mask>`): tokenizer_config.json
    # then writes it as an AddedToken (`MASK_TOKEN_CONFIG`).
    mask_lstrip = False

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
        self._words: Tokenizer | None = None

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

    def _copy_for_words(self, **components: Any) -> Tokenizer:
        """A copy of the tokenizer with `components` (`normalizer=...`, `pre_tokenizer=...`) set
        in it, made on the first call and kept: the `_word_tokenizer` of a kind whose words,
        given alone (NER's), need a space put before them to tokenize as in running text."""
        if self._words is None:
            self._words = Tokenizer.from_str(self.tokenizer.to_str())
            for name, component in components.items():
                setattr(self._words, name, component)
        return self._words

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
    @classmethod
    def template_processing(cls, tokenizer: Tokenizer) -> processors.TemplateProcessing:
        """The `TemplateProcessing` that lays rows out as `build_inputs` does, given the
        `tokenizers.Tokenizer` (holding the class's cls and sep tokens) whose ids it writes."""
        _, _, cls_token, sep_token, _ = cls.special_tokens
        return rows_template(
            (cls_token, tokenizer.token_to_id(cls_token)),
            (sep_token, tokenizer.token_to_id(sep_token)),
            cls.separators_between_pairs,
            cls.pair_token_types,
        )

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
        token before it): here, where it does not start with `word_start` (a space, as the kind
        writes it; byte tokens too); False for special tokens."""
        if not self.word_start:
            raise NotImplementedError
        specials = set(self.special_tokens)
        return np.array(
            [not t.startswith(self.word_start) and t not in specials for t in self.vocab],
            dtype=bool,
        )

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
        most tokens a row may hold; transformers' `AutoTokenizer` truncates to it); a mask token
        that takes the space before it (`mask_lstrip`) as an AddedToken."""
        pad, unk, cls, sep, mask = self.special_tokens
        config = {
            "tokenizer_class": self.tokenizer_class,
            **self._config_fields(),
            "cls_token": cls,
            "sep_token": sep,
            "unk_token": unk,
            "pad_token": pad,
            "mask_token": {**MASK_TOKEN_CONFIG, "content": mask} if self.mask_lstrip else mask,
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


class DecoderBPETokenizer(SubwordTokenizer):
    """A decoder family's BPE vocabulary (Llama-3's, Gemma's) in ModernBERT's rows: its begin-
    and end-of-text tokens in the cls and sep roles, `cls A sep` and `cls A sep B sep`, token
    types all 0. Its files are tokenizer.json as it is, read by transformers'
    `PreTrainedTokenizerFast`; words given alone (NER's) get a space put before them."""

    kind = "bpe"
    tokenizer_class = "PreTrainedTokenizerFast"
    separators_between_pairs = 1
    pair_token_types = False

    def _word_normalizer(self) -> normalizers.Normalizer:
        """The normalizer of `_word_tokenizer`'s copy: a space put before the word."""
        return normalizers.Prepend(" ")

    def _word_tokenizer(self) -> Tokenizer:
        """A copy that puts a space before each word given alone (NER's words), so that it
        tokenizes as it would after a space in running text."""
        return self._copy_for_words(normalizer=self._word_normalizer())

    def tokenizer_config(self, model_max_length: int | None = None) -> dict:
        """`SubwordTokenizer.tokenizer_config` for `PreTrainedTokenizerFast`: the special tokens
        by role, then the cls and sep tokens again as bos_token and eos_token."""
        _, _, cls, sep, _ = self.special_tokens
        config = super().tokenizer_config(model_max_length)
        return {**config, "bos_token": cls, "eos_token": sep}


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
