"""Every export works for every family: a tiny random masked LM of each registered family (with
its family's kind of tokenizer, trained here) exported as a sentence-transformers directory, as a
run's `hf/`, converted both ways and asked to fill in its mask token; each read back by the
library users read it with (sentence-transformers, transformers' Auto classes) within 1e-5 of
bert_jax. The files a tokenizer owns are the tokenizer's: tokenizer_config.json names its own
class and special tokens.

The run directory `training.export.export` writes (export/ and hf/, no checkpoints/) is what a
finished fine-tuning run leaves (`finetune.run` removes a seed's checkpoints once it exports)."""

import inspect
import json
import re

import flax.linen as nn
import jax
import numpy as np
import pytest

import bert_jax
from bert_jax import convert, tokenization
from bert_jax.checkpoints.sentence_transformers import (
    check_settings,
    read_sentence_transformer,
    save_sentence_transformer,
)
from bert_jax.inference import fill_mask, loading
from bert_jax.inference.__main__ import main as inference_main
from bert_jax.models import families
from bert_jax.models.params import init_params
from bert_jax.pretrain.data import default_corpus, sources
from bert_jax.pretrain.fill_mask_demo import masked_examples
from bert_jax.tokenization import unigram
from bert_jax.training import export as training_export
from tests import family_fixtures
from tests.common import MODERN, TINY

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
st_lib = pytest.importorskip("sentence_transformers")
pytestmark = pytest.mark.torch

TEXTS = [
    "Fair is foul, and foul is fair: hover through the fog and filthy air.",
    "To be, or not to be",
    "O",
    "Now is the winter of our discontent made glorious summer by this sun of York.",
]
# 42 position rows: 40 tokens for RoBERTa's and XLM-R's (2 rows no token reads), 42 for others.
POSITIONS = 42
# The odd tiny configurations; a family added later starts from its own "tiny" preset.
CONFIGS = {
    "bert": TINY,
    "modernbert": MODERN,
    "roberta": families.FAMILIES["roberta"].config_class(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, type_vocab_size=2, hidden_act="gelu_new",
    ),
}  # fmt: skip


def _lines() -> list[str]:
    stats = sources.SourceStats()
    return [
        s
        for s in default_corpus.default_corpus_document(
            default_corpus.default_corpus_files()[0], stats
        )
    ]


def _unigram(lines):
    """XLM-R's kind: a Unigram model trained as SentencePiece orders it, in fairseq's ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    spm = Tokenizer(models.Unigram())
    spm.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>"
    )
    spm.train_from_iterator(lines, trainer)
    pieces = [tuple(p) for p in json.loads(spm.to_str())["model"]["vocab"]]
    return tokenization.SentencePieceTokenizer(
        unigram.xlm_roberta_tokenizer(unigram.fairseq_vocab(pieces))
    )


# The tokenizer kind of each family (WordPiece where none is named).
TOKENIZERS = {
    "roberta": lambda lines: tokenization.train_byte_level_bpe(lines, vocab_size=300),
    "xlm-roberta": _unigram,
    "jina_embeddings_v3": _unigram,
}


def _config(model_type: str, tokenizer):
    """The family's odd tiny configuration (XLM-R: RoBERTa's fields, one token type; a family
    added later: its "tiny" preset) sized for `tokenizer`."""
    config_class = families.FAMILIES[model_type].config_class
    base = CONFIGS.get(model_type)
    if base is None and issubclass(config_class, type(CONFIGS["roberta"])):
        base = config_class(**{**vars(CONFIGS["roberta"]), "type_vocab_size": 1})
    base = base or config_class.preset("tiny")
    return base.replace(
        vocab_size=tokenizer.vocab_size,
        pad_token_id=tokenizer.pad_id,
        max_position_embeddings=POSITIONS,
    )


class Exported:
    """One family's tiny masked LM, its tokenizer and what it was exported as."""

    def __init__(self, model_type: str, lines, root):
        self.family = families.FAMILIES[model_type]
        self.tokenizer = TOKENIZERS.get(model_type, _wordpiece)(lines)
        self.config = _config(model_type, self.tokenizer)
        self.head = self.family.head_for(families.Role.MASKED_LM)
        self.model = families.get_model_class(self.head)(self.config)
        self.params = _random_params(self.model, seed=len(model_type))
        # The bare encoder (with its pooler, where the family has one): what an embedder holds.
        self.encoder_params = _random_params(
            families.get_model_class(self.family.base_model)(self.config), seed=1
        )
        self.run = root / "run"
        training_export.export(
            self.params, str(self.run), self.config, self.head, tokenizer=self.tokenizer
        )
        # Embedders: mean pooled and normalized over every position; CLS pooled as it is, texts
        # cut to 17 tokens.
        self.st_dirs = {}
        for pooling, normalize, length in (
            ("mean", True, self.config.max_sequence_length),
            ("cls", False, 17),
        ):
            out = root / f"st_{pooling}"
            save_sentence_transformer(
                out, self.config, self.encoder_params, tokenizer_dir=self.tokenizer,
                pooling=pooling, normalize=normalize, max_seq_length=length,
            )  # fmt: skip
            self.st_dirs[pooling] = out
        self._st_embeddings = {}

    def st_embeddings(self, pooling: str) -> np.ndarray:
        """`SentenceTransformer(self.st_dirs[pooling]).encode(TEXTS)`, computed once."""
        if pooling not in self._st_embeddings:
            self._st_embeddings[pooling] = _st_encode(self.st_dirs[pooling])
        return self._st_embeddings[pooling]


def _random_params(model, seed: int) -> dict:
    """`model`'s initial parameters, each moved off its starting value (biases off 0, norms off
    1) so that a parameter read as another cannot pass."""
    params = nn.meta.unbox(init_params(model, jax.random.PRNGKey(seed)))
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda x: (np.asarray(x) + 0.05 * rng.standard_normal(x.shape)).astype(np.float32), params
    )


def _wordpiece(lines):
    return tokenization.train_wordpiece(lines, vocab_size=300, min_frequency=1)


@pytest.fixture(scope="module")
def lines():
    return _lines()


# The families added last are out of the default stage, for the suite's time (about a minute
# each on 2 cores): the conformance suite's e2e stage also exports their embedding job to
# sentence-transformers. GTE's and Jina-v3's run in CI's e2e stage; the others' with -m full
# (`make test-full`): NomicBERT's export is GTE's kind, EuroBERT's ModernBERT's, MPNet's
# RoBERTa's tokenizer.
@pytest.fixture(
    scope="module",
    params=family_fixtures.family_params(
        e2e=("gte", "jina_embeddings_v3"), full=("nomic_bert", "eurobert", "mpnet")
    ),
)
def exported(request, lines, tmp_path_factory):
    return Exported(request.param, lines, tmp_path_factory.mktemp(request.param))


def _embed_cli(model_dir, tmp_path) -> np.ndarray:
    """`python -m bert_jax.inference embed --model model_dir` of TEXTS."""
    texts, out = tmp_path / "texts.txt", tmp_path / "emb.npy"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    argv = ["embed", "--model", str(model_dir), "--input", str(texts), "--output", str(out)]
    assert inference_main(argv) == 0
    return np.load(out)


def _st_encode(model_dir) -> np.ndarray:
    return st_lib.SentenceTransformer(str(model_dir), device="cpu").encode(TEXTS)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_sentence_transformer_of_every_family(exported, tmp_path, pooling):
    """Bug: RoBERTa's and XLM-R's directories held a BertTokenizer tokenizer_config.json beside
    their tokenizer.json ("WordPiece error: Missing [UNK] token" in sentence-transformers)."""
    out = exported.st_dirs[pooling]
    settings = read_sentence_transformer(out)
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizer_config == exported.tokenizer.tokenizer_config(settings.max_seq_length)
    assert tokenizer_config["tokenizer_class"] == exported.tokenizer.tokenizer_class
    theirs = exported.st_embeddings(pooling)
    np.testing.assert_allclose(_embed_cli(out, tmp_path), theirs, atol=1e-5)
    norms = np.linalg.norm(theirs, axis=-1)
    assert np.allclose(norms, 1.0, atol=1e-5) == settings.normalize


def test_max_seq_length_is_at_most_the_usable_positions(exported):
    """Bug: the check allowed max_position_embeddings (RoBERTa's 2 unread rows too)."""
    limit = exported.config.max_sequence_length
    check_settings(exported.config, "mean", limit)
    with pytest.raises(ValueError, match=f"outside \\[2, {limit}\\]"):
        check_settings(exported.config, "mean", limit + 1)


def _hf_inputs(model, encoded) -> dict:
    """The tokenizer's outputs the transformers model's forward takes."""
    accepted = inspect.signature(model.forward).parameters
    return {k: torch.as_tensor(v) for k, v in encoded.items() if k in accepted}


def test_run_hf_dir_reads_in_transformers(exported):
    """Bug: ModernBERT's hf/ had no tokenizer_config.json: AutoTokenizer had no pad token.
    Bug: a tiny recipe's config.json kept its family's released special-token ids (EuroBERT's
    128000..128002, ModernBERT's 50281..) beside a vocabulary of 8,192, which transformers warns
    of; they are the tokenizer's now."""
    hf_dir = exported.run / "hf"
    written = json.loads((hf_dir / "config.json").read_text())
    for name, role in training_export.SPECIAL_ID_ROLES.items():
        if written.get(name) is not None:
            assert 0 <= written[name] < written["vocab_size"], (name, written[name])
            if getattr(exported.config, name) >= exported.config.vocab_size:
                assert written[name] == getattr(exported.tokenizer, role), name
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    # Padded, and truncated to the model_max_length its tokenizer_config.json gives.
    encoded = tokenizer(TEXTS, padding=True, truncation=True, return_tensors="np")
    assert encoded["input_ids"].shape[1] <= exported.config.max_sequence_length
    second = exported.tokenizer.build_inputs(exported.tokenizer.encode(TEXTS[1]))[0]
    real = encoded["attention_mask"][1].astype(bool)
    assert encoded["input_ids"][1][real].tolist() == second
    model = transformers.AutoModelForMaskedLM.from_pretrained(str(hf_dir)).eval()
    with torch.no_grad():
        theirs = model(**_hf_inputs(model, encoded)).logits.numpy()
    types = encoded.get("token_type_ids", np.zeros_like(encoded["input_ids"]))
    ours = exported.model.apply(
        {"params": exported.params},
        encoded["input_ids"],
        attention_mask=encoded["attention_mask"],
        **loading.token_type_inputs(exported.model, types),
    ).logits
    mask = encoded["attention_mask"].astype(bool)
    np.testing.assert_allclose(np.asarray(ours)[mask], theirs[mask], atol=1e-5)


def test_convert_reads_a_finished_run_and_carries_the_tokenizer(exported, tmp_path):
    """Bugs: `convert RUN` refused a run holding export/ and no checkpoints/ (inference reads
    it), and convert wrote no tokenizer in either direction."""
    fingerprint = exported.tokenizer.fingerprint()
    to_hf, to_jax, back = tmp_path / "hf", tmp_path / "jax", tmp_path / "back"
    assert convert.main([str(exported.run), str(to_hf)]) == 0
    assert convert.main([str(to_hf), str(to_jax)]) == 0
    assert convert.main([str(to_jax), str(back)]) == 0
    for out in (to_hf, to_jax, back):
        assert tokenization.load_tokenizer(out).fingerprint() == fingerprint, out
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(back))
    assert tokenizer.pad_token_id == exported.tokenizer.pad_id
    assert tokenizer.mask_token == exported.tokenizer.mask_token


def test_a_run_of_several_seeds_names_its_seed_folders(exported, tmp_path, capsys):
    """A multi-seed fine-tuning workdir holds one model per seed_<n>/: convert and inference
    say which to name, in one error line, instead of "no recognizable checkpoint"."""
    import shutil

    run = tmp_path / "run"
    for seed in (0, 1):
        shutil.copytree(exported.run, run / f"seed_{seed}")
    (run / "results.json").write_text("{}")
    assert convert.main([str(run), str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert "run of 2 seeds" in error and str(run / "seed_1") in error, error
    assert convert.main([str(run / "seed_1"), str(tmp_path / "out")]) == 0


def test_convert_carries_a_sentence_transformer_both_ways(exported, tmp_path):
    """Bug: convert dropped the sentence-transformers modules (pooling, normalization) and the
    tokenizer: bert_jax's directory embedded otherwise, the one converted back did not load."""
    source = exported.st_dirs["cls"]
    to_jax, back = tmp_path / "jax", tmp_path / "back"
    assert convert.main([str(source), str(to_jax)]) == 0
    assert convert.main([str(to_jax), str(back)]) == 0
    settings = read_sentence_transformer(source)
    assert read_sentence_transformer(to_jax) == read_sentence_transformer(back) == settings
    theirs = exported.st_embeddings("cls")
    np.testing.assert_allclose(_st_encode(back), theirs, atol=1e-5)
    np.testing.assert_allclose(_embed_cli(to_jax, tmp_path), theirs, atol=1e-5)


def test_minilm_converted_and_back_embeds_as_before(bert_vocab_dir, tmp_path):
    """all-MiniLM-L6-v2 to bert_jax's format and back: its tokenizer and its normalization kept."""
    to_jax, back = tmp_path / "jax", tmp_path / "back"
    assert convert.main([bert_vocab_dir, str(to_jax)]) == 0
    assert convert.main([str(to_jax), str(back)]) == 0
    theirs = _st_encode(bert_vocab_dir)
    np.testing.assert_allclose(_st_encode(back), theirs, atol=1e-5)
    np.testing.assert_allclose(_embed_cli(to_jax, tmp_path), theirs, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(theirs, axis=-1), 1.0, atol=1e-5)


def test_fill_mask_with_the_family_mask_token_gives_text(exported, capsys):
    """Bug: fill-mask asked for "[MASK]" (RoBERTa's is "<mask>") and printed pieces ("Ġless")."""
    tokenizer = exported.tokenizer
    text = f"To be, or not to {tokenizer.mask_token}, that is the question"
    (guesses,) = fill_mask(exported.config, exported.params, tokenizer, [text], top_k=7)[0]
    for guess in guesses:
        decoded = tokenizer.decode([guess["token_id"]]).strip()
        assert guess["text"] == (decoded or guess["token"])
        assert guess["token"] == tokenizer.id_to_token(guess["token_id"])
    # "[MASK]" stands for the tokenizer's own token where its vocabulary has no "[MASK]".
    alias = fill_mask(exported.config, exported.params, tokenizer, [text.replace(
        tokenizer.mask_token, "[MASK]")], top_k=7)[0][0]  # fmt: skip
    assert [g["token_id"] for g in alias] == [g["token_id"] for g in guesses]
    capsys.readouterr()
    assert inference_main(["fill-mask", "--model", str(exported.run), text]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].startswith(f"  {tokenizer.mask_token} 1: ")
    with pytest.raises(ValueError, match=re.escape(f"has no {tokenizer.mask_token} ")):
        fill_mask(exported.config, exported.params, tokenizer, ["no mask here"])


def test_fill_mask_demo_masks_whole_words_as_text(exported, lines):
    """Bug: the pretraining demonstration read WordPiece's "##" pieces and wrote "[MASK]"."""
    tokenizer = exported.tokenizer
    chosen = [line for line in lines if len(line.split()) > 8][:6]
    ids = np.full((len(chosen), 40), tokenizer.pad_id, np.int32)
    for i, line in enumerate(chosen):
        row = tokenizer.build_inputs(tokenizer.encode(line)[:38])[0]
        ids[i, : len(row)] = row
    batch = {
        "input_ids": ids,
        "token_type_ids": np.zeros_like(ids),
        "masked_lm_positions": np.ones((len(chosen), 1), np.int32),
        "masked_lm_ids": ids[:, 1:2],
        "masked_lm_weights": np.zeros((len(chosen), 1), np.float32),
    }
    features, positions, texts, answers = masked_examples(batch, tokenizer, 3, 30)
    assert texts
    words = {w.strip(",.;:!?'").lower() for line in chosen for w in line.split()}
    for text, answer in zip(texts, answers):  # whole words of the lines, as text
        assert text.count(tokenizer.mask_token) == 1 and answer.lower() in words, answer
    assert (
        features["input_ids"][np.arange(len(texts)), positions[:, 0]] == tokenizer.mask_id
    ).all()


def test_every_registered_class_is_exported():
    """Bug: RoBERTa's and XLM-R's classes were missing from `bert_jax`."""
    names = {f.config_class.__name__ for f in families.FAMILIES.values()}
    names |= set(families.MODEL_CLASSES)
    for name in names:
        assert name in bert_jax.__all__, name
        assert getattr(bert_jax, name) in (
            families.MODEL_CLASSES.get(name),
            *(f.config_class for f in families.FAMILIES.values()),
        )
