"""Tokenizer directories shaped like two ModernBERT releases, written offline (no vocabulary of
either ships here), with the files as they are published to the best of this project's knowledge:

* mmBERT (jhu-clsp/mmBERT-*): Gemma 2's tokenizer, a SentencePiece BPE with byte fallback:
  `<pad>`=0, `<eos>`=1, `<bos>`=2, `<unk>`=3, `<mask>`=4, byte tokens `<0x00>`..`<0xFF>`, the
  pieces (256,000 ids in all; here a few hundred learned on a little text); spaces become "▁",
  no dummy prefix; rows `<bos> A <eos>` (config.json's cls_token_id 2, sep_token_id 1). Its
  tokenizer_config.json names `GemmaTokenizer` and the roles. The released template is assumed to
  be `<bos> $A <eos>`; `gemma_template=True` writes Gemma's own (`<bos> $A`) instead.
* Ettin (jhu-clsp/ettin-encoder-*): ModernBERT's own tokenizer, OLMo's byte-level BPE with
  [UNK] [CLS] [SEP] [PAD] [MASK] after the learned tokens and [unused<i>] tokens to a round
  size; tokenizer_config.json names `PreTrainedTokenizerFast`, no token types.

What is a guess: the exact template of mmBERT's tokenizer.json and the optional fields of both
tokenizer_config.json files (the tokenizer's ids and rows do not depend on those fields).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence

from tokenizers import Tokenizer, processors

from bert_jax import tokenization

TEXTS = [
    "Hello world, what's the answer? 12345 apples.",
    "The quick brown fox jumps over the lazy dog.",
    "  Spaces\tand\nnew lines; émigré naïve café, Ångström.",
    "Fair is foul, and foul is fair: hover through the fog and filthy air.",
]
# Text the fixtures never learned: characters outside their alphabets go through byte fallback
# (mmBERT's kind) or byte-level pieces (Ettin's).
PROBES = [
    "",
    "emoji 😀👍🏽 and symbols ©®™ ∑∫",
    "中文字符測試 日本語のテキスト 한국어 텍스트",
    "\x00\x01\x7f control\u200b chars\ufeff and \ufffd replacement",
    "  two  spaces,\ttabs\r\nand lines ",
    "the quick <mask> fox [MASK] jumps",
    "Ελληνικά, Русский, עברית, العربية",
]


def _write_config(directory: pathlib.Path, config: dict) -> None:
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def mmbert_like_dir(
    directory: pathlib.Path, texts: Sequence[str] = TEXTS, vocab_size: int = 400, **options
) -> pathlib.Path:
    """An mmBERT-shaped tokenizer directory (tokenizer.json, tokenizer_config.json)."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenization.train_sentencepiece_bpe(texts, vocab_size, min_frequency=1).tokenizer
    if options.get("gemma_template"):
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)]
        )
    tokenizer.save(str(directory / "tokenizer.json"))
    _write_config(
        directory,
        {
            "tokenizer_class": "GemmaTokenizer",
            "add_bos_token": True,
            "add_eos_token": True,
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "cls_token": "<bos>",
            "sep_token": "<eos>",
            "unk_token": "<unk>",
            "pad_token": "<pad>",
            "mask_token": "<mask>",
            "clean_up_tokenization_spaces": False,
            "spaces_between_special_tokens": False,
            "model_max_length": 8192,
        },
    )
    return directory


def ettin_like_dir(
    directory: pathlib.Path, texts: Sequence[str] = TEXTS, vocab_size: int = 400
) -> pathlib.Path:
    """An Ettin-shaped (ModernBERT's own) tokenizer directory."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenization.train_modernbert_bpe(texts, vocab_size, min_frequency=1).tokenizer
    tokenizer.save(str(directory / "tokenizer.json"))
    _write_config(
        directory,
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": True,
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "mask_token": "[MASK]",  # lstrip in tokenizer.json's added_tokens
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": 8192,
        },
    )
    return directory


def read_tokenizer(directory: pathlib.Path) -> Tokenizer:
    return Tokenizer.from_file(str(directory / "tokenizer.json"))
