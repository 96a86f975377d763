"""SentencePiece Unigram tokenizers on Hugging Face `tokenizers`: XLM-RoBERTa's and DeBERTa-v3's.

    tok = tokenization.load_tokenizer("xlm-roberta-base/")   # its tokenizer.json
    tok.tokenize("Hello world")     # -> ["▁Hello", "▁world"]   (▁: a word's leading space)

Both families' tokenizers are a Unigram model over SentencePiece's pieces; they differ in where
the special tokens sit, how the text is normalized and split, and how rows are laid out. A
`Layout` holds those differences, and one pipeline (`unigram_tokenizer`) builds either, as
transformers 5 builds them (keeping of a tokenizer.json only its vocabulary, and for XLM-R its
precompiled character map):

  XLM_R       ids: fairseq's <s>=0 <pad>=1 </s>=2 <unk>=3, SentencePiece's pieces from its id 3
              on shifted up by one, <mask> last (transformers' `XLMRobertaTokenizerFast`);
              text: SentencePiece's character map, a whitespace split, "▁" before each word;
              rows: <s> A </s> and <s> A </s></s> B </s>, token types all 0.
  DEBERTA_V3  ids: its spm.model's [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3, the pieces, [MASK] last
              (transformers' `DebertaV2Tokenizer`); text: runs of whitespace and each \n \r \t
              made one space, NFC, the trailing space stripped, "▁" before each word (no
              character map); rows: [CLS] A [SEP] and [CLS] A [SEP] B [SEP], B's types 1.

`SentencePieceTokenizer` is XLM-R's; `DebertaV2Tokenizer` DeBERTa-v2/v3's (its tokenizer_config.json
`do_lower_case` and `split_by_punct`, both false in the released models, are honoured). A
tokenizer.json's layout is told by its special tokens. SentencePiece model files
(`sentencepiece.bpe.model`, DeBERTa's `spm.model`) are read only where the `sentencepiece`
package is installed (its protobuf schema); otherwise give the tokenizer.json.

`train_unigram(texts, vocab_size, layout=...)` learns a Unigram vocabulary (`tokenizers`' trainer,
not SentencePiece's) laid out as either family's, through the same pipeline.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
from collections.abc import Callable, Iterable, Sequence

from etils import epath
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import trainers as tokenizer_trainers

from bert_jax.tokenization.base import (
    FAIRSEQ_SPECIAL_TOKENS,
    SubwordTokenizer,
    add_special_tokens,
    require_model,
    rows_template,
    special_token_role,
)

BOS, PAD, EOS, UNK, MASK = FAIRSEQ_SPECIAL_TOKENS  # XLM-R's
WORD_START = "\u2581"  # "▁"
SENTENCEPIECE_MODEL = "sentencepiece.bpe.model"  # XLM-R's (despite its name a Unigram model)
DEBERTA_SPM_MODEL = "spm.model"  # DeBERTa-v2/v3's
_UNIGRAM = 1  # SentencePiece's TrainerSpec.model_type for Unigram


Pieces = list[tuple[str, float]]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a family lays out a SentencePiece Unigram vocabulary, its text pipeline and its rows.

    Attributes:
      name: the family's name in messages ("XLM-R").
      special_tokens: (pad, unk, cls, sep, mask), `SubwordTokenizer`'s order.
      spm_specials: the special pieces a SentencePiece model holds first, in its id order (the
        trainer's special tokens); `vocab_from_pieces` places the rest.
      vocab_from_pieces: SentencePiece's pieces (piece, log probability) by id -> the layout's
        vocabulary by id.
      separators_between_pairs / pair_token_types: the rows (`SubwordTokenizer`).
      mask_lstrip: the mask token takes the space before it (XLM-R's `<mask>`).
      tokenizer_class: the transformers class that reads the saved files.
      uses_charsmap: the normalizer is SentencePiece's precompiled character map (XLM-R); else
        the layout's own normalization (`normalizer`).
    """

    name: str
    special_tokens: tuple[str, str, str, str, str]
    spm_specials: tuple[str, ...]
    vocab_from_pieces: Callable[[Pieces], Pieces]
    separators_between_pairs: int
    pair_token_types: bool
    mask_lstrip: bool
    tokenizer_class: str
    uses_charsmap: bool

    unk = special_token_role("unk")
    cls = special_token_role("cls")
    sep = special_token_role("sep")
    mask = special_token_role("mask")


def fairseq_vocab(pieces: Pieces) -> Pieces:
    """XLM-R's vocabulary from SentencePiece's pieces (`<unk>`, `<s>`, `</s>`, then the rest):
    fairseq's `<s>`, `<pad>`, `</s>`, `<unk>`, the rest shifted up by one, `<mask>` last (as
    transformers' `XLMRobertaConverter` lays them out)."""
    return [(BOS, 0.0), (PAD, 0.0), (EOS, 0.0), (UNK, 0.0), *pieces[3:], (MASK, 0.0)]


def deberta_vocab(pieces: Pieces) -> Pieces:
    """DeBERTa's vocabulary from its spm.model's pieces ([PAD], [CLS], [SEP], [UNK], then the
    rest): the pieces as they are, [MASK] after them (transformers adds it there)."""
    pieces = [tuple(p) for p in pieces]
    return pieces if any(p == "[MASK]" for p, _ in pieces) else [*pieces, ("[MASK]", 0.0)]


XLM_R = Layout(
    name="XLM-R",
    special_tokens=(PAD, UNK, BOS, EOS, MASK),
    spm_specials=(UNK, BOS, EOS),  # SentencePiece's ids 0, 1, 2
    vocab_from_pieces=fairseq_vocab,
    separators_between_pairs=2,
    pair_token_types=False,
    mask_lstrip=True,
    tokenizer_class="XLMRobertaTokenizer",
    uses_charsmap=True,
)
DEBERTA_V3 = Layout(
    name="DeBERTa-v3",
    special_tokens=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
    spm_specials=("[PAD]", "[CLS]", "[SEP]", "[UNK]"),  # its spm.model's ids 0..3
    vocab_from_pieces=deberta_vocab,
    separators_between_pairs=1,
    pair_token_types=True,
    mask_lstrip=False,
    tokenizer_class="DebertaV2Tokenizer",
    uses_charsmap=False,
)
LAYOUTS = (XLM_R, DEBERTA_V3)


def _normalizer(
    layout: Layout, charsmap: bytes | None, lowercase: bool
) -> normalizers.Normalizer | None:
    """XLM-R: the precompiled character map (None: no normalization). DeBERTa (transformers 5's
    `DebertaV2Tokenizer`, which drops the map): optionally lower-cased, runs of whitespace and
    each \\n, \\r, \\t made one space, NFC, the trailing space stripped."""
    if layout.uses_charsmap:
        return normalizers.Precompiled(charsmap) if charsmap else None
    steps = [normalizers.Lowercase()] if lowercase else []
    steps += [
        normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "),
        normalizers.NFC(),
        normalizers.Strip(left=False, right=True),
    ]
    return normalizers.Sequence(steps)


def _words(layout: Layout = XLM_R, split_by_punct: bool = False) -> pre_tokenizers.PreTokenizer:
    """The word split: "▁" before each word, after a whitespace split (XLM-R) or, for DeBERTa,
    optionally after isolating punctuation."""
    metaspace = pre_tokenizers.Metaspace(replacement=WORD_START, prepend_scheme="always")
    if layout.uses_charsmap:
        return pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), metaspace])
    steps = [pre_tokenizers.Punctuation(behavior="isolated")] if split_by_punct else []
    return pre_tokenizers.Sequence([*steps, metaspace])


def unigram_tokenizer(
    vocab: Pieces,
    layout: Layout,
    precompiled_charsmap: bytes | None = None,
    *,
    lowercase: bool = False,
    split_by_punct: bool = False,
) -> Tokenizer:
    """The family's `tokenizers` pipeline over a Unigram vocabulary in its id order, built as
    transformers 5 builds it (from a tokenizer.json too: it keeps only the file's vocabulary and,
    for XLM-R, its character map).

    Args:
      vocab: (piece, log probability) by id, in the layout's order.
      layout: `XLM_R` or `DEBERTA_V3`.
      precompiled_charsmap: SentencePiece's normalization map (XLM-R; None: none).
      lowercase / split_by_punct: DeBERTa's `do_lower_case` and `split_by_punct`.

    Raises:
      MissingSpecialTokenError (from the wrapping tokenizer class): a special token is missing.
    """
    ids = {piece: i for i, (piece, _) in reversed(list(enumerate(vocab)))}
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=ids.get(layout.unk, 0), byte_fallback=False))
    normalizer = _normalizer(layout, precompiled_charsmap, lowercase)
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = _words(layout, split_by_punct)
    tokenizer.decoder = decoders.Metaspace(replacement=WORD_START, prepend_scheme="always")
    specials = {*layout.spm_specials, *layout.special_tokens} - {layout.mask}
    by_id = sorted(specials, key=lambda t: ids.get(t, len(vocab)))
    lstrip = {layout.mask} if layout.mask_lstrip else set()
    add_special_tokens(tokenizer, [*by_id, layout.mask], lstrip)
    cls, sep = layout.cls, layout.sep
    tokenizer.post_processor = rows_template(
        (cls, ids.get(cls, 0)),
        (sep, ids.get(sep, 0)),
        layout.separators_between_pairs,
        layout.pair_token_types,
    )
    return tokenizer


def xlm_roberta_tokenizer(vocab: Pieces, precompiled_charsmap: bytes | None = None) -> Tokenizer:
    """XLM-R's pipeline (`unigram_tokenizer` with `XLM_R`): the precompiled character map,
    whitespace split, "▁" before each word, `<unk>` = 3, `<mask>` taking the space before it.

    Args:
      vocab: (piece, log probability) by id: `<s>`, `<pad>`, `</s>`, `<unk>`, ..., `<mask>`.
      precompiled_charsmap: SentencePiece's normalization map (None: no normalization).
    """
    return unigram_tokenizer(vocab, XLM_R, precompiled_charsmap)


def _laid_out(tokenizer_class: type[SentencePieceTokenizer]) -> type[SentencePieceTokenizer]:
    """Class decorator: sets the class's special tokens, rows, mask token and transformers class
    from its `layout`; returns the class."""
    layout = tokenizer_class.layout
    tokenizer_class.tokenizer_class = layout.tokenizer_class
    tokenizer_class.special_tokens = layout.special_tokens
    tokenizer_class.separators_between_pairs = layout.separators_between_pairs
    tokenizer_class.pair_token_types = layout.pair_token_types
    tokenizer_class.mask_lstrip = layout.mask_lstrip
    return tokenizer_class


@_laid_out
class SentencePieceTokenizer(SubwordTokenizer):
    """A `tokenizers.Tokenizer` with a Unigram model and a family's special tokens: XLM-R's
    (`layout`; `DebertaV2Tokenizer` is DeBERTa's). Pieces that do not start a word (no leading
    "▁") continue one."""

    kind = "unigram"
    layout: Layout = XLM_R
    word_start = WORD_START

    def __init__(self, tokenizer: Tokenizer, source: str = "<tokenizer>"):
        """Wraps `tokenizer`, checking that it is Unigram with the layout's special tokens.

        Raises:
          ValueError: the model is not Unigram, or the ids are not contiguous.
          MissingSpecialTokenError: a special token is missing; the message names each.
        """
        require_model(tokenizer, source, models.Unigram, f"SentencePiece ({self.layout.name})")
        super().__init__(tokenizer, source)

    def _config_fields(self) -> dict:
        """`XLMRobertaTokenizer`'s own fields: <s> and </s> as bos/eos."""
        return {"bos_token": BOS, "eos_token": EOS}


@_laid_out
class DebertaV2Tokenizer(SentencePieceTokenizer):
    """DeBERTa-v2/v3's SentencePiece tokenizer (`DEBERTA_V3`): [PAD]=0, [CLS]=1, [SEP]=2,
    [UNK]=3, [MASK] last; rows `[CLS] A [SEP]` and `[CLS] A [SEP] B [SEP]`, B's token type 1;
    equal to transformers' `DebertaV2Tokenizer` (its fast tokenizer) for the same vocabulary."""

    layout = DEBERTA_V3

    def __init__(self, tokenizer: Tokenizer, source: str = "<tokenizer>"):
        super().__init__(tokenizer, source)
        state = json.loads(tokenizer.to_str())
        self.lowercase = "Lowercase" in json.dumps(state.get("normalizer"))
        self.split_by_punct = "Punctuation" in json.dumps(state.get("pre_tokenizer"))

    def _config_fields(self) -> dict:
        """`DebertaV2Tokenizer`'s own fields: [CLS] and [SEP] as bos/eos, its two options."""
        return {
            "bos_token": self.layout.cls,
            "eos_token": self.layout.sep,
            "do_lower_case": self.lowercase,
            "split_by_punct": self.split_by_punct,
        }


TOKENIZER_CLASSES: dict[str, type[SentencePieceTokenizer]] = {
    XLM_R.name: SentencePieceTokenizer,
    DEBERTA_V3.name: DebertaV2Tokenizer,
}


def layout_of(pieces: Sequence[str]) -> Layout:
    """The layout whose special tokens the vocabulary `pieces` holds: XLM-R's where it has all of
    them, else DeBERTa's where it has all of its own; failing both, the one whose row tokens it
    has (the tokenizer class then names what is missing)."""
    have = set(pieces)
    for layout in (XLM_R, DEBERTA_V3):
        if set(layout.special_tokens) <= have:
            return layout
    return DEBERTA_V3 if {DEBERTA_V3.cls, DEBERTA_V3.sep} <= have else XLM_R


def _options_beside(file: epath.Path) -> dict:
    """DeBERTa's tokenizer_config.json options beside `file` (do_lower_case, split_by_punct)."""
    config = file.parent / "tokenizer_config.json"
    if not config.is_file():
        return {}
    try:
        d = json.loads(config.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return {}
    return {
        "lowercase": bool(d.get("do_lower_case", False)),
        "split_by_punct": bool(d.get("split_by_punct", False)),
    }


def _wrap(vocab: Pieces, layout: Layout, charsmap, source: str, options: dict):
    """The layout's tokenizer class around its pipeline over `vocab`."""
    options = options if not layout.uses_charsmap else {}
    tokenizer = unigram_tokenizer(vocab, layout, charsmap, **options)
    return TOKENIZER_CLASSES[layout.name](tokenizer, source=source)


def from_tokenizer_json(file: epath.Path) -> SentencePieceTokenizer:
    """XLM-R's or DeBERTa's tokenizer (told by its special tokens) from a Unigram tokenizer.json,
    read as transformers 5 reads it: its vocabulary (and XLM-R's precompiled character map; for
    DeBERTa the options of a tokenizer_config.json beside it), the family's pipeline around them."""
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
    layout = layout_of([p for p, _ in vocab])
    return _wrap(vocab, layout, charsmap, os.fspath(file), _options_beside(file))


def load_sentencepiece_model(file: epath.Path) -> SentencePieceTokenizer:
    """XLM-R's tokenizer from its `sentencepiece.bpe.model`, or DeBERTa's from its `spm.model`
    (told by the pieces), both SentencePiece Unigram models.

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
        raise ValueError(f"{path} is not a SentencePiece Unigram model (XLM-R's or DeBERTa's)")
    pieces = [(p.piece, p.score) for p in proto.pieces]
    layout = layout_of([p for p, _ in pieces])
    charsmap = proto.normalizer_spec.precompiled_charsmap
    return _wrap(layout.vocab_from_pieces(pieces), layout, charsmap, path, _options_beside(file))


def train_unigram(
    texts: Iterable[str],
    vocab_size: int = 8192,
    *,
    layout: Layout = XLM_R,
    show_progress: bool = False,
) -> SentencePieceTokenizer:
    """Learns a Unigram vocabulary (XLM-R's kind, or DeBERTa-v3's) with `tokenizers`' trainer.

    The texts are split as the layout's pipeline splits them (and for DeBERTa normalized) and the
    pieces ordered as SentencePiece does (the layout's SentencePiece specials first, then the
    pieces by probability); the layout then places them: XLM-R's `<s>`=0, `<pad>`=1, `</s>`=2,
    `<unk>`=3, the learned pieces, `<mask>` last; DeBERTa's [PAD]=0, [CLS]=1, [SEP]=2, [UNK]=3,
    the learned pieces, [MASK] last (id `vocab_size - 1` in both). Cased, no precompiled
    character map (`tokenizers` cannot make one). Not exactly reproducible across processes: on
    the plays two trainings learned the same pieces, but their scores differed in the last
    digits (up to 1e-3 for the rarest characters) and pieces of equal score came in another
    order, so ids can differ; keep the trained files (a build does).

    Args:
      texts: the training text, any number of strings (lines or documents).
      vocab_size: the size of the vocabulary, special tokens included.
      layout: `XLM_R` (default) or `DEBERTA_V3`.
      show_progress: the trainer's progress bar.

    Returns:
      The trained tokenizer (fewer pieces than `vocab_size` if the text has too few): a
      `SentencePieceTokenizer`, a `DebertaV2Tokenizer` for DeBERTa's layout.
    """
    added = len(set(layout.special_tokens) - set(layout.spm_specials))  # placed after training
    if vocab_size <= len(set(layout.special_tokens)):
        raise ValueError(
            f"vocab_size={vocab_size}: {layout.name}'s layout alone has "
            f"{len(set(layout.special_tokens))} special tokens"
        )
    spm = Tokenizer(models.Unigram())
    normalizer = _normalizer(layout, None, lowercase=False)
    if normalizer is not None:
        spm.normalizer = normalizer
    spm.pre_tokenizer = _words(layout)
    trainer = tokenizer_trainers.UnigramTrainer(
        vocab_size=vocab_size - added,  # the layout's own specials come after
        special_tokens=list(layout.spm_specials),
        unk_token=layout.unk,
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
    vocab = layout.vocab_from_pieces(pieces)
    source = f"<trained Unigram ({layout.name}), {len(vocab)} pieces>"
    return _wrap(vocab, layout, None, source, {})
