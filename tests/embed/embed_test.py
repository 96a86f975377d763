"""The embedding job: pairs files (every format, hard negatives, bad rows named), and a tiny run
end to end (step-0 and final dev retrieval, results.json, the sentence-transformers export, a
rerun's protections)."""

import csv
import importlib.util
import json
import pathlib

import numpy as np
import pytest

from bert_jax import tokenization
from bert_jax.retrieval import pairs

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron".split()


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_table(path, header, rows, delimiter=","):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_pairs_files_in_every_format(tmp_path):
    jsonl = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"anchor": "a1", "positive": "p1", "negative": ["n1", "m1"], "id": 3},
            {"anchor": "a2", "positive": "p2", "negative": ["n2", "m2"]},
        ],
    )
    header = ["id", "negative_2", "anchor", "positive", "negative"]
    rows = [[0, "m1", "a1", "p1", "n1"], [1, "m2", "a2", "p2", "n2"]]
    for path in (
        jsonl,
        write_table(tmp_path / "p.csv", header, rows),
        write_table(tmp_path / "p.tsv", header, rows, delimiter="\t"),
    ):
        read = pairs.read_pairs(path)
        assert (read.anchors, read.positives) == (["a1", "a2"], ["p1", "p2"]), path
        assert read.negatives == [("n1", "m1"), ("n2", "m2")], path
    assert pairs.read_pairs(jsonl, max_examples=1).anchors == ["a1"]
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"anchor": "a", "positive": "p"}])
    assert pairs.read_pairs(plain).num_negatives == 0


def test_a_file_that_names_no_pair_column_is_read_by_position(tmp_path, caplog):
    """As sentence-transformers reads a data set: the first column the anchor, the second the
    positive, the rest hard negatives, with a warning naming them; a file that names one of
    the two keeps the error naming the other (above)."""
    table = write_table(
        tmp_path / "p.csv", ["q", "d", "n"], [["a1", "p1", "n1"], ["a2", "p2", "n2"]]
    )
    jsonl = write_jsonl(
        tmp_path / "p.jsonl", [{"title": "a1", "body": "p1"}, {"title": "a2", "body": "p2"}]
    )
    with caplog.at_level("WARNING"):
        read = pairs.read_pairs(table)
    assert (read.anchors, read.positives, read.negatives) == (
        ["a1", "a2"], ["p1", "p2"], [("n1",), ("n2",)]
    )  # fmt: skip
    assert "read by position" in caplog.text and "anchor 'q', positive 'd'" in caplog.text
    read = pairs.read_pairs(jsonl)
    assert (read.anchors, read.positives, read.num_negatives) == (["a1", "a2"], ["p1", "p2"], 0)
    with pytest.raises(ValueError, match=r"p\.jsonl:1: column 'n' holds 3, not a text"):
        pairs.read_pairs(write_jsonl(tmp_path / "p.jsonl", [{"a": "x", "b": "y", "n": 3}]))


@pytest.mark.parametrize(
    "rows, message",
    [
        (
            [{"anchor": "a", "positive": "p"}, {"anchor": "b"}],
            r"p\.jsonl:2: missing column.*positive",
        ),
        ([{"anchor": "a", "positive": " "}], r"p\.jsonl:1: column 'positive' is empty"),
        ([{"anchor": 3, "positive": "p"}], r"p\.jsonl:1: column 'anchor' holds 3, not a text"),
        (
            [{"anchor": "a", "positive": "p", "negative": "n"}, {"anchor": "b", "positive": "q"}],
            r"p\.jsonl:2: 0 hard negative\(s\), but the first row has 1",
        ),
        (
            [{"anchor": "a", "positive": "p", "negative": ["n", None]}],
            r"'negative\[1\]' holds None",
        ),
    ],
)
def test_bad_pairs_are_named(tmp_path, rows, message):
    with pytest.raises(ValueError, match=message):
        pairs.read_pairs(write_jsonl(tmp_path / "p.jsonl", rows))


def test_bad_tables_are_named(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"p\.csv: the header: missing column 'positive' or 'passage' or 'answer' or "
        r"'document'; it has \['anchor', 'text'\]",
    ):
        pairs.read_pairs(write_table(tmp_path / "p.csv", ["anchor", "text"], [["a", "b"]]))
    with pytest.raises(ValueError, match=r"p\.csv:3: column 'negative' is empty"):
        pairs.read_pairs(
            write_table(
                tmp_path / "p.csv",
                ["anchor", "positive", "negative"],
                [["a", "p", "n"], ["b", "q", ""]],
            )
        )
    with pytest.raises(ValueError, match=r"unknown pairs format"):
        pairs.read_pairs(tmp_path / "p.txt")


def test_pairs_under_the_names_other_data_sets_give_them(tmp_path):
    """query / question and passage / answer / document read as anchor and positive (the
    retrieval sets' and QA sets' names), in JSONL and tables; anchor and positive win where a
    file has both."""
    rows = [{"query": "q1", "positive": "p1", "negative": "n1"}, {"query": "q2", "positive": "p2",
            "negative": "n2"}]  # fmt: skip
    read = pairs.read_pairs(write_jsonl(tmp_path / "p.jsonl", rows))
    assert (read.anchors, read.positives, read.negatives) == (["q1", "q2"], ["p1", "p2"],
                                                              [("n1",), ("n2",)])  # fmt: skip
    table = write_table(tmp_path / "p.csv", ["answer", "question"], [["a1", "q1"]])
    read = pairs.read_pairs(table)
    assert (read.anchors, read.positives) == (["q1"], ["a1"])
    both = write_jsonl(tmp_path / "b.jsonl", [{"query": "x", "anchor": "a", "positive": "p"}])
    assert pairs.read_pairs(both).anchors == ["a"]


def test_features_hold_anchor_positive_negatives(bert_tokenizer):
    read = pairs.Pairs(["fair is foul"], ["foul is fair"], [("the tempest",)], "x")
    features = pairs.featurize_pairs(read, bert_tokenizer, 16)
    assert features["input_ids"].shape == (1, 3, 16) and features["example_weights"].shape == (1,)
    texts = pairs.text_features(bert_tokenizer, ["fair is foul", "foul is fair", "the tempest"], 16)
    np.testing.assert_array_equal(features["input_ids"][0], texts["input_ids"])


# --------------------------------------------------------------------------------------------
# The job
# --------------------------------------------------------------------------------------------
def embed_config(tmp_path, **overrides):
    spec = importlib.util.spec_from_file_location("embed_config", ROOT / "configs" / "embed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    c = module.get_config("size=tiny")
    with c.unlocked():
        c.embed.train_file = str(tmp_path / "train.jsonl")
        c.embed.dev_file = str(tmp_path / "dev.csv")
        c.embed.tokenizer = str(tmp_path / "vocab")
        c.async_checkpointing = False
        for key, value in overrides.items():
            node = c
            *path, last = key.split(".")
            for p in path:
                node = node[p]
            node[last] = value
    return c


def translated_pairs(rng, n):
    """Pairs whose positive says the anchor's words in another vocabulary (word i of the first
    half of WORDS is word i of the second), with a hard negative that says other words: the
    untrained model cannot match them, a trained one can."""
    half = len(WORDS) // 2
    rows = []
    for _ in range(n):
        picked = rng.choice(half, 3, replace=False)
        other = rng.choice([i for i in range(half) if i not in picked], 3, replace=False)
        rows.append(
            {
                "anchor": " ".join(WORDS[i] for i in picked),
                "positive": " ".join(WORDS[half + i] for i in rng.permutation(picked)),
                "negative": " ".join(WORDS[half + i] for i in other),
            }
        )
    return rows


@pytest.fixture
def pair_files(tmp_path):
    return make_pair_files(tmp_path)


def make_pair_files(tmp_path):
    """train.jsonl (48 translated pairs), dev.csv (16) and a WordPiece vocab of their words."""
    rng = np.random.default_rng(0)
    tokenization.train_wordpiece(
        [" ".join([*WORDS, "is", "it"])] * 3, vocab_size=120, min_frequency=1
    ).save(tmp_path / "vocab")
    write_jsonl(tmp_path / "train.jsonl", translated_pairs(rng, 48))
    dev = translated_pairs(rng, 16)
    write_table(
        tmp_path / "dev.csv",
        ["anchor", "positive"],
        [[r["anchor"], r["positive"]] for r in dev],
    )
    return tmp_path


def test_job_trains_scores_and_exports(pair_files):
    """A tiny run with GradCache (2 chunks): dev scores at step 0 and at the end in metrics.jsonl
    and results.json, a sentence-transformers export with its card, the checkpoints removed; a
    rerun with the same settings skips the finished seed, one with another scale is refused."""
    from bert_jax.embed import run as embed_run

    workdir = pair_files / "run"
    settings = {
        "embed.num_epochs": 6,
        "embed.pooling": "mean",
        "optimizer.peak_learning_rate": 3e-3,
    }
    config = embed_config(pair_files, num_microbatches=2, **settings)
    results = embed_run.train_and_evaluate(config, str(workdir))
    seed = results["seeds"]["0"]
    keys = ("ndcg@10", "mrr@10", "recall@1", "recall@10")
    assert set(seed) == {*keys, *(f"start_{k}" for k in keys)}
    assert seed["start_ndcg@10"] < 0.5 and seed["ndcg@10"] > 0.8, seed  # it learned
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    evals = [r for r in rows if "eval/ndcg@10" in r]
    assert [r["step"] for r in evals] == [0, 36]  # 48 pairs / 8 = 6 steps x 6 epochs
    assert evals[-1]["eval/ndcg@10"] == seed["ndcg@10"]
    assert any("train/mnrl_accuracy" in r for r in rows)
    assert json.loads((workdir / "results.json").read_text())["mean"]["ndcg@10"] == seed["ndcg@10"]
    modules = json.loads((workdir / "hf" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == [
        "Transformer",
        "Pooling",
        "Normalize",
    ]
    pooling = json.loads((workdir / "hf" / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and not pooling["pooling_mode_cls_token"]
    card = (workdir / "hf" / "README.md").read_text()
    assert "MultipleNegativesRankingLoss" in card and "GradCache, 2 chunks" in card
    assert not (workdir / "checkpoints").exists()

    again = embed_run.train_and_evaluate(config, str(workdir))  # finished: nothing trains
    assert again["seeds"] == results["seeds"]
    with config.unlocked():
        config.embed.scale = 30.0
    with pytest.raises(ValueError, match=r"embed\.scale: 20\.0 -> 30\.0"):
        embed_run.train_and_evaluate(config, str(workdir))


def test_bad_settings_are_refused_before_any_data(pair_files):
    from bert_jax.embed import run as embed_run

    for key, value, message in (
        ("embed.pooling", "max", r"embed\.pooling='max'"),
        ("embed.matryoshka_dims", "32,0", r"embed\.matryoshka_dims='32,0'"),
        ("embed.scale", 0.0, r"embed\.scale=0\.0"),
        ("embed.train_file", "", r"set --config\.embed\.train_file"),
    ):
        with pytest.raises(ValueError, match=message):
            embed_run.train_and_evaluate(embed_config(pair_files, **{key: value}), "unused")
    big = embed_config(pair_files, **{"embed.matryoshka_dims": "64"})
    with pytest.raises(ValueError, match=r"<= the hidden size 32"):
        embed_run.train_and_evaluate(big, str(pair_files / "run"))
