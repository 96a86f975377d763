"""XLM-RoBERTa's SentencePiece Unigram tokenizer on Hugging Face `tokenizers`.

    tok = tokenization.load_tokenizer("xlm-roberta-base/")   # its tokenizer.json
    tok.tokenize("Hello world")     # -> ["▁Hello", "▁world"]   (▁: a word's leading space)

The pipeline is transformers 5's `XLMRobertaTokenizerFast`'s, which keeps of a tokenizer.json
only its vocabulary and SentencePiece's normalization (the precompiled NFKC-like character map),
and around them splits on whitespace, puts "▁" before each word and takes the Unigram model's
most likely segmentation.
The ids are fairseq's: `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3, SentencePiece's pieces from its id
3 on shifted up by one, `<mask>` last. Rows: `<s> A </s>` and `<s> A </s></s> B </s>`, token types
all 0 (`base`).

XLM-R's `sentencepiece.bpe.model` (despite its name a Unigram model) is read only where the
`sentencepiece` package is installed (its protobuf schema); otherwise give the tokenizer.json.

`train_unigram(texts, vocab_size)` learns a Unigram vocabulary (`tokenizers`' trainer, not
SentencePiece's) laid out as XLM-R's, through the same pipeline.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable

import numpy as np
from etils import epath
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)
from tokenizers import trainers as tokenizer_trainers

from bert_jax.tokenization.base import MASK_TOKEN_CONFIG, SubwordTokenizer

BOS, PAD, EOS, UNK, MASK = "<s>", "<pad>", "</s>", "<unk>", "<mask>"
WORD_START = "\u2581"  # "▁"
SENTENCEPIECE_MODEL = "sentencepiece.bpe.model"
_UNIGRAM = 1  # SentencePiece's TrainerSpec.model_type for Unigram


class SentencePieceTokenizer(SubwordTokenizer):
    """A `tokenizers.Tokenizer` with a Unigram model and XLM-R's special tokens."""

    kind = "unigram"
    tokenizer_class = "XLMRobertaTokenizer"
    special_tokens = (PAD, UNK, BOS, EOS, MASK)
    separators_between_pairs = 2
    pair_token_types = False

    def __init__(self, tokenizer: Tokenizer, source: str = "<tokenizer>"):
        """Wraps `tokenizer`, checking that it is Unigram with XLM-R's special tokens.

        Raises:
          ValueError: the model is not Unigram, or the ids are not contiguous.
          MissingSpecialTokenError: a special token is missing; the message names each.
        """
        if not isinstance(tokenizer.model, models.Unigram):
            raise ValueError(
                f"{source}: the tokenizer model is {type(tokenizer.model).__name__}, but "
                "SentencePiece (XLM-R) needs a Unigram model"
            )
        super().__init__(tokenizer, source)

    def continuation_mask(self) -> np.ndarray:
        """bool [V]: True for pieces that do not start a word (no leading "▁"); False for
        special tokens."""
        specials = set(self.special_tokens)
        return np.array(
            [not t.startswith(WORD_START) and t not in specials for t in self.vocab], dtype=bool
        )

    def _config_fields(self) -> dict:
        """`XLMRobertaTokenizer`'s own fields: <s> and </s> as bos/eos."""
        return {"bos_token": BOS, "eos_token": EOS}

    def tokenizer_config(self, model_max_length: int | None = None) -> dict:
        """`SubwordTokenizer.tokenizer_config`, `<mask>` taking the space before it."""
        return {**super().tokenizer_config(model_max_length), "mask_token": MASK_TOKEN_CONFIG}


def xlm_roberta_tokenizer(
    vocab: list[tuple[str, float]], precompiled_charsmap: bytes | None = None
) -> Tokenizer:
    """XLM-R's `tokenizers` pipeline over a Unigram vocabulary in fairseq's id order, built as
    transformers 5's `XLMRobertaTokenizerFast` builds it (from a tokenizer.json too: it keeps only
    the file's vocabulary and character map): the precompiled character map, whitespace split,
    "▁" before each word, `<unk>` = 3, `<mask>` taking the space before it.

    Args:
      vocab: (piece, log probability) by id: `<s>`, `<pad>`, `</s>`, `<unk>`, ..., `<mask>`.
      precompiled_charsmap: SentencePiece's normalization map (None: no normalization).
    """
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=3, byte_fallback=False))
    if precompiled_charsmap:
        tokenizer.normalizer = normalizers.Precompiled(precompiled_charsmap)
    tokenizer.pre_tokenizer = _words()
    tokenizer.decoder = decoders.Metaspace(replacement=WORD_START, prepend_scheme="always")
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in (BOS, PAD, EOS, UNK)]
        + [AddedToken(MASK, lstrip=True, special=True, normalized=False)]
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}",
        pair=f"{BOS} $A {EOS} {EOS} $B {EOS}",
        special_tokens=[(BOS, 0), (EOS, 2)],
    )
    return tokenizer


def _words() -> pre_tokenizers.PreTokenizer:
    """XLM-R's word split: on whitespace, "▁" before each word."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement=WORD_START, prepend_scheme="always"),
        ]
    )


def fairseq_vocab(pieces: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """XLM-R's vocabulary from SentencePiece's pieces (`<unk>`, `<s>`, `</s>`, then the rest):
    fairseq's `<s>`, `<pad>`, `</s>`, `<unk>`, the rest shifted up by one, `<mask>` last (as
    transformers' `XLMRobertaConverter` lays them out)."""
    return [(BOS, 0.0), (PAD, 0.0), (EOS, 0.0), (UNK, 0.0), *pieces[3:], (MASK, 0.0)]


def from_tokenizer_json(file: epath.Path) -> SentencePieceTokenizer:
    """XLM-R's tokenizer from a Unigram tokenizer.json, read as transformers 5 reads it (its
    vocabulary and precompiled character map; XLM-R's pipeline around them)."""
    state = json.loads(file.read_text(encoding="utf-8"))
    model = state.get("model") or {}
    vocab = [tuple(v) for v in model.get("vocab") or []]
    if model.get("type") != "Unigram" or not vocab:
        raise ValueError(f"{os.fspath(file)}: no Unigram vocabulary in its model")
    normalizer = state.get("normalizer") or {}
    charsmap = None
    for part in [normalizer, *normalizer.get("normalizers", [])]:
        if part.get("type") == "Precompiled" and part.get("precompiled_charsmap"):
            charsmap = base64.b64decode(part["precompiled_charsmap"])
    return SentencePieceTokenizer(xlm_roberta_tokenizer(vocab, charsmap), source=os.fspath(file))


def load_sentencepiece_model(file: epath.Path) -> SentencePieceTokenizer:
    """XLM-R's tokenizer from its `sentencepiece.bpe.model` (a SentencePiece Unigram model).

    Raises:
      ImportError: the `sentencepiece` package (its protobuf schema) is not installed.
      ValueError: the file is no SentencePiece Unigram model.
    """
    path = os.fspath(file)
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as e:
        raise ImportError(
            f"{path} is a SentencePiece model, which needs the `sentencepiece` package to read "
            "(pip install sentencepiece); or give the model's tokenizer.json instead"
        ) from e
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(file.read_bytes())
    except Exception as e:
        raise ValueError(f"{path} is not a SentencePiece model: {e}") from e
    if proto.trainer_spec.model_type != _UNIGRAM or len(proto.pieces) < 4:
        raise ValueError(f"{path} is not a SentencePiece Unigram model (XLM-R's kind)")
    pieces = [(p.piece, p.score) for p in proto.pieces]
    tokenizer = xlm_roberta_tokenizer(
        fairseq_vocab(pieces), proto.normalizer_spec.precompiled_charsmap
    )
    return SentencePieceTokenizer(tokenizer, source=path)


def train_unigram(
    texts: Iterable[str], vocab_size: int = 8192, *, show_progress: bool = False
) -> SentencePieceTokenizer:
    """Learns a Unigram vocabulary (XLM-R's kind) with `tokenizers`' Unigram trainer.

    The trainer sees the words as XLM-R's pipeline splits them (whitespace, "▁" before each) and
    orders its pieces as SentencePiece does (`<unk>`, `<s>`, `</s>`, then the pieces by
    probability); `fairseq_vocab` then lays them out as XLM-R's: `<s>`=0, `<pad>`=1, `</s>`=2,
    `<unk>`=3, the learned pieces, `<mask>` last (id `vocab_size - 1`). Cased, no normalization
    (no precompiled character map: `tokenizers` cannot make one). Not exactly reproducible
    across processes: on the plays two trainings learned the same pieces, but their scores
    differed in the last digits (up to 1e-3 for the rarest characters) and pieces of equal score
    came in another order, so ids can differ; keep the trained files (a build does).

    Args:
      texts: the training text, any number of strings (lines or documents).
      vocab_size: the size of the vocabulary, special tokens included.
      show_progress: the trainer's progress bar.

    Returns:
      The trained tokenizer (fewer pieces than `vocab_size` if the text has too few).
    """
    if vocab_size <= 5:
        raise ValueError(f"vocab_size={vocab_size}: XLM-R's layout alone has 5 special tokens")
    spm = Tokenizer(models.Unigram())
    spm.pre_tokenizer = _words()
    trainer = tokenizer_trainers.UnigramTrainer(
        vocab_size=vocab_size - 2,  # fairseq's <pad> and <mask> come after
        special_tokens=[UNK, BOS, EOS],  # SentencePiece's ids 0, 1, 2
        unk_token=UNK,
        show_progress=show_progress,
    )
    try:
        spm.train_from_iterator(texts, trainer)
    except Exception as e:  # the trainer raises a bare Exception
        if "not large enough" not in str(e):
            raise
        raise ValueError(
            f"vocab_size={vocab_size} cannot hold every character of the text; use a larger one"
        ) from e
    pieces = [tuple(p) for p in json.loads(spm.to_str())["model"]["vocab"]]
    tokenizer = xlm_roberta_tokenizer(fairseq_vocab(pieces))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    return SentencePieceTokenizer(tokenizer, source=f"<trained Unigram, {size} pieces>")
