"""Every model family's test fixture: a tiny config with odd sizes, a tokenizer of the family's
kind trained on a little text, and a directory holding both as transformers saves them.

`FIXTURES` holds one row per family of `bert_jax.models.families.FAMILIES` (by model_type): the
config fields its tiny model sets beyond the shared `SIZES`, and how to train its tokenizer. A
new family adds its row here and edits no test: tests/conformance_test.py runs every job and
command on every row of the registry, and names a family that has no row here.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import pytest
from flax import linen as nn

from bert_jax import convert, tokenization
from bert_jax.models import families
from bert_jax.models.params import init_params
from bert_jax.tokenization import unigram
from bert_jax.training import objectives

TESTS = pathlib.Path(__file__).resolve().parent
# Odd, distinct sizes (a swapped axis cannot pass), shared by every family; 66 position rows
# hold RoBERTa's 64 positions (its pad id + 1 first), more than the 32-token rows of the jobs.
# A wide initialization, so that the context (not near-ties) decides top tokens and labels.
SIZES = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=66,
    initializer_range=0.2,
)
VOCAB_SIZE = 399  # or fewer, where the text has fewer pieces


def wordpiece(texts: Sequence[str]) -> tokenization.SubwordTokenizer:
    return tokenization.train_wordpiece(texts, vocab_size=VOCAB_SIZE, min_frequency=1)


def byte_level_bpe(texts: Sequence[str]) -> tokenization.SubwordTokenizer:
    return tokenization.train_byte_level_bpe(texts, vocab_size=VOCAB_SIZE, min_frequency=1)


def llama3_bpe(texts: Sequence[str]) -> tokenization.SubwordTokenizer:
    """EuroBERT's kind: byte-level BPE split as Llama-3's, its special tokens last."""
    return tokenization.train_llama3_bpe(texts, vocab_size=VOCAB_SIZE, min_frequency=1)


def mpnet_wordpiece(texts: Sequence[str]) -> tokenization.SubwordTokenizer:
    """MPNet's kind: WordPiece with <s>=0 <pad>=1 </s>=2 [UNK]=3, the pieces, <mask> last."""
    return tokenization.train_mpnet_wordpiece(texts, vocab_size=VOCAB_SIZE, min_frequency=1)


def sentencepiece_unigram(texts: Sequence[str]) -> tokenization.SubwordTokenizer:
    """XLM-R's kind: a Unigram model trained as SentencePiece orders it, in fairseq's ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    spm = Tokenizer(models.Unigram())
    spm.pre_tokenizer = pre_tokenizers.Metaspace()
    special = ["<unk>", "<s>", "</s>"]
    spm.train_from_iterator(
        texts,
        trainers.UnigramTrainer(vocab_size=VOCAB_SIZE, special_tokens=special, unk_token="<unk>"),
    )
    pieces = [tuple(p) for p in json.loads(spm.to_str())["model"]["vocab"]]
    vocab = unigram.fairseq_vocab(pieces)
    return tokenization.SentencePieceTokenizer(unigram.xlm_roberta_tokenizer(vocab))


def deberta_unigram(texts: Sequence[str]) -> tokenization.SubwordTokenizer:
    """DeBERTa-v3's kind: a Unigram model laid out as its spm.model ([PAD], [CLS], [SEP], [UNK],
    the pieces, [MASK])."""
    return tokenization.train_unigram(texts, vocab_size=VOCAB_SIZE, layout=unigram.DEBERTA_V3)


@dataclasses.dataclass(frozen=True)
class FamilyFixture:
    """A family's row: `fields` of its tiny config beyond `SIZES`, vocab_size and pad_token_id
    (the tokenizer's), and `train_tokenizer`: texts -> a tokenizer of the family's kind."""

    fields: Mapping[str, Any]
    train_tokenizer: Callable[[Sequence[str]], tokenization.SubwordTokenizer]


FIXTURES: dict[str, FamilyFixture] = {
    "bert": FamilyFixture(dict(type_vocab_size=3), wordpiece),
    # DeBERTa-v3's settings, its 256 log buckets made 8 (distances past 4 share buckets, up to
    # the 66 positions), a pooler activation other than the layers'.
    "deberta-v2": FamilyFixture(
        dict(
            relative_attention=True,
            max_relative_positions=-1,
            position_buckets=8,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            pos_att_type=("p2c", "c2p"),
            position_biased_input=False,
            type_vocab_size=0,
            layer_norm_eps=1e-7,
            hidden_act="gelu_new",
            pooler_hidden_act="gelu",
        ),
        deberta_unigram,
    ),
    # 4 query heads on 2 key/value heads, heads of 16 (not 32 / 4), an untied MLM head, late
    # pooling (tests/models/eurobert_test.py has the rotary variants); Llama-3's kind of
    # byte-level BPE.
    "eurobert": FamilyFixture(
        dict(
            num_key_value_heads=2,
            head_size=16,
            rope_parameters=dict(rope_theta=500.0),
            rms_norm_eps=1e-6,
        ),
        llama3_bpe,
    ),
    # Embeddings narrower than the layers (24 < 32): `embeddings_project` in every model.
    "electra": FamilyFixture(dict(embedding_size=24, type_vocab_size=3), wordpiece),
    # Two token types and a rotary theta of its own (the released model's: one, 20,000);
    # XLM-R's kind of tokenizer.
    "jina_embeddings_v3": FamilyFixture(
        dict(type_vocab_size=2, layer_norm_eps=1e-5, rope=dict(rope_theta=77.0)),
        sentencepiece_unigram,
    ),
    # Layer 0 attends globally, layer 1 in a window of 4 keys (shorter than the rows); every
    # bias on (the released models have none, which would hide a swapped or missing one).
    "modernbert": FamilyFixture(
        dict(
            global_attn_every_n_layers=2,
            local_attention=4,
            global_rope_theta=1000.0,
            local_rope_theta=77.0,
            norm_bias=True,
            attention_bias=True,
            mlp_bias=True,
            classifier_bias=True,
        ),
        wordpiece,
    ),
    # gte-base-en-v1.5's layout: WordPiece, no token-type table; a rotary theta of its own
    # (tests/models/gte_test.py has token types and the scaled variants).
    "gte": FamilyFixture(dict(type_vocab_size=0, rope=dict(rope_theta=77.0)), wordpiece),
    # LayerNorm eps 1e-5 as released; a bias table with more rows than the 32 buckets read.
    "mpnet": FamilyFixture(
        dict(layer_norm_eps=1e-5, relative_attention_num_buckets=37), mpnet_wordpiece
    ),
    # Three token types and a rotary theta of its own (the released model's is 1000).
    "nomic_bert": FamilyFixture(dict(type_vocab_size=3, rope=dict(rope_theta=77.0)), wordpiece),
    # As released: one token type, LayerNorm eps 1e-5.
    "roberta": FamilyFixture(dict(type_vocab_size=1, layer_norm_eps=1e-5), byte_level_bpe),
    "xlm-roberta": FamilyFixture(
        dict(type_vocab_size=1, layer_norm_eps=1e-5), sentencepiece_unigram
    ),
}


EXCERPT = TESTS / "pretrain" / "testdata" / "shakespeare_excerpt.txt"


def documents() -> list[list[str]]:
    """The Shakespeare excerpt's documents (blank-line separated), one sentence a line."""
    text = EXCERPT.read_text(encoding="utf-8")
    return [d.splitlines() for d in text.split("\n\n") if d.strip()]


def training_texts() -> list[str]:
    """The text every fixture tokenizer learns: the Shakespeare excerpt, the words of the
    jobs' generated test data and the fine-tuning test files' sentences (their words then have
    pieces of their own)."""
    from tests.embed.embed_test import WORDS as EMBED_WORDS
    from tests.finetune.run_test import NAMES, WORDS

    lines = EXCERPT.read_text(encoding="utf-8").splitlines()
    words = [*WORDS, *NAMES, *EMBED_WORDS, "good", "bad", "what", "who", "is", "the", "answer"]
    lines += [" ".join(words)] * 3
    data = TESTS / "finetune" / "testdata"
    for path in (*data.glob("glue/*/*.tsv"), *data.glob("*.csv"), data / "conll_tiny.txt"):
        lines += path.read_text(encoding="utf-8").splitlines()
    squad = json.loads((data / "squad_v2_tiny.json").read_text(encoding="utf-8"))
    for article in squad["data"]:
        for paragraph in article["paragraphs"]:
            lines.append(paragraph["context"])
            lines += [qa["question"] for qa in paragraph["qas"]]
    return [line for line in lines if line.strip()]


def load_config(name: str, variant: str):
    """`configs/<name>`'s config for `variant` ("pretrain.py", "arch=roberta")."""
    from tests.common import load_config_file

    return load_config_file(name).get_config(variant)


def family_params(e2e: Sequence[str] = (), full: Sequence[str] = ()) -> list:
    """Every registered family as a pytest parameter: those in `e2e` marked for the e2e stage
    (-m e2e, which CI runs), those in `full` for -m full only (`make test-full`), the rest in the
    default stage. Each use says where CI runs the code of the families it leaves out of it."""
    assert not set(e2e) & set(full) and {*e2e, *full} <= set(families.FAMILIES), (e2e, full)
    marks = {**dict.fromkeys(e2e, pytest.mark.e2e), **dict.fromkeys(full, pytest.mark.full)}
    return [pytest.param(f, marks=marks[f]) if f in marks else f for f in families.FAMILIES]


def fixture_of(model_type: str) -> FamilyFixture:
    if model_type not in FIXTURES:
        raise KeyError(
            f"model family {model_type!r} has no test fixture: add its row to "
            "tests/family_fixtures.py FIXTURES (its tiny config fields and tokenizer)"
        )
    return FIXTURES[model_type]


def tiny_config(model_type: str, tokenizer: tokenization.SubwordTokenizer, **fields):
    """The family's tiny config for `tokenizer`'s vocabulary (and `fields`)."""
    family = families.FAMILIES[model_type]
    return family.config_class(
        **SIZES,
        **fixture_of(model_type).fields,
        vocab_size=tokenizer.vocab_size,
        pad_token_id=tokenizer.pad_id,
        **fields,
    )


def objective_role(objective: str) -> families.Role:
    """The role of the head `objective` trains (a family may lack it: EuroBERT's QA)."""
    return objectives.get_objective(objective).role


def head_of(config, objective: str) -> str:
    """The config's family's class for the head `objective` trains ("mlm": its masked LM)."""
    return families.head_in_family(config, objectives.get_objective(objective).role)


@dataclasses.dataclass
class FamilyDir:
    """A family's fixture: its tiny config, tokenizer, and `path`, a directory holding its
    randomly initialized masked LM (`head`, `params`) and tokenizer as transformers saves them."""

    model_type: str
    config: Any
    tokenizer: tokenization.SubwordTokenizer
    head: str
    params: Any
    path: pathlib.Path

    @property
    def family(self) -> families.Family:
        return families.FAMILIES[self.model_type]


def random_params(config, head: str, seed: int = 0):
    """The host parameters of a randomly initialized `head` of `config`."""
    model = families.get_model_class(head)(config)
    return jax.device_get(nn.meta.unbox(init_params(model, jax.random.PRNGKey(seed))))


def save_model(config, tokenizer, head: str, out: pathlib.Path, seed: int = 0):
    """A randomly initialized `head` of `config`, saved to `out` with `tokenizer`; its params."""
    params = random_params(config, head, seed)
    convert.save_pytorch(config, params, out, head)
    tokenizer.save(out)
    return params


def save_drawn_model(config, tokenizer, head: str, out: pathlib.Path, seed: int = 0) -> None:
    """`head` of `config` saved to `out` with `tokenizer`, every weight drawn from N(0, 0.02) by
    numpy in the shapes the model's init gives (traced, not run: a second, where `save_model`'s
    initialization runs op by op), for tests that read the files but not their numbers."""
    model = families.get_model_class(head)(config)
    shapes = nn.meta.unbox(jax.eval_shape(lambda: init_params(model, jax.random.PRNGKey(seed))))
    rng = np.random.default_rng(seed)
    params = jax.tree_util.tree_map(lambda s: rng.normal(0, 0.02, s.shape).astype(s.dtype), shapes)
    convert.save_pytorch(config, params, out, head)
    tokenizer.save(out)


def make_family_dir(model_type: str, out: pathlib.Path) -> FamilyDir:
    """The family's fixture directory in `out` (its masked LM and tokenizer)."""
    tokenizer = fixture_of(model_type).train_tokenizer(training_texts())
    config = tiny_config(model_type, tokenizer)
    head = head_of(config, "mlm")
    params = save_model(config, tokenizer, head, out)
    return FamilyDir(model_type, config, tokenizer, head, params, out)


def transformers_model(config, head: str, seed: int = 0):
    """transformers' class `head` (the same name) on `config`'s config.json, eager attention,
    every weight perturbed (norm scales and zero biases too, so none can hide)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    fields = {k: v for k, v in config.to_hf_dict(head).items() if k != "model_type"}
    hf_config = transformers.AutoConfig.for_model(config.model_type, **fields)
    hf_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, head)(hf_config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model
