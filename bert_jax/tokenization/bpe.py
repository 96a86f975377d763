"""RoBERTa's byte-level BPE (GPT-2's) on Hugging Face `tokenizers`.

    tok = tokenization.load_tokenizer("roberta-base/")  # tokenizer.json, or vocab.json+merges.txt
    tok.tokenize("Hello world")     # -> ["Hello", "Ġworld"]   (Ġ: the byte of a leading space)
    tok.cls_id, tok.sep_id, tok.pad_id, tok.unk_id, tok.mask_id   # <s> </s> <pad> <unk> <mask>

The pipeline is `transformers.RobertaTokenizerFast`'s: text to UTF-8 bytes, each byte one of 256
printable characters, split as GPT-2 does (contractions, letters, digits, other symbols, each with
the space before it), BPE merges in the order of `merges.txt`; no normalization, no unknown token
in practice (every byte is in the vocabulary). Special tokens in the text are matched whole, and
`<mask>` takes the space before it (its `lstrip`), so "a <mask> b" masks the word " b" would have
followed. Rows: `<s> A </s>` and `<s> A </s></s> B </s>`, token types all 0 (`base`).

`train_byte_level_bpe(texts, vocab_size)` learns a vocabulary as RoBERTa's is laid out (fairseq's
dictionary): `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3, the learned tokens, `<mask>` last.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from etils import epath
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from tokenizers import trainers as tokenizer_trainers

from bert_jax.tokenization.base import (
    FAIRSEQ_SPECIAL_TOKENS,
    SubwordTokenizer,
    add_roberta_special_tokens,
    add_special_tokens,
    require_model,
    roberta_processing,
)

BOS, PAD, EOS, UNK, MASK = FAIRSEQ_SPECIAL_TOKENS
# RoBERTa's ids (fairseq's dictionary): <s> <pad> </s> <unk> first, <mask> after the learned tokens.
LEADING_SPECIAL_TOKENS = (BOS, PAD, EOS, UNK)
# A leading space, as byte-level BPE writes it: tokens starting with it begin a word.
WORD_START = "\u0120"  # "Ġ"


class ByteLevelBPETokenizer(SubwordTokenizer):
    """A `tokenizers.Tokenizer` with a byte-level BPE model and RoBERTa's special tokens (`<mask>`
    taking the space before it); tokens not starting with a space byte ("Ġ") continue a word, as
    fairseq's whole-word masking joins them to the token before.

    Attributes (besides `base.SubwordTokenizer`'s):
      add_prefix_space: whether a space is put before the text (False for RoBERTa).
    """

    kind = "bpe"
    tokenizer_class = "RobertaTokenizer"
    special_tokens = (PAD, UNK, BOS, EOS, MASK)
    separators_between_pairs = 2
    pair_token_types = False
    word_start = WORD_START
    mask_lstrip = True

    def __init__(self, tokenizer: Tokenizer, source: str = "<tokenizer>"):
        """Wraps `tokenizer`, checking that it is byte-level BPE with RoBERTa's special tokens.

        Raises:
          ValueError: the model is not BPE or does not split bytes; the ids are not contiguous.
          MissingSpecialTokenError: a special token is missing; the message names each.
        """
        require_model(tokenizer, source, models.BPE, "byte-level BPE")
        pre = json.loads(tokenizer.pre_tokenizer.__getstate__()) if tokenizer.pre_tokenizer else {}
        if pre.get("type") != "ByteLevel":
            raise ValueError(
                f"{source}: the BPE model's pre-tokenizer is {pre.get('type')}, not ByteLevel "
                "(RoBERTa's and GPT-2's)"
            )
        super().__init__(tokenizer, source)
        self.add_prefix_space = bool(pre.get("add_prefix_space", False))

    def _word_tokenizer(self) -> Tokenizer:
        """A copy that puts a space before each word (transformers' `add_prefix_space=True`, which
        RoBERTa needs for words given one by one): the words then tokenize as in running text."""
        state = json.loads(self.tokenizer.pre_tokenizer.__getstate__())
        return self._copy_for_words(
            pre_tokenizer=pre_tokenizers.ByteLevel(
                add_prefix_space=True, use_regex=state.get("use_regex", True)
            )
        )

    def _config_fields(self) -> dict:
        """`RobertaTokenizer`'s own fields: <s> and </s> as bos/eos, the prefix space, offsets."""
        return {
            "add_prefix_space": self.add_prefix_space,
            "bos_token": BOS,
            "eos_token": EOS,
            "trim_offsets": True,
        }

    def files(self, model_max_length: int | None = None) -> dict[str, str]:
        """`tokenizer.json`, a `tokenizer_config.json` naming `RobertaTokenizer` (so
        `AutoTokenizer` picks it), and RoBERTa's `vocab.json` and `merges.txt`."""
        state = json.loads(self.tokenizer.to_str())
        vocab = state["model"]["vocab"]
        for added in state.get("added_tokens", []):
            vocab.setdefault(added["content"], added["id"])
        merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
        return {
            **super().files(model_max_length),
            "vocab.json": json.dumps(vocab, ensure_ascii=False),
            "merges.txt": "#version: 0.2\n" + "".join(m + "\n" for m in merges),
        }


def _roberta_pipeline(tokenizer: Tokenizer, add_prefix_space: bool = False) -> Tokenizer:
    """Sets RoBERTa's byte-level splitting, decoder, special tokens and `RobertaProcessing`."""
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tokenizer.decoder = decoders.ByteLevel()
    vocab = add_roberta_special_tokens(tokenizer, LEADING_SPECIAL_TOKENS, MASK)
    if BOS in vocab and EOS in vocab:
        tokenizer.post_processor = roberta_processing(vocab, add_prefix_space)
    return tokenizer


def load_vocab_and_merges(vocab_file: epath.Path, merges_file: epath.Path) -> ByteLevelBPETokenizer:
    """RoBERTa's tokenizer from its `vocab.json` and `merges.txt` (as `RobertaTokenizerFast`
    builds it from them).

    Raises:
      FileNotFoundError: `merges.txt` is missing.
      ValueError: a file is not what its name says.
    """
    if not merges_file.is_file():
        raise FileNotFoundError(
            f"{os.fspath(vocab_file)} needs its merges.txt beside it (byte-level BPE's merge "
            f"rules); not found: {os.fspath(merges_file)}"
        )
    try:
        vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{os.fspath(vocab_file)} is not a JSON vocabulary: {e}") from e
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise ValueError(f"{os.fspath(vocab_file)} is not a {{token: id}} JSON object")
    merges = []
    for n, line in enumerate(merges_file.read_text(encoding="utf-8").splitlines()):
        if line.startswith("#version") or not line.strip():
            continue
        pair = tuple(line.split(" "))
        if len(pair) != 2:
            raise ValueError(f"{os.fspath(merges_file)}: line {n + 1} is not two tokens: {line!r}")
        merges.append(pair)
    model = models.BPE(vocab, merges, continuing_subword_prefix="", end_of_word_suffix="")
    tokenizer = _roberta_pipeline(Tokenizer(model))
    return ByteLevelBPETokenizer(tokenizer, source=os.fspath(vocab_file))


def train_byte_level_bpe(
    texts: Iterable[str],
    vocab_size: int = 8192,
    *,
    min_frequency: int = 2,
    show_progress: bool = False,
) -> ByteLevelBPETokenizer:
    """Learns a byte-level BPE vocabulary (RoBERTa's kind) with `tokenizers`' BPE trainer.

    The ids are laid out as RoBERTa's: `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3, the 256 bytes and
    the learned merges, `<mask>` last (id `vocab_size - 1`). Cased, no normalization.

    Args:
      texts: the training text, any number of strings (lines or documents).
      vocab_size: the size of the vocabulary, special tokens included.
      min_frequency: merges seen fewer times are not learned.
      show_progress: the trainer's progress bar.

    Returns:
      The trained tokenizer (fewer tokens than `vocab_size` if the text has too few merges).
    """
    floor = len(LEADING_SPECIAL_TOKENS) + len(pre_tokenizers.ByteLevel.alphabet()) + 1
    if vocab_size <= floor:
        raise ValueError(
            f"vocab_size={vocab_size} leaves no room for merges: byte-level BPE has the 256 "
            f"bytes and 5 special tokens; use more than {floor}"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizer_trainers.BpeTrainer(
        vocab_size=vocab_size - 1,  # <mask> comes after
        min_frequency=min_frequency,
        special_tokens=list(LEADING_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer = _roberta_pipeline(tokenizer)
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    return ByteLevelBPETokenizer(tokenizer, source=f"<trained byte-level BPE, {size} tokens>")


# ModernBERT's (and Ettin's) byte-level BPE: OLMo's vocabulary, BERT's special tokens after it.
MB_PAD, MB_UNK, MB_CLS, MB_SEP, MB_MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
OLMO_LEADING_TOKENS = ("<|endoftext|>", "<|padding|>")
# ModernBERT's ids: [UNK] [CLS] [SEP] [PAD] [MASK] after the learned tokens (50280 .. 50284).
MODERNBERT_SPECIAL_TOKENS = (MB_UNK, MB_CLS, MB_SEP, MB_PAD, MB_MASK)


def is_modernbert_bpe(tokenizer: Tokenizer) -> bool:
    """Whether a byte-level BPE tokenizer.json holds BERT's [CLS] and [SEP] (ModernBERT's)."""
    return tokenizer.token_to_id(MB_CLS) is not None and tokenizer.token_to_id(MB_SEP) is not None


class ModernBertBPETokenizer(ByteLevelBPETokenizer):
    """ModernBERT's tokenizer (Ettin's too): GPT-2's byte-level BPE over OLMo's vocabulary with
    BERT's special tokens ([MASK] taking the space before it) and rows, `[CLS] A [SEP]` and
    `[CLS] A [SEP] B [SEP]` (types 1 from B on; transformers returns none for ModernBERT)."""

    tokenizer_class = "PreTrainedTokenizerFast"
    special_tokens = (MB_PAD, MB_UNK, MB_CLS, MB_SEP, MB_MASK)
    separators_between_pairs = 1
    pair_token_types = True

    def _config_fields(self) -> dict:
        """ModernBERT's tokenizer_config.json fields: no token types; decoding leaves spaces as
        they are (the released file asks for BERT's clean-up, which transformers 5 ignores for
        BPE and 4 applies, joining "a ." into "a.")."""
        return {
            "clean_up_tokenization_spaces": False,
            "model_input_names": ["input_ids", "attention_mask"],
        }

    def files(self, model_max_length: int | None = None) -> dict[str, str]:
        """`tokenizer.json` and `tokenizer_config.json` (naming `PreTrainedTokenizerFast`), as
        ModernBERT's are released (no vocab.json or merges.txt)."""
        return SubwordTokenizer.files(self, model_max_length)


def train_modernbert_bpe(
    texts: Iterable[str], vocab_size: int = 8192, *, min_frequency: int = 2
) -> ModernBertBPETokenizer:
    """Learns a byte-level BPE vocabulary laid out as ModernBERT's (Ettin's kind).

    The ids: OLMo's `<|endoftext|>`=0 and `<|padding|>`=1, the 256 bytes and the learned merges,
    then `[UNK]`, `[CLS]`, `[SEP]`, `[PAD]`, `[MASK]`, and `[unused<i>]` tokens up to a multiple
    of 8 (ModernBERT's 50,368 ids are a multiple of 64). Cased, no normalization.

    Args:
      texts: the training text, any number of strings.
      vocab_size: the size of the vocabulary before the `[unused<i>]` tokens (more than 263).
      min_frequency: merges seen fewer times are not learned.

    Returns:
      The trained tokenizer.
    """
    floor = len(OLMO_LEADING_TOKENS) + len(pre_tokenizers.ByteLevel.alphabet()) + 5
    if vocab_size <= floor:
        raise ValueError(
            f"vocab_size={vocab_size} leaves no room for merges; use more than {floor}"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizer_trainers.BpeTrainer(
        vocab_size=vocab_size - len(MODERNBERT_SPECIAL_TOKENS),
        min_frequency=min_frequency,
        special_tokens=list(OLMO_LEADING_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.decoder = decoders.ByteLevel()
    add_special_tokens(tokenizer, MODERNBERT_SPECIAL_TOKENS, lstrip={MB_MASK})
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    tokenizer.add_tokens([AddedToken(f"[unused{i}]", normalized=False) for i in range(-size % 8)])
    tokenizer.post_processor = ModernBertBPETokenizer.template_processing(tokenizer)
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    return ModernBertBPETokenizer(tokenizer, source=f"<trained ModernBERT BPE, {size} tokens>")
