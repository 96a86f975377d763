"""Fine-tuning data in the Hugging Face Hub's Parquet layout (`nyu-mll/glue`, `rajpurkar/squad`,
`conll2003`, `allenai/swag`) and custom .parquet files: the same examples and features as the
classic files holding the same rows (written here from the classic test files)."""

import copy
import importlib.util
import pathlib
import shutil

import numpy as np
import pytest

from bert_jax.data import text_io
from bert_jax.finetune import custom, glue, ner, squad, swag, tasks
from tests.conftest import BUCKET
from tests.data.hf_files import write_parquet
from tests.finetune.conftest import GLUE_DIR, TESTDATA

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The class names of the datasets library's glue configurations (label id order).
HUB_GLUE_LABELS = {
    "cola": ("unacceptable", "acceptable"),
    "sst2": ("negative", "positive"),
    "mrpc": ("not_equivalent", "equivalent"),
    "qqp": ("not_duplicate", "duplicate"),
    "mnli": ("entailment", "neutral", "contradiction"),
    "qnli": ("entailment", "not_entailment"),
    "rte": ("entailment", "not_entailment"),
    "wnli": ("not_entailment", "entailment"),
    "ax": ("entailment", "neutral", "contradiction"),
}
HUB_SPLITS = {  # (config, split) on the Hub of each task's train/dev/test
    "train": lambda t: "train",
    "dev": lambda t: {"mnli": "validation_matched"}.get(t, "validation"),
    "test": lambda t: {"mnli": "test_matched"}.get(t, "test"),
}


def _hub_glue(task, split):
    if task.name == "mnli_mismatched":
        hub = {"train": "train", "dev": "validation_mismatched", "test": "test_mismatched"}
        return "mnli", hub[split]
    config = task.tfds_name.split("/")[1]
    return config, HUB_SPLITS[split](config)


def write_glue_hub(root, *, metadata=("mnli", "mrpc", "cola", "wnli", "ax")):
    """The TSV test data as the Hub keeps nyu-mll/glue; configurations in `metadata` carry
    datasets' ClassLabel names, the others none (as a file written by other tools)."""
    for task in glue.GLUE_DATASETS.values():
        for split in ("train", "dev", "test"):
            if not getattr(task, f"{split}_file"):
                continue
            config, hub_split = _hub_glue(task, split)
            examples = glue.read_glue(task, GLUE_DIR, split)
            names = HUB_GLUE_LABELS.get(config)
            labels = []
            for e in examples:
                if e.label is None:
                    labels.append(-1.0 if task.is_regression else -1)
                elif task.is_regression:
                    labels.append(e.label)
                else:
                    ours = task.label_names[e.label]
                    labels.append(names.index(ours) if ours in names else int(ours))
            rows = {k: [e.texts[i] for e in examples] for i, k in enumerate(task.text_keys)}
            rows.update(label=labels, idx=[int(e.guid) for e in examples])
            path = root / config / f"{hub_split}-00000-of-00001.parquet"
            class_labels = {"label": names} if config in metadata and names else None
            write_parquet(rows, path, class_labels=class_labels)


def finetune_config(task, data_dir, **overrides):
    spec = importlib.util.spec_from_file_location("ft_config", ROOT / "configs" / "finetune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ft = module.get_config(f"task={task}").finetune
    with ft.unlocked():
        ft.data_dir = str(data_dir)
        ft.max_seq_length = 40
        ft.update(overrides)
    return ft


def assert_same_task_data(ours, theirs):
    assert (ours.objective, ours.num_labels, ours.label_names) == (
        theirs.objective,
        theirs.num_labels,
        theirs.label_names,
    )
    for a, b in [
        (ours.train, theirs.train),
        *((x.features, y.features) for x, y in zip(ours.evals, theirs.evals)),
    ]:
        assert sorted(a) == sorted(b)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert [e.name for e in ours.evals] == [e.name for e in theirs.evals]


def test_glue_hub_layout_reads_the_examples_of_the_tsv_files(tmp_path):
    write_glue_hub(tmp_path)
    for task in glue.GLUE_DATASETS.values():
        for split in ("train", "dev", "test"):
            if getattr(task, f"{split}_file"):
                hub = glue.read_glue_hub(task, tmp_path, split)
                assert hub == glue.read_glue(task, GLUE_DIR, split), (task.name, split)
    # data_dir may be the configuration's own folder.
    assert glue.read_glue_hub("rte", tmp_path / "rte", "dev") == glue.read_glue(
        "rte", GLUE_DIR, "dev"
    )


def test_glue_task_features_from_the_hub_layout_equal_the_tsv_ones(tmp_path, tokenizer):
    write_glue_hub(tmp_path)
    for name in ("mnli_mismatched", "stsb"):
        task = tasks.get_task(name)
        hub = task.load(finetune_config(name, tmp_path), tokenizer)
        assert [e.name for e in hub.evals] == ["dev", "test"]
        assert_same_task_data(hub, task.load(finetune_config(name, GLUE_DIR), tokenizer))


def test_glue_hub_errors_name_the_file(tmp_path, tokenizer):
    write_parquet(
        {"sentence1": ["a"], "label": [0], "idx": [0]},
        tmp_path / "rte/train-00000-of-00001.parquet",
    )
    with pytest.raises(
        ValueError, match=r"rte/train-00000-of-00001.parquet: no column\(s\) \['sentence2'\]"
    ):
        glue.read_glue_hub("rte", tmp_path, "train")
    write_parquet(
        {"sentence1": ["a"], "sentence2": ["b"], "label": [5], "idx": [0]},
        tmp_path / "rte/train-00000-of-00001.parquet",
    )
    with pytest.raises(
        ValueError, match=r"train-00000-of-00001.parquet: row 0: label 5: label '5' is not one"
    ):
        glue.read_glue_hub("rte", tmp_path, "train")
    with pytest.raises(
        FileNotFoundError, match=r"neither .*MRPC/train.tsv .* nor mrpc/train-\*.parquet"
    ):
        tasks.get_task("mrpc").load(finetune_config("mrpc", tmp_path), tokenizer)


def test_glue_hub_layout_on_a_bucket(fake_bucket):
    root, seen = fake_bucket
    write_glue_hub(root / "glue")
    examples = glue.read_glue_hub("mrpc", f"{BUCKET}/glue", "train")
    assert examples == glue.read_glue("mrpc", GLUE_DIR, "train")
    assert f"{BUCKET}/glue/mrpc/train-00000-of-00001.parquet" in seen


def test_squad_from_the_hub_layout(tmp_path, tokenizer):
    examples = squad.read_squad(TESTDATA / "squad_v2_tiny.json")
    rows = {
        "id": [e.qas_id for e in examples],
        "title": [e.title for e in examples],
        "context": [e.context for e in examples],
        "question": [e.question for e in examples],
        "answers": [
            {"text": [t for t, _ in e.answers], "answer_start": [s for _, s in e.answers]}
            for e in examples
        ],
    }
    for split in ("train", "validation"):
        write_parquet(rows, tmp_path / f"hub/squad_v2/{split}-00000-of-00001.parquet")
        classic = {"train": "train-v2.0.json", "validation": "dev-v2.0.json"}[split]
        shutil.copy(TESTDATA / "squad_v2_tiny.json", tmp_path / classic)
    stats = squad.SquadStats()
    hub = squad.read_squad_hub(
        [str(tmp_path / "hub/squad_v2/train-00000-of-00001.parquet")], stats=stats
    )
    assert hub == examples and (stats.questions, stats.unanswerable) == (6, 2)
    task = tasks.get_task("squad2")
    assert_same_task_data(
        task.load(finetune_config("squad2", tmp_path / "hub"), tokenizer),
        task.load(finetune_config("squad2", tmp_path), tokenizer),
    )
    bad = copy.deepcopy(rows)
    bad["answers"][0]["answer_start"][0] += 1
    write_parquet(bad, tmp_path / "bad.parquet")
    with pytest.raises(
        ValueError, match=r"bad.parquet: row 0 \(id b1\).answers\[0\]: answer_start="
    ):
        squad.read_squad_hub([str(tmp_path / "bad.parquet")])


def test_conll2003_from_the_hub_layout(tmp_path, tokenizer):
    examples = ner.read_conll(TESTDATA / "conll_tiny.txt")
    rows = {
        "id": [str(i) for i in range(len(examples))],
        "tokens": [list(e.words) for e in examples],
        "ner_tags": [[ner.CONLL2003_LABELS.index(t) for t in e.tags] for e in examples],
    }
    for split in ("train", "validation"):
        write_parquet(
            rows,
            tmp_path / f"hub/conll2003/{split}-00000-of-00001.parquet",
            class_labels={"ner_tags": ner.CONLL2003_LABELS},
        )
    shutil.copy(TESTDATA / "conll_tiny.txt", tmp_path / "train.txt")
    shutil.copy(TESTDATA / "conll_tiny.txt", tmp_path / "valid.txt")
    hub = ner.read_conll_hub([str(tmp_path / "hub/conll2003/train-00000-of-00001.parquet")])
    assert [(e.words, e.tags) for e in hub] == [(e.words, e.tags) for e in examples]
    task = tasks.get_task("conll2003")
    assert_same_task_data(
        task.load(finetune_config("conll2003", tmp_path / "hub"), tokenizer),
        task.load(finetune_config("conll2003", tmp_path), tokenizer),
    )
    # Tag ids are named by the file's own label names (here a reordered set).
    names = list(reversed(ner.CONLL2003_LABELS))
    rows["ner_tags"] = [[names.index(t) for t in e.tags] for e in examples]
    write_parquet(rows, tmp_path / "reordered.parquet", class_labels={"ner_tags": names})
    assert ner.read_conll_hub([str(tmp_path / "reordered.parquet")])[0].tags == examples[0].tags


def test_swag_from_the_hub_layout(tmp_path, tokenizer):
    for name, split in (
        ("swag_tiny.csv", "train"),
        ("swag_tiny.csv", "validation"),
        ("swag_tiny_test.csv", "test"),
    ):
        examples = swag.read_swag(TESTDATA / name)
        rows = {"video-id": ["v"] * len(examples), "fold-ind": [e.guid for e in examples]}
        rows.update(sent1=[e.context for e in examples], sent2=[e.start for e in examples])
        for k in range(4):
            rows[f"ending{k}"] = [e.endings[k] for e in examples]
        rows["label"] = [-1 if e.label is None else e.label for e in examples]
        write_parquet(rows, tmp_path / f"hub/regular/{split}-00000-of-00001.parquet")
        shutil.copy(
            TESTDATA / name,
            tmp_path / {"train": "train.csv", "validation": "val.csv", "test": "test.csv"}[split],
        )
        assert (
            swag.read_swag_hub([str(tmp_path / f"hub/regular/{split}-00000-of-00001.parquet")])
            == examples
        )
    task = tasks.get_task("swag")
    hub = task.load(finetune_config("swag", tmp_path / "hub"), tokenizer)
    assert [(e.name, e.labelled) for e in hub.evals] == [("dev", True), ("test", False)]
    assert_same_task_data(hub, task.load(finetune_config("swag", tmp_path), tokenizer))


def test_custom_task_from_parquet_files(tmp_path, tokenizer):
    rows = {
        "id": ["a", "b", "c", "d"],
        "review": ["good film", "dull", "fine I guess", "awful"],
        "stars": [1, 0, 1, 0],
    }
    write_parquet(rows, tmp_path / "train.parquet")
    write_parquet({k: v[:2] for k, v in rows.items()}, tmp_path / "dev.parquet")
    lines = ["id,review,stars"] + [f"{i},{r},{s}" for i, r, s in zip(*rows.values())]
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "dev.csv").write_text("\n".join(lines[:3]) + "\n")

    def load(suffix):
        ft = finetune_config(
            "custom",
            "",
            train_file=str(tmp_path / f"train.{suffix}"),
            dev_file=str(tmp_path / f"dev.{suffix}"),
            text_columns="review",
            label_column="stars",
        )
        return tasks.get_task("custom").load(ft, tokenizer)

    hub = load("parquet")
    assert hub.label_names == ("0", "1")
    assert_same_task_data(hub, load("csv"))
    task = custom.custom_dataset("c", ("review",), label_column="stars", label_names=("0", "1"))
    with text_io.record_reads() as reads:
        text_io.read_records(tmp_path / "train.parquet", task)
    assert list(reads) == [str(tmp_path / "train.parquet")]
    with pytest.raises(
        ValueError,
        match=r"train.parquet: no column\(s\) \['text'\]; the columns are \['id', 'review', 'stars'\]",
    ):
        text_io.read_records(
            tmp_path / "train.parquet",
            custom.custom_dataset("c", ("text",), label_column="stars", label_names=("0", "1")),
        )
