"""The reranker job: its losses against sentence-transformers' CrossEncoder losses, its dev
metrics against CrossEncoderRerankingEvaluator, its readers' errors, its CrossEncoder export for
every registered family (`CrossEncoder(dir).predict` equals bert_jax's scores within 1e-5), and a
tiny train.py run (a clean environment) that learns to rerank above the file order."""

import functools
import json
import os
import pathlib
import subprocess
import sys
from types import SimpleNamespace
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bert_jax import losses, tokenization
from bert_jax.checkpoints import pretrained
from bert_jax.checkpoints.cross_encoder import read_activation, save_cross_encoder
from bert_jax.checkpoints.sentence_transformers import read_max_seq_length
from bert_jax.models import families
from bert_jax.models.families import Role
from bert_jax.models.params import init_params
from bert_jax.rerank import data, evaluation
from bert_jax.training.reranking import pair_logits, rerank_objective
from tests import family_fixtures

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOGITS = np.array([[2.0, -1.0, 0.5], [-0.3, 0.7, 1.9], [0.0, -2.5, -0.1], [1.2, 1.1, -3.0]])
TEACHER = np.array([[5.0, 1.0, 2.0], [3.0, 3.5, -1.0], [0.0, 0.0, 1.0], [9.0, 2.0, 4.0]])
WORDS = "amber basil cedar delta ember fjord grove heron indigo juniper kelp lotus".split()


# --------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------
def test_losses_equal_sentence_transformers():
    torch = pytest.importorskip("torch")
    ce_losses = pytest.importorskip("sentence_transformers.cross_encoder.losses")
    # Pointwise binary cross-entropy, soft labels too.
    labels = np.array([1.0, 1.0, 0.3, 1.0])
    out = losses.binary_cross_entropy(jnp.asarray(LOGITS[:, 0]), jnp.asarray(labels))
    theirs = torch.nn.BCEWithLogitsLoss()(torch.tensor(LOGITS[:, 0]), torch.tensor(labels))
    np.testing.assert_allclose(out["loss_sum"] / out["count"], theirs.item(), rtol=1e-6)
    assert out["correct_sum"] == 3  # row 1 wrong; row 2 right: logit 0 is not > 0, 0.3 < 0.5
    # Listwise: MultipleNegativesRankingLoss over each row's own negatives (calculate_loss takes
    # the columns' logits [B] each: the positives, then each negative column).
    for activation, fn in (("sigmoid", torch.nn.Sigmoid()), ("identity", None)):
        this = SimpleNamespace(
            activation_fn=fn, scale=10.0, cross_entropy_loss=torch.nn.CrossEntropyLoss()
        )
        columns = [torch.tensor(LOGITS[:, j]) for j in range(3)]
        theirs = ce_losses.MultipleNegativesRankingLoss.calculate_loss(this, columns, 4)
        out = losses.listwise_softmax_loss(jnp.asarray(LOGITS), scale=10.0, activation=activation)
        np.testing.assert_allclose(out["loss_sum"] / out["count"], theirs.item(), rtol=1e-5)
        assert out["correct_sum"] == 3  # row 1's positive is last
    # Margin-MSE: their margins from teacher scores [B, 1 + K], MSE over B x K.
    margins = TEACHER[:, :1] - TEACHER[:, 1:]
    student = LOGITS[:, :1] - LOGITS[:, 1:]
    theirs = torch.nn.MSELoss()(torch.tensor(student), torch.tensor(margins))
    out = losses.margin_mse_loss(jnp.asarray(LOGITS), jnp.asarray(TEACHER))
    np.testing.assert_allclose(out["loss_sum"] / out["count"], theirs.item(), rtol=1e-6)
    assert out["count"] == 8
    # Padded rows weigh nothing.
    w = jnp.array([1.0, 1.0, 0.0, 0.0])
    half = losses.margin_mse_loss(jnp.asarray(LOGITS), jnp.asarray(TEACHER), w)
    part = losses.margin_mse_loss(jnp.asarray(LOGITS[:2]), jnp.asarray(TEACHER[:2]))
    np.testing.assert_allclose(half["loss_sum"], part["loss_sum"], rtol=1e-6)


@pytest.mark.e2e  # about 10 s of compiling on 2 busy cores
def test_objective_scores_each_pair_of_a_group():
    """The objective's loss is the loss of the head's logits of every (row, candidate)."""
    config = families.FAMILIES["bert"].config_class(
        vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=16, num_labels=1,
    )  # fmt: skip
    model = families.get_model_class("BertForSequenceClassification")(config)
    params = nn.meta.unbox(init_params(model, jax.random.PRNGKey(0)))
    ids = jax.random.randint(jax.random.PRNGKey(1), (3, 2, 7), 1, 99)
    batch = {
        "input_ids": ids,
        "token_type_ids": jnp.zeros_like(ids),
        "attention_mask": jnp.ones_like(ids),
        "example_weights": jnp.ones(3),
        "teacher_scores": jnp.asarray(TEACHER[:3, :2]),
    }
    objectives = {loss: rerank_objective(loss) for loss in ("listwise", "margin_mse")}

    @jax.jit  # one compile: the objective's logits, the head's on one column, both losses
    def outputs(p, b):
        direct = model.apply({"params": p}, b["input_ids"][:, 1], deterministic=True).logits
        values = {
            k: o.loss(o.sums(model, p, b, None, True), o.counts(b)) for k, o in objectives.items()
        }
        return pair_logits(model, p, b, None, True), direct[:, 0], values

    logits, direct, values = outputs(params, batch)
    np.testing.assert_allclose(logits[:, 1], direct, atol=1e-6)
    for loss, expected in (
        ("listwise", losses.listwise_softmax_loss(logits)),
        ("margin_mse", losses.margin_mse_loss(logits, batch["teacher_scores"])),
    ):
        np.testing.assert_allclose(
            values[loss], expected["loss_sum"] / expected["count"], rtol=1e-5
        )


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_packed_pairs_train_as_the_padded_batch(family):
    """No dropout: each loss's value and gradients on a batch's pairs packed several to a row
    (`packing.pack_pairs` with `keep`, empty rows among them) equal the padded [B, G, L] batch's
    within 1e-5: bce on single pairs, listwise and margin-MSE on groups of 3."""
    from bert_jax.retrieval import packing
    from tests.embed.embed_packing_test import B, L, assert_same, loss_and_grads, pair_batch

    fields = dict(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=L + 8, num_labels=1,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    if family == "roberta":
        fields.update(model_type="roberta", pad_token_id=1)
    config = families.config_from_fields(fields)
    model = families.get_model_class(families.head_in_family(config, Role.SEQUENCE_CLASSIFICATION))(
        config
    )
    params = init_params(model, jax.random.PRNGKey(0))
    groups = pair_batch(4)  # [B, 3, L]
    singles = {k: v[:, :1] if v.ndim == 3 else v for k, v in groups.items()}
    singles["labels"] = np.array([1, 0, 1, 1, 0, 0], np.float32)[:B]
    groups["teacher_scores"] = np.asarray(TEACHER[np.arange(B) % 4], np.float32)
    cases = [("bce", singles), ("listwise", groups), ("margin_mse", groups)]
    keep = ("labels", "example_weights", "teacher_scores")

    def both(params):
        out = []
        for loss, batch in cases:
            g = batch["input_ids"].shape[1]
            packed = packing.pack_pairs(
                batch, max_segments=4, row_multiple=4, keep=tuple(k for k in keep if k in batch)
            )
            assert len(packed["input_ids"]) < B * g or g == 1
            for objective, b in (
                (rerank_objective(loss), batch),
                (rerank_objective(loss, packed_shape=(B, g)), packed),
            ):
                loss_value, grads, sums = loss_and_grads(model, objective, params, b)
                out.append((loss_value, grads, sums["rerank_count"]))
        return out

    out = jax.jit(both)(params)
    for (padded, packed_out), (loss, _) in zip(zip(out[::2], out[1::2]), cases, strict=True):
        assert_same(packed_out[:2], padded[:2])
        assert packed_out[2] == padded[2], loss
    assert len({round(float(o[0]), 4) for o in out[::2]}) == 3  # three different losses


def test_packed_pairs_keep_each_hosts_labels():
    """`PackedBatches(keep=...)`: two hosts feed the halves of the one-process packing, the
    rows' halves and the [B] keys' halves (`host_rows` of B), step for step."""
    from bert_jax.data import batching
    from bert_jax.retrieval import packing
    from tests.embed.embed_packing_test import pair_batch

    features = {k: np.concatenate([v, v[::-1]]) for k, v in pair_batch(6).items()}  # 12 groups
    features["labels"] = np.arange(12, dtype=np.float32)

    def iterator(host=None):
        host_rows = None if host is None else (lambda r: np.arange(r).reshape(2, -1)[host])
        epochs = batching.EpochIterator(features, 6, num_epochs=1, seed=3)
        return packing.PackedBatches(
            epochs, max_segments=3, row_multiple=2, host_rows=host_rows,
            keep=("labels", "example_weights"),
        )  # fmt: skip

    for whole, a, b in zip(iterator(), iterator(0), iterator(1), strict=True):
        assert whole["labels"].shape == (6,) and a["labels"].shape == (3,)
        for k in whole:
            np.testing.assert_array_equal(np.concatenate([a[k], b[k]]), whole[k])


def test_packing_with_microbatches_is_refused():
    """rerank.pack packs a whole batch; micro-batches would split rows from their labels."""
    from bert_jax.rerank import run as rerank_run
    from tests.family_fixtures import load_config

    config = load_config("rerank.py", "size=tiny")
    config.rerank.train_file = "train.jsonl"
    config.num_microbatches = 2
    with pytest.raises(ValueError, match="num_microbatches=2"):
        rerank_run.check_config(config)
    config.rerank.pack = False
    rerank_run.check_config(config)


def test_the_block_is_parsed_once_into_typed_settings():
    """check_config hands the run a typed record of `config.rerank` (extending the shared
    text-job settings), and refuses a value out of range naming its key."""
    from bert_jax.rerank import run as rerank_run
    from tests.family_fixtures import load_config

    config = load_config("rerank.py", "size=tiny")
    config.rerank.train_file, config.rerank.max_train_examples = "train.jsonl", 7
    config.rerank.seeds, config.rerank.scale = "0,1", 20
    rr = rerank_run.check_config(config)
    assert (rr.train_file, rr.dev_file, rr.max_train_examples, rr.loss) == (
        "train.jsonl",
        "",
        7,
        "auto",
    )
    assert (rr.scale, rr.seeds, rr.key) == (20.0, (0, 1), "rerank")
    config.rerank.max_seq_length = 0
    assert rerank_run.check_config(config).pair_length(SimpleNamespace(max_sequence_length=9)) == 9
    for key, value, message in [
        ("scale", 0.0, r"rerank.scale=0.0; expected a number > 0"),
        ("max_eval_examples", -1, r"config.rerank.max_eval_examples=-1: expected an integer >= 0"),
    ]:
        bad = load_config("rerank.py", "size=tiny")
        bad.rerank.train_file = "train.jsonl"
        bad.rerank[key] = value
        with pytest.raises(ValueError, match=message):
            rerank_run.check_config(bad)


def test_dev_pairs_packed_score_as_one_pair_a_row_over_the_devices():
    """The dev candidates' logits (`evaluation.pair_logits`) on a (4, 2, 1) mesh: pairs packed
    several to a row (the default) equal them one a row within 1e-5, in input order."""
    from types import SimpleNamespace

    from bert_jax.parallel import sharding
    from bert_jax.rerank import evaluation
    from bert_jax.training import steps

    config = families.FAMILIES["roberta"].config_class(
        vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=40, num_labels=1, pad_token_id=1,
    )  # fmt: skip
    model = families.get_model_class("RobertaForSequenceClassification")(config)
    params = nn.meta.unbox(init_params(model, jax.random.PRNGKey(0)))
    predict = jax.jit(functools.partial(steps.predict_step, model=model))
    mesh = sharding.make_mesh({"data": 4, "fsdp": 2, "tensor": 1})
    exp = SimpleNamespace(mesh=mesh, predict_fn=lambda: predict)
    rng = np.random.default_rng(5)
    lengths = rng.integers(4, 25, size=29)
    mask = (np.arange(24) < lengths[:, None]).astype(np.int32)
    features = {
        "input_ids": (rng.integers(3, 99, size=(29, 24)) * mask).astype(np.int32),
        "token_type_ids": np.zeros_like(mask),  # RoBERTa's pairs: one token type
        "attention_mask": mask,
        "example_weights": np.ones(29, np.float32),
    }
    packed = evaluation.pair_logits(exp, params, features, 16)
    padded = evaluation.pair_logits(exp, params, features, 16, max_segments=0)
    direct = model.apply({"params": params}, features["input_ids"], attention_mask=mask).logits
    assert packed.shape == (29,)
    np.testing.assert_allclose(padded, direct[:, 0], atol=1e-5)
    np.testing.assert_allclose(packed, padded, atol=1e-5)


# --------------------------------------------------------------------------------------------
# Dev metrics
# --------------------------------------------------------------------------------------------
def test_metrics_equal_cross_encoder_reranking_evaluator():
    st_eval = pytest.importorskip("sentence_transformers.cross_encoder.evaluation")
    rng = np.random.default_rng(0)
    queries = []
    for i in range(7):
        n = int(rng.integers(3, 15))  # more than 10 candidates for some: @10 cuts
        relevant = rng.random(n) < 0.3
        if i == 5:
            relevant[:] = False  # counts 0 in every mean
        if i == 6:
            relevant[:] = False
            relevant[-1] = True  # past the baseline's top 10 for n > 10
        queries.append(
            data.DevQuery(f"q{i}", tuple(f"q{i} d{j}" for j in range(n)), tuple(relevant))
        )
    table = {(q.query, d): float(rng.normal()) for q in queries for d in q.candidates}
    samples = [
        {
            "query": q.query,
            "positive": [d for d, r in zip(q.candidates, q.relevant) if r],
            "documents": list(q.candidates),
        }
        for q in queries
    ]
    model = mock.MagicMock()
    model.predict.side_effect = lambda pairs, **_: np.array([table[tuple(p)] for p in pairs])
    theirs = st_eval.CrossEncoderRerankingEvaluator(samples, write_csv=False)(model)
    offsets, scores = [0], []
    for q in queries:
        order = evaluation.reranked_order(q)[0] if any(q.relevant) else []
        scores += [table[(q.query, d)] for d in order]
        offsets.append(len(scores))
    ours = evaluation.rerank_scores(queries, np.array(scores), np.array(offsets))
    assert set(ours) == {"ndcg@10", "mrr@10", "base_ndcg@10", "base_mrr@10"}
    for key, value in ours.items():
        np.testing.assert_allclose(value, theirs[key], atol=1e-12, err_msg=key)
    assert 0 < ours["base_ndcg@10"] < 1 and ours["ndcg@10"] != ours["base_ndcg@10"]


def test_ranking_metrics_by_hand():
    ndcg, mrr = evaluation.ranking_metrics([False, True, False, True], np.array([4, 3, 2, 1.0]))
    assert mrr == 0.5
    ideal = 1 + 1 / np.log2(3)
    np.testing.assert_allclose(ndcg, (1 / np.log2(3) + 1 / np.log2(5)) / ideal)
    assert evaluation.ranking_metrics([False, False], np.array([1.0, 2.0])) == (0.0, 0.0)


# --------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------
def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_rows_in_every_format(tmp_path):
    pointwise = _write(
        tmp_path / "p.tsv", "query\tpassage\tlabel\tother\nq1\tp1\t1\tx\nq1\tp2\t0\t\n"
    )
    rows = data.read_rows(pointwise)
    assert rows.layout == "pointwise" and rows.candidates == [("p1",), ("p2",)]
    np.testing.assert_array_equal(rows.labels, [1.0, 0.0])
    listwise = _write(
        tmp_path / "l.jsonl",
        json.dumps({"anchor": "q", "positive": "p", "negative": ["n1", "n2"],
                    "positive_score": 3, "negative_score": [1, 2.5]}) + "\n\n",
    )  # fmt: skip
    rows = data.read_rows(listwise)
    assert rows.layout == "listwise" and rows.candidates == [("p", "n1", "n2")]
    np.testing.assert_array_equal(rows.teacher_scores, [[3, 1, 2.5]])
    csv = _write(tmp_path / "l.csv", 'query,negative_2,positive,negative_1\n"q, a",n2,p,n1\n')
    assert data.read_rows(csv).candidates == [("p", "n1", "n2")]
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"query": ["q1", "q2"], "passage": ["a", "b"], "label": [0.5, 1.0]})
    pq.write_table(table, tmp_path / "p.parquet")
    rows = data.read_rows(str(tmp_path / "p.parquet"))
    assert rows.queries == ["q1", "q2"] and rows.labels.tolist() == [0.5, 1.0]
    queries = data.dev_queries(data.read_rows(pointwise))
    assert queries == [data.DevQuery("q1", ("p1", "p2"), (True, False))]
    # The embedding job's names (retrieval.pairs): question/answer rows as query/passage ones.
    qa = _write(tmp_path / "qa.csv", "question,answer,label\nq1,p1,1\n")
    rows = data.read_rows(qa)
    assert (rows.queries, rows.candidates, rows.labels.tolist()) == (["q1"], [("p1",)], [1.0])


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.csv", "query,passage,label\nq,p,yes\n", r"a\.csv:2: column 'label' holds 'yes'"),
        ("b.tsv", "query\tpassage\tlabel\nq\t \t1\n", r"b\.tsv:2: column 'passage' is empty"),
        ("c.jsonl", '{"query": "q", "positive": "p", "negative": "n"}\n{"query": "q", '
         '"positive": "p"}\n', r"c\.jsonl:2: 0 negative\(s\), but the first row has 1"),
        ("d.jsonl", '{"query": "q", "passage": "p", "label": 1}\n{"query": 3, "passage": "p", '
         '"label": 0}\n', r"d\.jsonl:2: column 'query' holds 3, not a text"),
        ("e.csv", "prompt,passage,label\nq,p,1\n", r"e\.csv:2: no column 'anchor' or 'query' or 'question'"),
        ("f.jsonl", '{"query": "q", "positive": "p", "negative": "n", "positive_score": 1}\n',
         r"f\.jsonl:1: column 'negative_score' is missing"),
        ("g.csv", "query,passage,label\nq,p,1,2\n", r"g\.csv:2: 4 field\(s\), but the header has 3"),
        ("h.txt", "q p 1\n", r"h\.txt: unknown rows format"),
    ],
)  # fmt: skip
def test_bad_rows_name_file_line_and_column(tmp_path, name, text, message):
    with pytest.raises(ValueError, match=message):
        data.read_rows(_write(tmp_path / name, text))


# --------------------------------------------------------------------------------------------
# The CrossEncoder export, every family
# --------------------------------------------------------------------------------------------
PAIRS = [
    ("Fair is foul, and foul is fair", "hover through the fog and filthy air"),
    ("To be, or not to be", "that is the question"),
    ("what is the answer", "O"),
]


@pytest.fixture(scope="module")
def training_texts():
    return family_fixtures.training_texts()


# Two families in the default suite (a WordPiece and a BPE one, with and without token types);
# every family of the registry with -m e2e (about 25 s on 2 busy cores).
FAST = ("bert", "roberta")


@pytest.mark.torch
@pytest.mark.parametrize(
    "model_type",
    [m if m in FAST else pytest.param(m, marks=pytest.mark.e2e) for m in families.FAMILIES],
)
def test_cross_encoder_export_scores_as_bert_jax(model_type, training_texts, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    tokenizer = family_fixtures.fixture_of(model_type).train_tokenizer(training_texts)
    config = family_fixtures.tiny_config(model_type, tokenizer, num_labels=1)
    head = families.FAMILIES[model_type].head_for(Role.SEQUENCE_CLASSIFICATION)
    model = families.get_model_class(head)(config)
    params = nn.meta.unbox(init_params(model, jax.random.PRNGKey(7)))
    rng = np.random.default_rng(1)  # every weight off its start (zero biases, unit norms)
    params = jax.tree_util.tree_map(
        lambda x: (np.asarray(x) + 0.05 * rng.standard_normal(x.shape)).astype(np.float32), params
    )
    out = save_cross_encoder(
        tmp_path / "ce", config, params, tokenizer=tokenizer, max_seq_length=40
    )
    assert read_activation(out) == "sigmoid"
    features = data.pair_features(tokenizer, *zip(*PAIRS), 40)
    inputs = {k: v for k, v in features.items() if k != "token_type_ids" or model.token_types}
    logits = model.apply({"params": params}, **inputs, deterministic=True).logits[:, 0]
    ours = np.asarray(jax.nn.sigmoid(logits))
    theirs = st.CrossEncoder(out, device="cpu").predict(PAIRS)
    worst = float(np.abs(theirs - ours).max())
    print(f"{model_type}: worst |CrossEncoder - bert_jax| = {worst:.2e}")
    np.testing.assert_allclose(theirs, ours, atol=1e-5)
    assert np.ptp(ours) > 1e-3  # the pairs score differently: a swapped input could not pass
    loaded = pretrained.load(out)  # bert_jax's loader reads it back as the same head
    assert loaded.head == head and loaded.config.num_labels == 1


# --------------------------------------------------------------------------------------------
# A tiny run through train.py
# --------------------------------------------------------------------------------------------
def _rows(rng, n, pointwise_dev=False):
    """An easy task: relevant passages say words of WORDS' first half, the others of its second
    half (a tiny model from scratch learns it in a few dozen steps; one that matches the query's
    own words takes far longer). Training rows: a positive and a negative per query; dev rows:
    a positive among 3 negatives in a random (first-stage) order."""
    half = len(WORDS) // 2

    def text(offset):
        return " ".join(WORDS[i] for i in rng.choice(half, 3) + offset)

    rows = []
    for _ in range(n):
        query = " ".join(WORDS[i] for i in rng.choice(len(WORDS), 2, replace=False))
        candidates = [(text(0), 1.0)] + [
            (text(half), 0.0) for _ in range(3 if pointwise_dev else 1)
        ]
        order = rng.permutation(len(candidates)) if pointwise_dev else range(len(candidates))
        rows += [
            {"query": query, "passage": candidates[i][0], "label": candidates[i][1]} for i in order
        ]
    return rows


@pytest.mark.e2e  # the default stage: the objective's packed == padded per loss (above) and a
# packed listwise job run as users start it (test_listwise_rows_train_by_default_...)
def test_reranker_job_trains_packed_pairs_as_padded_ones(tmp_path):
    """train.py's reranker job in this process on the suite's 8 devices: 4 steps of 8 listwise
    rows (a positive and 2 negatives each; 24 pairs a step, packed several to a row, the labels
    [8] beside the rows) without dropout log the losses of the same job with rerank.pack=false,
    within 1e-4, and score and export as it does."""
    from tests.conformance_test import train_py, train_rows

    rng = np.random.default_rng(1)
    tokenization.train_wordpiece([" ".join(WORDS)] * 3, vocab_size=60, min_frequency=1).save(
        tmp_path / "vocab"
    )
    pointwise = _rows(rng, 32)
    rows = [
        {"query": p["query"], "positive": p["passage"], "negative": [n["passage"], m["passage"]]}
        for p, n, m in zip(pointwise[::2], pointwise[1::2], pointwise[3::2] + pointwise[1:2])
    ]
    with open(tmp_path / "train.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows[:32])
    with open(tmp_path / "dev.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in _rows(rng, 6, pointwise_dev=True))
    losses_by_pack = {}
    for pack in (True, False):
        workdir = tmp_path / f"run_{pack}"
        train_py(
            "rerank.py:size=tiny",
            workdir,
            **{
                "rerank.train_file": str(tmp_path / "train.jsonl"),
                "rerank.dev_file": str(tmp_path / "dev.jsonl"),
                "rerank.tokenizer": str(tmp_path / "vocab"),
                "rerank.loss": "listwise",
                "rerank.pack": pack,
                "model.hidden_dropout_prob": 0.0,
                "model.attention_probs_dropout_prob": 0.0,
                "log_every_steps": 1,
                "async_checkpointing": False,
            },
        )
        losses_by_pack[pack] = [r["train/loss"] for _, r in sorted(train_rows(workdir).items())]
        seed = json.loads((workdir / "results.json").read_text())["seeds"]["0"]
        assert 0 < seed["ndcg@10"] <= 1 and (workdir / "hf" / "config.json").exists()
    assert len(losses_by_pack[True]) == 4
    np.testing.assert_allclose(losses_by_pack[True], losses_by_pack[False], rtol=1e-4)


@pytest.mark.e2e
def test_train_py_learns_to_rerank(tmp_path):
    rng = np.random.default_rng(0)
    tokenization.train_wordpiece([" ".join(WORDS)] * 3, vocab_size=60, min_frequency=1).save(
        tmp_path / "vocab"
    )
    for name, rows in (("train", _rows(rng, 96)), ("dev", _rows(rng, 24, pointwise_dev=True))):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    home, workdir = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HOME=str(home), JAX_PLATFORMS="cpu", XLA_FLAGS=os.environ.get("XLA_FLAGS", ""))
    cmd = [
        sys.executable, "train.py", "--config=configs/rerank.py:size=tiny",
        f"--workdir={workdir}", f"--config.rerank.train_file={tmp_path / 'train.jsonl'}",
        f"--config.rerank.dev_file={tmp_path / 'dev.jsonl'}",
        f"--config.rerank.tokenizer={tmp_path / 'vocab'}", "--config.rerank.num_epochs=3",
        "--config.async_checkpointing=False", "--compilation_cache_dir=off",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seed = json.loads((workdir / "results.json").read_text())["seeds"]["0"]
    assert seed["ndcg@10"] > seed["base_ndcg@10"] + 0.1 and seed["ndcg@10"] > 0.9, seed
    assert seed["ndcg@10"] > seed["start_ndcg@10"], seed
    assert json.loads((workdir / "settings.json").read_text())["task"] == "rerank"
    assert read_activation(workdir / "hf") == "sigmoid" and not (workdir / "checkpoints").exists()
    from bert_jax.inference.loading import load_cross_encoder

    ran = load_cross_encoder(str(workdir))  # the run's directory stands for its hf/
    assert (ran.activation, ran.max_seq_length) == ("sigmoid", read_max_seq_length(workdir / "hf"))
    assert ran.max_seq_length


def test_each_seed_draws_its_own_head_on_the_same_encoder(training_texts, tmp_path):
    """A checkpoint that is no reranker (here a 3-label classifier) gives its encoder; each
    seed's reranker head is new and drawn from that seed, as fine-tuning's heads are."""
    from bert_jax import convert
    from bert_jax.rerank import run as rerank_run
    from configs import rerank as rerank_configs

    tokenizer = family_fixtures.fixture_of("bert").train_tokenizer(training_texts)
    config = family_fixtures.tiny_config("bert", tokenizer, num_labels=3)
    head = "BertForSequenceClassification"
    params = nn.meta.unbox(init_params(families.get_model_class(head)(config), jax.random.key(3)))
    convert.save_pytorch(config, jax.device_get(params), tmp_path / "clf", head)
    tokenizer.save(tmp_path / "clf")
    run_config = rerank_configs.get_config("size=tiny")
    run_config.init_from = str(tmp_path / "clf")
    start = rerank_run.starting_point(run_config, rerank_run.check_config(run_config, False))
    assert start.params is None and start.model_config.num_labels == 1
    reranker = start.model_config
    first, new = rerank_run.graft(reranker, head, start.encoder, 0)
    second, _ = rerank_run.graft(reranker, head, start.encoder, 1)
    assert new == ["classifier/..."] and first["classifier"]["kernel"].shape[-1] == 1
    assert not np.allclose(first["classifier"]["kernel"], second["classifier"]["kernel"])
    jax.tree_util.tree_map(np.testing.assert_array_equal, first["bert"], second["bert"])
    np.testing.assert_allclose(
        first["bert"]["embeddings"]["word_embeddings"]["embedding"],
        params["bert"]["embeddings"]["word_embeddings"]["embedding"],
    )


def _train_py_as_a_user(tmp_path, variant: str, *flags: str) -> subprocess.CompletedProcess:
    """train.py's reranker job on `tmp_path`/train.jsonl into `tmp_path`/run, as a user starts
    it: a process of its own, no HF_* variable, a fresh HOME (`commands_test.clean_env`)."""
    from tests.commands_test import clean_env

    home = tmp_path / "home"
    home.mkdir()
    cmd = [
        sys.executable, "train.py", f"--config=configs/rerank.py:{variant}",
        f"--workdir={tmp_path / 'run'}", f"--config.rerank.train_file={tmp_path / 'train.jsonl'}",
        "--config.async_checkpointing=False", *flags,
    ]  # fmt: skip
    return subprocess.run(
        cmd, cwd=ROOT, env=clean_env(home), capture_output=True, text=True, timeout=900
    )


@pytest.mark.e2e  # a train.py run of the reranker and its mining, 30 s
def test_listwise_rows_train_by_default_and_a_reranker_worse_than_its_first_stage_says_so(
    tmp_path,
):
    """As a user starts it (train.py in a subprocess, no HF_* variable, a fresh HOME): listwise
    rows with no `rerank.loss` train with the listwise loss (the default took bce and refused
    them), said on one line; a reranker taught the opposite of the dev labels (its positives are
    the dev set's negatives) orders dev worse than a first stage that put every positive first,
    and the run says so on one W line (exit 0, the export written)."""
    rng = np.random.default_rng(2)
    tokenization.train_wordpiece([" ".join(WORDS)] * 3, vocab_size=60, min_frequency=1).save(
        tmp_path / "vocab"
    )
    pointwise = _rows(rng, 64)
    rows = [
        {"query": p["query"], "positive": n["passage"], "negative_1": p["passage"]}
        for p, n in zip(pointwise[::2], pointwise[1::2])
    ]
    dev = _rows(rng, 6, pointwise_dev=True)
    dev = sorted(dev, key=lambda r: (r["query"], -r["label"]))  # the first stage: positive first
    for name, records in (("train", rows), ("dev", dev)):
        with open(tmp_path / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    workdir = tmp_path / "run"
    proc = _train_py_as_a_user(
        tmp_path, "size=tiny", f"--config.rerank.dev_file={tmp_path / 'dev.jsonl'}",
        f"--config.rerank.tokenizer={tmp_path / 'vocab'}", "--config.rerank.num_epochs=2",
        "--compilation_cache_dir=off",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "rerank.loss=auto: listwise, the loss for listwise rows" in out
    seed = json.loads((workdir / "results.json").read_text())["seeds"]["0"]
    assert seed["base_ndcg@10"] == 1.0 and seed["ndcg@10"] < 1.0, seed
    worse = [ln for ln in out.splitlines() if "orders the dev candidates worse" in ln]
    assert len(worse) == 1 and f"{seed['ndcg@10']:.4f} against the file order's 1.0000" in worse[0]
    assert (
        json.loads((workdir / "settings.json").read_text())["config"]["rerank.loss"] == "listwise"
    )
    assert (workdir / "hf" / "config.json").exists()


@pytest.mark.e2e
def test_the_default_recipe_learns_from_minilm(tmp_path):
    """configs/rerank.py:init=minilm as README runs it (train.py in a subprocess, a clean
    environment), listwise rows of the easy task (a positive and 3 negatives each): in 16 steps
    at the default learning rate the loss leaves chance (ln 4), where the old default (2e-5)
    left it at 1.27."""
    rng = np.random.default_rng(3)
    pointwise = _rows(rng, 64)
    positives, negatives = pointwise[::2], pointwise[1::2]
    rows = [
        {"query": p["query"], "positive": p["passage"],
         **{f"negative_{k + 1}": negatives[(i + k * 7) % len(negatives)]["passage"]
            for k in range(3)}}
        for i, p in enumerate(positives)
    ]  # fmt: skip
    with open(tmp_path / "train.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    workdir = tmp_path / "run"
    proc = _train_py_as_a_user(
        tmp_path, "init=minilm", "--config.rerank.max_seq_length=32",
        "--config.global_batch_size=4", "--config.log_every_steps=4",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    from tests.conformance_test import train_rows

    losses = [r["train/loss"] for _, r in sorted(train_rows(workdir).items())]
    assert len(losses) == 4 and losses[-1] < 0.8 * np.log(4), losses
