"""Llama-3's byte-level BPE (EuroBERT's tokenizer) on Hugging Face `tokenizers`.

    tok = tokenization.load_tokenizer("EuroBERT-210m/")  # its tokenizer.json
    tok.tokenize("Hello world")     # -> ["Hello", "Ġworld"]
    tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id   # <|begin_of_text|> <|end_of_text|> ...

The pipeline is Llama-3's tokenizer.json: the text split by Llama-3's pattern (contractions,
letters with one symbol before them, digits in threes, other symbols, spaces), each piece's UTF-8
bytes mapped to 256 printable characters (no prefix space), BPE merges with whole words in the
vocabulary taken as they are (`ignore_merges`); no normalization, no unknown token (every byte is
in the vocabulary). Rows: `<|begin_of_text|> A <|end_of_text|>` and, for a pair,
`<|begin_of_text|> A <|end_of_text|> B <|end_of_text|>`, token types all 0 (EuroBERT has none).
Padding is `<|end_of_text|>` (EuroBERT's `pad_token_id` is its id: the attention mask, not the
id, tells padding), and so is the unknown token's role, which no text reaches.

`train_llama3_bpe(texts, vocab_size)` learns a vocabulary laid out as Llama-3's: the 256 bytes and
the learned merges, then `<|begin_of_text|>`, `<|end_of_text|>` and `<|mask|>` last.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from tokenizers import trainers as tokenizer_trainers

from bert_jax.tokenization import base
from bert_jax.tokenization.base import DecoderBPETokenizer, add_special_tokens, require_model

BOS, EOS, MASK = "<|begin_of_text|>", "<|end_of_text|>", "<|mask|>"
# Llama-3's pre-tokenizer pattern (its tokenizer.json's `Split`).
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
WORD_START = "\u0120"  # "Ġ", the byte of a leading space
# The mask token as tokenizer_config.json writes it: it takes the space before it.
MASK_TOKEN_CONFIG = {**base.MASK_TOKEN_CONFIG, "content": MASK}


class Llama3BPETokenizer(DecoderBPETokenizer):
    """A `tokenizers.Tokenizer` with a BPE model, byte-level pieces and Llama-3's special tokens
    (EuroBERT's `<|mask|>` among them, taking the space before it); tokens not starting with a
    space byte ("Ġ") continue a word."""

    special_tokens = (EOS, EOS, BOS, EOS, MASK)  # pad, unk, cls, sep, mask
    word_start = WORD_START
    mask_lstrip = True

    def __init__(self, tokenizer: Tokenizer, source: str = "<tokenizer>"):
        """Wraps `tokenizer`, checking that it is BPE with a byte-level step and Llama-3's
        special tokens (`MissingSpecialTokenError` names each missing one)."""
        require_model(tokenizer, source, models.BPE, "Llama-3's byte-level BPE")
        pre = tokenizer.pre_tokenizer
        if pre is None or "ByteLevel" not in pre.__getstate__().decode():
            raise ValueError(f"{source}: the BPE model's pre-tokenizer has no ByteLevel step")
        super().__init__(tokenizer, source)

    def tokenizer_config(self, model_max_length: int | None = None) -> dict:
        """transformers' `PreTrainedTokenizerFast` over tokenizer.json: bos, eos, pad (the eos),
        the mask (taking the space before it); no unknown token."""
        config = super().tokenizer_config(model_max_length)
        del config["unk_token"]
        return config


def llama3_pipeline(tokenizer: Tokenizer) -> Tokenizer:
    """Sets Llama-3's splitting and decoder, the special tokens (added after the vocabulary) and
    the rows' template."""
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    add_special_tokens(tokenizer, (BOS, EOS, MASK), lstrip={MASK})
    tokenizer.post_processor = Llama3BPETokenizer.template_processing(tokenizer)
    return tokenizer


def train_llama3_bpe(
    texts: Iterable[str], vocab_size: int = 8192, *, min_frequency: int = 2
) -> Llama3BPETokenizer:
    """Learns a byte-level BPE vocabulary split as Llama-3's (EuroBERT's kind).

    Args:
      texts: the training text, any number of strings.
      vocab_size: the size of the vocabulary, the 3 special tokens included (more than 259).
      min_frequency: merges seen fewer times are not learned.

    Returns:
      The trained tokenizer: the bytes and merges, then `<|begin_of_text|>`, `<|end_of_text|>`,
      `<|mask|>` (fewer tokens than `vocab_size` if the text has too few merges).
    """
    floor = len(pre_tokenizers.ByteLevel.alphabet()) + 3
    if vocab_size <= floor:
        raise ValueError(
            f"vocab_size={vocab_size} leaves no room for merges; use more than {floor}"
        )
    tokenizer = llama3_pipeline(Tokenizer(models.BPE(ignore_merges=True)))
    tokenizer.post_processor = None  # set again once the special tokens have their ids
    trainer = tokenizer_trainers.BpeTrainer(
        vocab_size=vocab_size - 3,
        min_frequency=min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    # Retrained models drop the added tokens' ids: rebuild them after the learned vocabulary.
    state = json.loads(tokenizer.to_str())
    state["added_tokens"] = []
    tokenizer = llama3_pipeline(Tokenizer.from_str(json.dumps(state)))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    return Llama3BPETokenizer(tokenizer, source=f"<trained Llama-3 BPE, {size} tokens>")


def is_llama3(tokenizer: Tokenizer) -> bool:
    """Whether a BPE tokenizer.json holds Llama-3's special tokens (EuroBERT's, not RoBERTa's)."""
    return tokenizer.token_to_id(BOS) is not None and tokenizer.token_to_id(EOS) is not None
