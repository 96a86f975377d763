"""Tokenizers of the model families, on Hugging Face `tokenizers` (the Rust library).

`load_tokenizer(path)` reads whichever kind a file or directory holds and returns a
`SubwordTokenizer` that knows its special tokens by role (`cls_id`, `sep_id`, `pad_id`, `mask_id`,
`unk_id`) and lays rows out as transformers does (`build_inputs`):

  kind       files                                       class                      family
  wordpiece  vocab.txt, or tokenizer.json (WordPiece)    WordPieceTokenizer         BERT
  bpe        vocab.json + merges.txt, or tokenizer.json  ByteLevelBPETokenizer      RoBERTa
  bpe        tokenizer.json (<|begin_of_text|> ...)      Llama3BPETokenizer         EuroBERT
  bpe        tokenizer.json (byte-level, [CLS] [SEP])    ModernBertBPETokenizer     ModernBERT
  bpe        tokenizer.json (byte_fallback: Gemma's)     SentencePieceBPETokenizer  mmBERT
  unigram    tokenizer.json (Unigram), or                SentencePieceTokenizer     XLM-RoBERTa
             sentencepiece.bpe.model (needs `sentencepiece`)
  unigram    tokenizer.json (Unigram, [CLS] [SEP]), or   DebertaV2Tokenizer         DeBERTa-v2/v3
             spm.model (needs `sentencepiece`)
  wordpiece  tokenizer.json or vocab.txt (WordPiece,     MPNetTokenizer             MPNet
             <s> </s> <pad> <mask>)

Token ids equal transformers' fast tokenizers' (`BertTokenizerFast`, `RobertaTokenizerFast`,
`XLMRobertaTokenizerFast`, `DebertaV2Tokenizer`, `MPNetTokenizer`, and `PreTrainedTokenizerFast`
over the BPE files of EuroBERT, ModernBERT and mmBERT) for the same files; a Unigram
tokenizer.json is XLM-R's or DeBERTa's by its special tokens (`unigram.layout_of`), a BPE one
Gemma's if it has byte fallback (mmBERT's: `gemma.is_sentencepiece_bpe`), else Llama-3's
(EuroBERT's: `llama3.is_llama3`), ModernBERT's and Ettin's ([CLS] and [SEP]:
`bpe.is_modernbert_bpe`) or RoBERTa's, a WordPiece one BERT's or MPNet's (`mpnet.is_mpnet_vocab`);
the ModernBERT family reads any of them (its own pretraining job makes a WordPiece one).
Modules: `base` (what the kinds share), `wordpiece`, `mpnet`, `bpe`, `llama3`, `gemma`,
`unigram`. Training: `train_wordpiece`, `train_mpnet_wordpiece`, `train_byte_level_bpe`,
`train_modernbert_bpe`, `train_llama3_bpe`, `train_sentencepiece_bpe` and `train_unigram` (the
command `bert-jax-train-wordpiece`, `--kind=bpe` and `--kind=unigram` for RoBERTa's and XLM-R's;
`train_unigram(..., layout=unigram.DEBERTA_V3)` lays it out as DeBERTa-v3's).
"""

from __future__ import annotations

import os

from etils import epath
from tokenizers import models

from bert_jax.tokenization import gemma, llama3
from bert_jax.tokenization.base import (
    MissingSpecialTokenError,
    SubwordTokenizer,
    read_tokenizer_json,
)
from bert_jax.tokenization.bpe import (
    ByteLevelBPETokenizer,
    ModernBertBPETokenizer,
    is_modernbert_bpe,
    load_vocab_and_merges,
    train_byte_level_bpe,
    train_modernbert_bpe,
)
from bert_jax.tokenization.gemma import SentencePieceBPETokenizer, train_sentencepiece_bpe
from bert_jax.tokenization.llama3 import Llama3BPETokenizer, train_llama3_bpe
from bert_jax.tokenization.mpnet import (
    MPNetTokenizer,
    is_mpnet_vocab,
    load_mpnet,
    train_mpnet_wordpiece,
)
from bert_jax.tokenization.unigram import (
    DEBERTA_SPM_MODEL,
    SENTENCEPIECE_MODEL,
    DebertaV2Tokenizer,
    SentencePieceTokenizer,
    load_sentencepiece_model,
    train_unigram,
)
from bert_jax.tokenization.unigram import from_tokenizer_json as unigram_from_tokenizer_json
from bert_jax.tokenization.wordpiece import (
    CLS,
    CONTINUATION_PREFIX,
    MASK,
    MAX_INPUT_CHARS_PER_WORD,
    ORIGINAL_MAX_INPUT_CHARS_PER_WORD,
    PAD,
    SEP,
    SPECIAL_TOKENS,
    UNK,
    WordPieceTokenizer,
    load_wordpiece,
    read_vocab_txt,
    train_wordpiece,
)

# The files a directory may hold a tokenizer in, in the order they are looked for.
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    SENTENCEPIECE_MODEL,
    DEBERTA_SPM_MODEL,
)

__all__ = [
    "CLS",
    "CONTINUATION_PREFIX",
    "MASK",
    "MAX_INPUT_CHARS_PER_WORD",
    "ORIGINAL_MAX_INPUT_CHARS_PER_WORD",
    "PAD",
    "SEP",
    "SPECIAL_TOKENS",
    "TOKENIZER_FILES",
    "UNK",
    "ByteLevelBPETokenizer",
    "DebertaV2Tokenizer",
    "Llama3BPETokenizer",
    "MPNetTokenizer",
    "ModernBertBPETokenizer",
    "MissingSpecialTokenError",
    "SentencePieceBPETokenizer",
    "SentencePieceTokenizer",
    "SubwordTokenizer",
    "WordPieceTokenizer",
    "load_tokenizer",
    "read_vocab_txt",
    "train_byte_level_bpe",
    "train_llama3_bpe",
    "train_modernbert_bpe",
    "train_mpnet_wordpiece",
    "train_sentencepiece_bpe",
    "train_unigram",
    "train_wordpiece",
]


def load_tokenizer(
    path: str | os.PathLike,
    lowercase: bool | None = None,
    *,
    strip_accents: bool | None = None,
    max_input_chars_per_word: int | None = None,
    match_original: bool = False,
) -> SubwordTokenizer:
    """Loads the tokenizer at `path`, of the kind its file holds.

    Args:
      path: a `tokenizer.json` (WordPiece, BPE or Unigram), a BERT `vocab.txt` (one
        token a line, id = line number), RoBERTa's `vocab.json` (with `merges.txt` beside it),
        XLM-R's `sentencepiece.bpe.model`, DeBERTa's `spm.model`, or a directory holding one
        (looked for in the order of `TOKENIZER_FILES`); local or a URL (`gs://`, through
        `etils.epath`).
      lowercase: WordPiece only: lower-case the input (uncased models). None: keep what
        `tokenizer.json` says, or for a `vocab.txt` infer it (uncased iff no token has an
        upper-case letter; logged).
      strip_accents: WordPiece only: strip accents; None follows `lowercase`, as in BERT.
      max_input_chars_per_word: WordPiece only: longer words become [UNK]; None keeps the file's
        value (100 for a `vocab.txt`, 200 with `match_original`).
      match_original: WordPiece only: tokenize as google-research/bert's `FullTokenizer` where it
        differs from `BertTokenizerFast` and the difference can be matched (`wordpiece`'s
        docstring); a tokenizer.json saved from such a tokenizer keeps this pipeline.

    Returns:
      The tokenizer: a `WordPieceTokenizer`, `MPNetTokenizer`, `ByteLevelBPETokenizer`,
      `ModernBertBPETokenizer`, `Llama3BPETokenizer`, `SentencePieceBPETokenizer` (mmBERT),
      `SentencePieceTokenizer` (XLM-R) or `DebertaV2Tokenizer`.

    Raises:
      FileNotFoundError: nothing usable at `path`.
      MissingSpecialTokenError: the vocabulary lacks a special token; the message names each.
      ValueError: the file is no tokenizer of these kinds, or WordPiece options for another kind.
      ImportError: a SentencePiece model file without the `sentencepiece` package.
    """
    file = _tokenizer_file(path)
    name = file.name
    wordpiece_options = dict(
        lowercase=lowercase,
        strip_accents=strip_accents,
        max_input_chars_per_word=max_input_chars_per_word,
        match_original=match_original,
    )
    if name.endswith(".json") and name != "vocab.json":
        tokenizer = read_tokenizer_json(file)
        model = tokenizer.model
        if isinstance(model, models.WordPiece):
            if is_mpnet_vocab(tokenizer.get_vocab(with_added_tokens=True)):
                return load_mpnet(file, **wordpiece_options)
            return load_wordpiece(file, **wordpiece_options)
        _refuse_wordpiece_options(file, wordpiece_options)
        if isinstance(model, models.BPE):
            if gemma.is_sentencepiece_bpe(tokenizer):  # mmBERT's (Gemma's)
                return SentencePieceBPETokenizer(tokenizer, source=os.fspath(file))
            if llama3.is_llama3(tokenizer):  # EuroBERT's
                return Llama3BPETokenizer(tokenizer, source=os.fspath(file))
            if is_modernbert_bpe(tokenizer):  # ModernBERT's, Ettin's
                return ModernBertBPETokenizer(tokenizer, source=os.fspath(file))
            return ByteLevelBPETokenizer(tokenizer, source=os.fspath(file))
        if isinstance(model, models.Unigram):
            return unigram_from_tokenizer_json(file)
        raise ValueError(
            f"{os.fspath(file)}: a {type(model).__name__} model; bert_jax reads WordPiece (BERT), "
            "BPE (RoBERTa, ModernBERT, EuroBERT, mmBERT) and Unigram (XLM-R, DeBERTa) tokenizers"
        )
    if name == "vocab.json":
        _refuse_wordpiece_options(file, wordpiece_options)
        return load_vocab_and_merges(file, file.parent / "merges.txt")
    if name.endswith(".model"):
        _refuse_wordpiece_options(file, wordpiece_options)
        return load_sentencepiece_model(file)
    if is_mpnet_vocab(read_vocab_txt(file)):
        return load_mpnet(file, **wordpiece_options)
    return load_wordpiece(file, **wordpiece_options)


def _tokenizer_file(path: str | os.PathLike) -> epath.Path:
    """The tokenizer file at `path`: itself, or the first of `TOKENIZER_FILES` in a directory."""
    file = epath.Path(path)  # local, or a URL such as gs://bucket/vocab.txt
    if file.is_dir():
        for name in TOKENIZER_FILES:
            if (file / name).is_file():
                file = file / name
                break
        else:
            raise FileNotFoundError(
                f"no tokenizer in {os.fspath(path)}: none of {', '.join(TOKENIZER_FILES)}"
            )
    if not file.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {os.fspath(path)}")
    return file


def _refuse_wordpiece_options(file: epath.Path, options: dict) -> None:
    """ValueError naming the WordPiece-only options given for a tokenizer of another kind."""
    given = [k for k, v in options.items() if v not in (None, False)]
    if given:
        raise ValueError(
            f"{os.fspath(file)} is no WordPiece tokenizer; {', '.join(given)} apply to "
            "WordPiece (BERT) vocabularies only"
        )
