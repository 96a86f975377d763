"""GLUE and custom classification: the task table, each task's TSV layout, features, submission."""

import json
import re
import shutil

import numpy as np
import pytest

from bert_jax.data import sentence_features, text_io
from bert_jax.finetune import custom, glue, metrics
from tests.finetune.conftest import GLUE_DIR

# (task, split) -> (number of examples, (guid, texts, label) of the first example).
EXPECTED_FIRST = {
    ("cola", "train"): (3, ("0", ("The gardener watered the roses before noon.",), 1)),
    ("cola", "dev"): (2, ("0", ("She seems sleeping the cat.",), 0)),
    ("cola", "test"): (2, ("0", ("Nobody expected the bridge to hold.",), None)),
    ("sst2", "train"): (3, ("0", ("a tedious , overlong affair ",), 0)),
    ("sst2", "test"): (2, ("0", ("a muddle of moods .",), None)),
    ("mrpc", "train"): (
        2,
        (
            "0",
            (
                'The council approved the budget on Tuesday , officials said " late in the day " .',
                'Officials said the budget was approved by the council " late " on Tuesday .',
            ),
            1,
        ),
    ),
    ("mrpc", "test"): (
        1,
        (
            "0",
            (
                "The museum will reopen its north wing in May .",
                "Its north wing is set to reopen in May , the museum said .",
            ),
            None,
        ),
    ),
    ("stsb", "train"): (
        2,
        ("0", ("A dog is running on the beach.", "A dog runs along the beach."), 4.8),
    ),
    ("stsb", "test"): (1, ("0", ("A boy is kicking a ball.", "A child kicks a ball."), None)),
    ("qqp", "train"): (
        2,
        (
            "11",
            (
                "How do I learn to bake bread at home?",
                "What is the best way to start baking bread at home?",
            ),
            1,
        ),
    ),
    ("qqp", "test"): (
        1,
        ("0", ("How can I sleep better?", "What helps with falling asleep quickly?"), None),
    ),
    ("mnli", "train"): (
        4,
        (
            "0",
            (
                "The office reviews every request within a week.",
                "Staff like reviewing requests. ",
            ),
            2,
        ),
    ),
    ("mnli", "dev"): (
        1,
        (
            "0",
            ("The new schedule is fine for most of us.", "Everybody loves the new schedule. "),
            2,
        ),
    ),
    ("mnli_mismatched", "dev"): (
        1,
        (
            "0",
            (
                "Your gift helped us open a second library.",
                "Your gift made no difference to the library.",
            ),
            0,
        ),
    ),
    ("mnli_mismatched", "test"): (
        1,
        ("0", ("So what did you end up choosing?", "What was your choice?"), None),
    ),
    ("qnli", "train"): (
        3,
        (
            "0",
            (
                "When did the canal open?",
                "The canal opened to shipping in 1869 after ten years of work.",
            ),
            0,
        ),
    ),
    ("qnli", "test"): (
        1,
        (
            "0",
            (
                "Where was the treaty signed?",
                'The delegates met in a "neutral" city to sign the treaty.',
            ),
            None,
        ),
    ),
    ("rte", "train"): (
        2,
        (
            "0",
            ("No trace of the missing ship has been found yet.", "The missing ship was found."),
            1,
        ),
    ),
    ("wnli", "train"): (
        2,
        (
            "0",
            (
                "The trophy did not fit in the case because it was too big.",
                "The trophy was too big.",
            ),
            1,
        ),
    ),
    ("ax", "test"): (
        2,
        ("0", ("The cat sat on the mat.", "The cat did not sit on the mat."), None),
    ),
}


@pytest.mark.parametrize("task,split", sorted(EXPECTED_FIRST))
def test_each_task_reads_its_glue_tsv_layout(task, split):
    examples = glue.read_glue(task, GLUE_DIR, split)
    count, (guid, texts, label) = EXPECTED_FIRST[(task, split)]
    assert len(examples) == count
    assert examples[0] == text_io.TextExample(guid, texts, label)
    if split == "test":
        assert all(e.label is None for e in examples)


def test_every_labelled_split_of_every_task_reads():
    for task in glue.GLUE_DATASETS.values():
        for split in ("train", "dev", "test"):
            if not getattr(task, f"{split}_file"):
                with pytest.raises(ValueError, match=f"has no {split} split"):
                    glue.glue_file(task, GLUE_DIR, split)
                continue
            examples = glue.read_glue(task, GLUE_DIR, split)
            assert examples and all(len(e.texts) == len(task.text_keys) for e in examples)
            assert all((e.label is None) == (split == "test") for e in examples)


def test_task_table():
    assert sorted(glue.GLUE_DATASETS) == sorted(
        [
            "cola",
            "sst2",
            "mrpc",
            "stsb",
            "qqp",
            "mnli",
            "mnli_mismatched",
            "qnli",
            "rte",
            "wnli",
            "ax",
        ]
    )
    for task in glue.GLUE_DATASETS.values():
        assert set(task.metrics) <= set(metrics.METRIC_FNS), task.name
        assert task.submission_file.endswith(".tsv")
    assert glue.get_dataset("MRPC").metrics == ("f1", "accuracy")
    assert glue.get_dataset("cola").metric == "matthews_corrcoef"
    assert glue.get_dataset("STS-B").is_regression and glue.get_dataset("sts-b").metrics == (
        "spearman",
        "pearson",
    )
    assert glue.get_dataset("qqp").metrics == ("f1", "accuracy")
    assert glue.get_dataset("MNLI-mm").name == "mnli_mismatched"
    assert glue.get_dataset("MNLI-m").name == "mnli"
    assert glue.get_dataset("SST-2").name == "sst2"
    assert glue.get_dataset("mnli").label_names == ("contradiction", "entailment", "neutral")
    with pytest.raises(KeyError, match="unknown GLUE task"):
        glue.get_dataset("squad")
    with pytest.raises(ValueError, match="label_names"):
        text_io.TextDataset("bad", ("text",), 3, ("accuracy",), ("a", "b"))


def test_featurize_regression_and_unlabelled(tokenizer):
    train = glue.read_glue("stsb", GLUE_DIR, "train")
    features, _ = sentence_features.featurize(
        train, tokenizer, glue.get_dataset("stsb"), max_seq_length=32
    )
    assert features["labels"].dtype == np.float32
    np.testing.assert_allclose(features["labels"], [4.8, 0.25])
    test = glue.read_glue("stsb", GLUE_DIR, "test")
    features, _ = sentence_features.featurize(
        test, tokenizer, glue.get_dataset("stsb"), max_seq_length=32
    )
    assert np.isnan(features["labels"]).all()
    test = glue.read_glue("cola", GLUE_DIR, "test")
    features, _ = sentence_features.featurize(
        test, tokenizer, glue.get_dataset("cola"), max_seq_length=32
    )
    np.testing.assert_array_equal(features["labels"], [-1, -1])
    # CoLA is single-text: token types are all 0.
    assert features["token_type_ids"].max() == 0


def test_bad_glue_input_names_file_line_and_column(tmp_path):
    bad = tmp_path / "RTE"
    shutil.copytree(GLUE_DIR / "RTE", bad)
    with open(bad / "train.tsv", "a", encoding="utf-8") as f:
        f.write("2\tSome premise.\tSome hypothesis.\tcontradiction\n")
    with pytest.raises(ValueError, match=r"RTE/train.tsv:4: label: label 'contradiction' is not"):
        glue.read_glue("rte", tmp_path, "train")
    stats = text_io.ReadStats()
    examples = glue.read_glue("rte", tmp_path, "train", on_bad_row="skip", stats=stats)
    assert len(examples) == 2 and stats.examples == 2
    assert len(stats.skipped) == 1 and "train.tsv:4" in stats.skipped[0]

    (bad / "dev.tsv").write_text("index\tsentence1\tlabel\n0\tOnly one text.\tentailment\n")
    with pytest.raises(
        ValueError, match=r"dev.tsv: the header lacks the column\(s\) \['sentence2'\]"
    ):
        glue.read_glue("rte", tmp_path, "dev")
    (bad / "test.tsv").write_text("")
    with pytest.raises(ValueError, match="test.tsv is empty"):
        glue.read_glue("rte", tmp_path, "test")
    (bad / "test.tsv").write_text("index\tsentence1\tsentence2\n")
    with pytest.raises(ValueError, match="test.tsv has no examples"):
        glue.read_glue("rte", tmp_path, "test")
    (bad / "test.tsv").write_text("index\tsentence1\tsentence2\n0\tonly one field\n")
    with pytest.raises(ValueError, match=r"test.tsv:2: 2 tab-separated field\(s\)"):
        glue.read_glue("rte", tmp_path, "test")
    cola = tmp_path / "CoLA"
    cola.mkdir()
    (cola / "train.tsv").write_text("src\t7\t\tA sentence.\n")
    with pytest.raises(ValueError, match=r"CoLA/train.tsv:1: column 2: label '7'"):
        glue.read_glue("cola", tmp_path, "train")
    with pytest.raises(FileNotFoundError):
        glue.read_glue("sst2", tmp_path, "train")


CUSTOM_ROWS = [
    ("good, warm and kind", "a second text", "pos"),
    ('she said "no", twice', "another", "neg"),
    ("plain", "text", "neutral"),
]


def _write_custom(tmp_path):
    import csv

    with open(tmp_path / "data.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "review", "other", "sentiment"])
        writer.writerows([(f"r{i}", *row) for i, row in enumerate(CUSTOM_ROWS)])
    lines = ["id\treview\tother\tsentiment"] + [
        "\t".join((f"r{i}", *row)) for i, row in enumerate(CUSTOM_ROWS)
    ]
    (tmp_path / "data.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with open(tmp_path / "data.jsonl", "w", encoding="utf-8") as f:
        for i, (review, other, sentiment) in enumerate(CUSTOM_ROWS):
            record = {"id": f"r{i}", "review": review, "other": other, "sentiment": sentiment}
            f.write(json.dumps(record) + "\n")
        f.write("\n")  # A trailing blank line is allowed.


def test_custom_task_from_csv_tsv_jsonl(tmp_path, tokenizer):
    _write_custom(tmp_path)
    names = text_io.collect_label_names(tmp_path / "data.csv", "sentiment")
    assert names == ("neg", "neutral", "pos")
    task = custom.custom_dataset(
        "reviews", ("review", "other"), label_column="sentiment", label_names=names
    )
    assert task.num_labels == 3 and task.metrics == ("accuracy",)
    read = {
        fmt: text_io.read_records(tmp_path / f"data.{fmt}", task, id_column="id")
        for fmt in ("csv", "tsv", "jsonl")
    }
    expected = [
        text_io.TextExample(f"r{i}", (review, other), names.index(label))
        for i, (review, other, label) in enumerate(CUSTOM_ROWS)
    ]
    for fmt, examples in read.items():
        assert examples == expected, fmt
    single = custom.custom_dataset(
        "single", ("review",), label_column="sentiment", label_names=names
    )
    features, _ = sentence_features.featurize(
        text_io.read_records(tmp_path / "data.jsonl", single), tokenizer, single, 12
    )
    np.testing.assert_array_equal(features["labels"], [2, 0, 1])
    unlabelled = text_io.read_records(tmp_path / "data.tsv", single, labelled=False)
    assert [e.label for e in unlabelled] == [None] * 3 and unlabelled[0].guid == "0"


def test_custom_regression_and_bad_custom_input(tmp_path):
    (tmp_path / "scores.jsonl").write_text(
        '{"text": "a", "score": 1.5}\n{"text": "b", "score": "2"}\n{"text": "c", "score": 3}\n'
    )
    task = custom.custom_dataset("scores", ("text",), label_column="score", regression=True)
    assert task.metrics == ("pearson", "spearman")
    assert [e.label for e in text_io.read_records(tmp_path / "scores.jsonl", task)] == [
        1.5,
        2.0,
        3.0,
    ]
    (tmp_path / "bad_score.jsonl").write_text('{"text": "a", "score": "high"}\n')
    with pytest.raises(ValueError, match=r"bad_score.jsonl:1: score: could not convert"):
        text_io.read_records(tmp_path / "bad_score.jsonl", task)
    (tmp_path / "missing.jsonl").write_text('{"text": "a", "score": 1}\n{"txt": "b", "score": 2}\n')
    with pytest.raises(ValueError, match=r"missing.jsonl:2: missing field\(s\) \['text'\]"):
        text_io.read_records(tmp_path / "missing.jsonl", task)
    binary = custom.custom_dataset("b", ("text",), label_names=("0", "1"))
    assert binary.metrics == ("accuracy", "f1")
    (tmp_path / "labels.csv").write_text("text,label\nfine,1\nodd,2\n")
    with pytest.raises(ValueError, match=r"labels.csv:3: label: label '2' is not one of"):
        text_io.read_records(tmp_path / "labels.csv", binary)
    (tmp_path / "ragged.csv").write_text("text,label\nfine,1,extra\n")
    with pytest.raises(ValueError, match=r"ragged.csv:2: 3 field\(s\), but the header has 2"):
        text_io.read_records(tmp_path / "ragged.csv", binary)
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match="empty.csv is empty"):
        text_io.read_records(tmp_path / "empty.csv", binary)
    (tmp_path / "data.txt").write_text("text,label\n")
    with pytest.raises(ValueError, match="cannot tell the format"):
        text_io.read_records(tmp_path / "data.txt", binary)
    with pytest.raises(ValueError, match="at least 2 label_names"):
        custom.custom_dataset("c", ("text",))


def test_custom_labels_are_read_without_surrounding_spaces_and_never_blank(tmp_path):
    """A label's surrounding whitespace is dropped in every split and format (" pos" is "pos");
    a blank or null label, or a file of no rows, is an error naming the file and line (row)."""
    from tests.data.hf_files import write_parquet

    (tmp_path / "train.csv").write_text("text,label\na,pos\nb, neg\nc,pos \n")
    names = text_io.collect_label_names(tmp_path / "train.csv")
    assert names == ("neg", "pos")
    task = custom.custom_dataset("c", ("text",), label_names=names)
    (tmp_path / "dev.jsonl").write_text('{"text": "d", "label": " neg "}\n')
    write_parquet({"text": ["e", "f"], "label": ["pos", "\tneg"]}, tmp_path / "test.parquet")
    assert [e.label for e in text_io.read_records(tmp_path / "train.csv", task)] == [1, 0, 1]
    assert [e.label for e in text_io.read_records(tmp_path / "dev.jsonl", task)] == [0]
    assert [e.label for e in text_io.read_records(tmp_path / "test.parquet", task)] == [1, 0]
    way_out = "a labelled row needs one of the task's labels: fill it in or drop the row"
    (tmp_path / "blank.csv").write_text("text,label\na,pos\nb,  \n")
    (tmp_path / "null.jsonl").write_text(
        '{"text": "a", "label": "pos"}\n{"text": "b", "label": null}\n'
    )
    write_parquet({"text": ["a", "b"], "label": ["pos", None]}, tmp_path / "null.parquet")
    for name, where, what in (
        ("blank.csv", "blank.csv:3", "blank ('  ')"),
        ("null.jsonl", "null.jsonl:2", "null"),
        ("null.parquet", "null.parquet: row 1", "null"),
    ):
        message = f"{where}: label: the label is {what}; {way_out}"
        with pytest.raises(ValueError, match=re.escape(message)):
            text_io.collect_label_names(tmp_path / name)
        with pytest.raises(ValueError, match=re.escape(message)):
            text_io.read_records(tmp_path / name, task)
    (tmp_path / "header.csv").write_text("text,label\n")
    with pytest.raises(ValueError, match=r"header\.csv has no examples$"):
        text_io.collect_label_names(tmp_path / "header.csv")


def test_write_submission(tmp_path):
    examples = glue.read_glue("mnli_mismatched", GLUE_DIR, "test")
    path = glue.write_submission(tmp_path, "mnli_mismatched", examples, np.array([1]))
    assert path.endswith("MNLI-mm.tsv")
    assert open(path).read() == "index\tprediction\n0\tentailment\n"
    examples = glue.read_glue("cola", GLUE_DIR, "test")
    path = glue.write_submission(tmp_path, "cola", examples, [1, 0])
    assert open(path).read() == "index\tprediction\n0\t1\n1\t0\n"
    examples = [text_io.TextExample(str(i), ("a", "b"), None) for i in range(3)]
    path = glue.write_submission(tmp_path, "stsb", examples, np.array([-0.5, 2.3456, 7.0]))
    assert open(path).read() == "index\tprediction\n0\t0.000\n1\t2.346\n2\t5.000\n"
    with pytest.raises(ValueError, match="drop the batch fillers"):
        glue.write_submission(tmp_path, "stsb", examples, np.zeros(4))
