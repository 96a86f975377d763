"""MPNet's tokenizer: BERT's WordPiece pipeline with fairseq's special tokens and RoBERTa's rows.

    tok = tokenization.load_tokenizer("all-mpnet-base-v2/")   # tokenizer.json or vocab.txt
    tok.cls_id, tok.sep_id, tok.pad_id, tok.unk_id, tok.mask_id   # <s> </s> <pad> [UNK] <mask>

The pipeline is `transformers.MPNetTokenizer`'s: `BertNormalizer` (lower-casing in the released
models), `BertPreTokenizer` and greedy WordPiece with "##" pieces and `[UNK]`, as BERT's
(`wordpiece`); the special tokens are fairseq's `<s>`, `<pad>`, `</s>` (with `[UNK]` the
unknown token and `<mask>` taking the space before it), and rows are RoBERTa's: `<s> A </s>` and
`<s> A </s></s> B </s>`, token types all 0 (`base`). A WordPiece vocabulary holding `<s>`,
`</s>`, `<pad>` and `<mask>` is MPNet's (`is_mpnet_vocab`; the released one also holds BERT's
[CLS] and [SEP], which it never uses).

`train_mpnet_wordpiece(texts, vocab_size)` learns a vocabulary laid out as the released one:
`<s>`=0, `<pad>`=1 (the position table's padding_idx), `</s>`=2, `[UNK]`=3, the learned pieces,
`<mask>` last.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from absl import logging
from etils import epath
from tokenizers import Tokenizer, decoders, pre_tokenizers

from bert_jax.tokenization.base import (
    BOS,
    EOS,
    MASK,
    PAD,
    add_roberta_special_tokens,
    read_tokenizer_json,
    roberta_processing,
)
from bert_jax.tokenization.wordpiece import (
    CONTINUATION_PREFIX,
    UNK,
    WordPieceTokenizer,
    bert_normalizer,
    learn_pieces,
    read_vocab_txt,
    wordpiece_model,
)

# fairseq's special tokens (`base`) but for the unknown token, BERT's [UNK] (`wordpiece`). The
# released ids of the first four (<s> <pad> </s> first, as fairseq's dictionary); <mask> last.
LEADING_SPECIAL_TOKENS = (BOS, PAD, EOS, UNK)
# What makes a WordPiece vocabulary MPNet's.
MPNET_MARKERS = (BOS, EOS, PAD, MASK)


def is_mpnet_vocab(vocab: Mapping[str, int]) -> bool:
    """Whether a WordPiece vocabulary (token -> id) is MPNet's: holding <s>, </s>, <pad>, <mask>."""
    return all(t in vocab for t in MPNET_MARKERS)


class MPNetTokenizer(WordPieceTokenizer):
    """A `tokenizers.Tokenizer` with a WordPiece model and MPNet's special tokens (`<mask>` taking
    the space before it) and rows."""

    tokenizer_class = "MPNetTokenizer"
    special_tokens = (PAD, UNK, BOS, EOS, MASK)
    separators_between_pairs = 2
    pair_token_types = False
    mask_lstrip = True

    def _config_fields(self) -> dict:
        """`MPNetTokenizer`'s own fields: lower-casing, and <s> and </s> as bos/eos."""
        return {**super()._config_fields(), "bos_token": BOS, "eos_token": EOS}

    def __repr__(self) -> str:
        return (
            f"MPNetTokenizer({self.source!r}, vocab_size={self.vocab_size}, "
            f"lowercase={self.lowercase})"
        )


def _mpnet_pipeline(tokenizer: Tokenizer, lowercase: bool, strip_accents: bool | None):
    """Sets MPNet's normalizer, pre-tokenizer, decoder, special tokens and `RobertaProcessing`."""
    tokenizer.normalizer = bert_normalizer(lowercase, strip_accents)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix=CONTINUATION_PREFIX)
    vocab = add_roberta_special_tokens(tokenizer, LEADING_SPECIAL_TOKENS, MASK)
    tokenizer.post_processor = roberta_processing(vocab)
    return tokenizer


def load_mpnet(
    file: epath.Path,
    lowercase: bool | None = None,
    *,
    strip_accents: bool | None = None,
    max_input_chars_per_word: int | None = None,
    match_original: bool = False,
) -> MPNetTokenizer:
    """MPNet's tokenizer from a WordPiece `tokenizer.json` or a `vocab.txt` holding its special
    tokens (`tokenization.load_tokenizer` documents the arguments; `match_original`, which is
    google-research/bert's, is refused)."""
    path = os.fspath(file)
    if match_original:
        raise ValueError(f"{path} is MPNet's vocabulary; match_original applies to BERT's only")
    if path.endswith(".json"):
        tokenizer = read_tokenizer_json(file)
        if lowercase is not None or strip_accents is not None:
            current = MPNetTokenizer(tokenizer, path).lowercase if lowercase is None else None
            tokenizer.normalizer = bert_normalizer(
                bool(current if lowercase is None else lowercase), strip_accents
            )
    else:
        vocab = read_vocab_txt(path)
        if lowercase is None:
            lowercase = all(t == t.lower() for t in vocab if not t.startswith(("[", "<")))
            logging.info("%s: inferred lowercase=%s from the vocabulary", path, lowercase)
        tokenizer = _mpnet_pipeline(
            Tokenizer(wordpiece_model(vocab, unk_token=UNK)), lowercase, strip_accents
        )
    if max_input_chars_per_word is not None:
        tokenizer.model.max_input_chars_per_word = max_input_chars_per_word
    return MPNetTokenizer(tokenizer, source=path)


def train_mpnet_wordpiece(
    texts: Iterable[str],
    vocab_size: int = 8192,
    *,
    lowercase: bool = True,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
) -> MPNetTokenizer:
    """Learns a WordPiece vocabulary laid out as MPNet's (the module docstring): `texts` any
    strings, `vocab_size` counting the special tokens; the other arguments as
    `wordpiece.train_wordpiece`'s."""
    specials = [*LEADING_SPECIAL_TOKENS, MASK]
    if vocab_size <= len(specials):
        raise ValueError(f"vocab_size={vocab_size} leaves no room beyond the special tokens")
    rest = learn_pieces(
        texts,
        vocab_size,
        specials,
        lowercase=lowercase,
        strip_accents=None,
        min_frequency=min_frequency,
        limit_alphabet=limit_alphabet,
        show_progress=False,
    )
    vocab = {t: i for i, t in enumerate([*LEADING_SPECIAL_TOKENS, *rest, MASK])}
    canonical = _mpnet_pipeline(Tokenizer(wordpiece_model(vocab, unk_token=UNK)), lowercase, None)
    return MPNetTokenizer(canonical, source=f"<trained MPNet WordPiece, {len(vocab)} tokens>")
