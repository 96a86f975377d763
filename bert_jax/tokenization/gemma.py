"""Gemma's SentencePiece BPE with byte fallback (mmBERT's tokenizer) on Hugging Face `tokenizers`.

    tok = tokenization.load_tokenizer("mmBERT-base/")   # its tokenizer.json
    tok.tokenize("Hello world")     # -> ["Hello", "▁world"]   (▁: a space; "☃" unseen: 3 bytes)
    tok.cls_id, tok.sep_id, tok.pad_id, tok.unk_id, tok.mask_id   # <bos> <eos> <pad> <unk> <mask>

The pipeline is Gemma's tokenizer.json: every space becomes "▁" (U+2581; no "▁" is put before
the text), the text is not split into words, and BPE merges run over it in the order of the
merges list; a character the vocabulary lacks becomes the tokens of its UTF-8 bytes (`<0xE2>`
...: `byte_fallback`), so no text reaches `<unk>`. Special tokens in the text are matched whole.
A BPE tokenizer.json with `byte_fallback` is of this kind (`is_sentencepiece_bpe`).

Rows are ModernBERT's, with Gemma's tokens in its roles: `<bos> A <eos>` and, for a pair,
`<bos> A <eos> B <eos>`, token types all 0 (ModernBERT has none): the rows mmBERT's config.json
names by `cls_token_id` and `sep_token_id` (2 and 1). A tokenizer.json that lays rows out
otherwise (Gemma's own template is `<bos> A`) is given this template on loading, with a warning,
so that the files `save` writes lay rows out as the model is fed here.

`train_sentencepiece_bpe(texts, vocab_size)` learns a vocabulary laid out as Gemma's begins:
`<pad>`=0, `<eos>`=1, `<bos>`=2, `<unk>`=3, `<mask>`=4, the 256 byte tokens `<0x00>`..`<0xFF>`,
then the learned pieces (Gemma's has unused and formatting tokens between; mmBERT's has 256,000).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from absl import logging
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import trainers as tokenizer_trainers

from bert_jax.tokenization.base import DecoderBPETokenizer, add_special_tokens, require_model

PAD, EOS, BOS, UNK, MASK = "<pad>", "<eos>", "<bos>", "<unk>", "<mask>"
# Gemma's first ids: <pad>=0, <eos>=1, <bos>=2, <unk>=3, <mask>=4.
LEADING_SPECIAL_TOKENS = (PAD, EOS, BOS, UNK, MASK)
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))
WORD_START = "\u2581"  # "▁", a space


def is_sentencepiece_bpe(tokenizer: Tokenizer) -> bool:
    """Whether a tokenizer.json is SentencePiece's BPE with byte fallback (Gemma's, mmBERT's)."""
    return isinstance(tokenizer.model, models.BPE) and bool(tokenizer.model.byte_fallback)


class SentencePieceBPETokenizer(DecoderBPETokenizer):
    """A `tokenizers.Tokenizer` with a byte-fallback BPE model and Gemma's special tokens, in
    ModernBERT's rows (mmBERT's tokenizer): <bos> and <eos> as cls and sep, and as bos and eos in
    tokenizer_config.json; tokens not starting with "▁" (a space) continue a word (byte tokens
    too). Its files are tokenizer.json as it is (transformers 4's GemmaTokenizerFast would rebuild
    the template from add_bos_token/add_eos_token, putting a <bos> before a pair's B)."""

    special_tokens = (PAD, UNK, BOS, EOS, MASK)  # pad, unk, cls, sep, mask
    word_start = WORD_START

    def __init__(self, tokenizer: Tokenizer, source: str = "<tokenizer>"):
        """Wraps `tokenizer`, checking that it is BPE with byte fallback and Gemma's special
        tokens (`MissingSpecialTokenError` names each missing one), and giving it ModernBERT's
        rows where its template differs (logged)."""
        require_model(tokenizer, source, models.BPE, "SentencePiece's BPE with byte fallback")
        if not tokenizer.model.byte_fallback:
            raise ValueError(f"{source}: the BPE model has no byte fallback (Gemma's has)")
        super().__init__(tokenizer, source)
        layout = self._file_layout()
        if layout != ["<bos>", "A", "<eos>", "|", "<bos>", "A", "<eos>", "B", "<eos>"]:
            logging.warning(
                "%s lays rows out as %s; bert_jax feeds ModernBERT `<bos> A <eos>` and "
                "`<bos> A <eos> B <eos>` (config.json's cls_token_id and sep_token_id) and "
                "writes that template back",
                source,
                " ".join(layout),
            )
            tokenizer.post_processor = template(tokenizer)

    def _file_layout(self) -> list[str]:
        """The rows tokenizer.json's template makes of one text and of a pair, special tokens
        by name and the texts as "A" and "B": e.g. `<bos> A | <bos> A <bos> B` (Gemma's)."""
        ids = {}
        for name in ("A", "B"):
            ids[name] = self.tokenizer.encode(name, add_special_tokens=False).ids
        single = self.tokenizer.encode("A", add_special_tokens=True).ids
        pair = self.tokenizer.encode("A", "B", add_special_tokens=True).ids

        def spell(row: list[int]) -> list[str]:
            words = []
            for i in row:
                name = next((n for n, piece in ids.items() if i in piece), None)
                if name is None:
                    words.append(self.tokenizer.id_to_token(i))
                elif not words or words[-1] != name:
                    words.append(name)
            return words

        return [*spell(single), "|", *spell(pair)]

    def _word_normalizer(self) -> normalizers.Normalizer:
        """A space put before the word, then every space made "▁" (Gemma's normalizer)."""
        return normalizers.Sequence(
            [normalizers.Prepend(" "), normalizers.Replace(" ", WORD_START)]
        )


def template(tokenizer: Tokenizer) -> processors.TemplateProcessing:
    """ModernBERT's rows in Gemma's tokens: `<bos> $A <eos>`, `<bos> $A <eos> $B <eos>`."""
    return SentencePieceBPETokenizer.template_processing(tokenizer)


def sentencepiece_bpe_pipeline(tokenizer: Tokenizer) -> Tokenizer:
    """Sets Gemma's normalizer (spaces to "▁"), its splitting (none: its `Split` on spaces sees
    none left), decoder, special tokens and ModernBERT's rows."""
    tokenizer.normalizer = normalizers.Replace(" ", WORD_START)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(WORD_START, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    add_special_tokens(tokenizer, LEADING_SPECIAL_TOKENS)
    tokenizer.post_processor = template(tokenizer)
    return tokenizer


def train_sentencepiece_bpe(
    texts: Iterable[str], vocab_size: int = 8192, *, min_frequency: int = 2
) -> SentencePieceBPETokenizer:
    """Learns a BPE vocabulary with byte fallback laid out as Gemma's (mmBERT's kind).

    Pieces are learned within words ("▁" starts a word, as SentencePiece splits); the
    saved pipeline, as Gemma's, does not split, which gives the same pieces (no merge spans a
    word's end). Cased, no other normalization.

    Args:
      texts: the training text, any number of strings.
      vocab_size: the size of the vocabulary: the 5 special tokens, 256 byte tokens, and the
        learned pieces (more than 261).
      min_frequency: merges seen fewer times are not learned.

    Returns:
      The trained tokenizer (fewer tokens than `vocab_size` if the text has too few merges).
    """
    floor = len(LEADING_SPECIAL_TOKENS) + len(BYTE_TOKENS)
    if vocab_size <= floor:
        raise ValueError(
            f"vocab_size={vocab_size} leaves no room for pieces: 5 special tokens and 256 byte "
            f"tokens come first; use more than {floor}"
        )
    learner = Tokenizer(models.BPE())
    learner.normalizer = normalizers.Replace(" ", WORD_START)
    learner.pre_tokenizer = pre_tokenizers.Metaspace(WORD_START, prepend_scheme="never")
    trainer = tokenizer_trainers.BpeTrainer(
        vocab_size=vocab_size - floor, min_frequency=min_frequency, show_progress=False
    )
    learner.train_from_iterator(texts, trainer)
    state = json.loads(learner.to_str())["model"]
    vocab = {t: i for i, t in enumerate(LEADING_SPECIAL_TOKENS + BYTE_TOKENS)}
    for piece, _ in sorted(state["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    model = models.BPE(vocab, merges, unk_token=UNK, fuse_unk=True, byte_fallback=True)
    tokenizer = sentencepiece_bpe_pipeline(Tokenizer(model))
    return SentencePieceBPETokenizer(tokenizer, source=f"<trained BPE, {len(vocab)} tokens>")
