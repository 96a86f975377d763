"""Reading data files where users keep them: Parquet, `datasets` directories, the Hub's layout,
JSONL/CSV/text, local and on a (fake) bucket."""

import os

import pytest

from bert_jax.data import tables
from tests.conftest import BUCKET
from tests.data import hf_files

ROWS = {"id": [f"d{i}" for i in range(7)], "text": ["a", None, "c", "", "e", "f", "g"]}


def _read(path, columns, batch_rows):
    batches = list(tables.iter_column_batches(path, columns, batch_rows=batch_rows))
    rows = {c: [v for _, b in batches for v in b[c]] for c in columns}
    return [start for start, _ in batches], rows


def test_parquet_row_groups_rebatched_nulls_kept(tmp_path):
    path = hf_files.write_parquet(ROWS, tmp_path / "c.parquet", row_group_size=2)
    starts, rows = _read(path, ["text", "id"], batch_rows=3)
    assert starts == [0, 3, 6]
    assert rows == {"text": ROWS["text"], "id": ROWS["id"]}
    assert tables.expand_inputs(str(tmp_path / "*.parquet")) == [path]
    assert tables.num_rows(path) == 7 and tables.column_names(path) == ["id", "text"]


def test_save_to_disk_directory_and_dataset_dict(tmp_path):
    d = hf_files.save_to_disk(ROWS, str(tmp_path / "ds"), num_shards=2)
    files = tables.expand_inputs(d)
    assert [os.path.basename(f) for f in files] == [
        "data-00000-of-00002.arrow",
        "data-00001-of-00002.arrow",
    ]
    texts = [v for f in files for v in _read(f, ["text"], 3)[1]["text"]]
    assert texts == ROWS["text"]

    dd = hf_files.save_dataset_dict(
        {"train": ROWS, "test": {"id": ["t"], "text": ["z"]}}, str(tmp_path / "dd")
    )
    files = tables.expand_inputs(dd)
    assert [os.path.relpath(f, dd) for f in files] == [
        "test/data-00000-of-00001.arrow",
        "train/data-00000-of-00001.arrow",
    ]
    assert tables.split_files(dd, "train") == files[1:]


def test_hub_layout_folder_and_splits(tmp_path):
    for i in range(2):
        rows = {"text": [f"train{i}"]}
        hf_files.write_parquet(rows, tmp_path / f"data/train-0000{i}-of-00002.parquet")
    hf_files.write_parquet({"text": ["v"]}, tmp_path / "data/validation-00000-of-00001.parquet")
    (tmp_path / "README.md").write_text("# card\n")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "x.parquet").write_text("not data")
    files = tables.expand_inputs(str(tmp_path))
    assert [os.path.relpath(f, tmp_path) for f in files] == [
        "data/train-00000-of-00002.parquet",
        "data/train-00001-of-00002.parquet",
        "data/validation-00000-of-00001.parquet",
    ]
    assert tables.split_files(str(tmp_path), "train") == files[:2]
    with pytest.raises(FileNotFoundError, match="no 'test' files in .*README.md"):
        tables.split_files(str(tmp_path), "test")


def test_split_files_of_the_hub_and_cache_layouts(tmp_path):
    layouts = {
        "converted": ["mnli/validation_matched/0000.parquet", "mnli/train/0000.parquet"],
        "old": ["mnli/glue-validation_matched.parquet", "mnli/glue-train.parquet"],
        "cache": ["mnli/glue-validation_matched.arrow", "mnli/glue-train-00000-of-00002.arrow"],
    }
    for name, (want, other) in layouts.items():
        hf_files.write_parquet({"text": ["x"]}, tmp_path / name / want)
        hf_files.write_parquet({"text": ["y"]}, tmp_path / name / other)
        got = tables.split_files(str(tmp_path / name), "validation_matched", config="mnli")
        assert got == [str(tmp_path / name / want)], name
    assert tables.split_files(str(tmp_path / "cache" / "mnli"), "train") == [
        str(tmp_path / "cache/mnli/glue-train-00000-of-00002.arrow")
    ]


def test_jsonl_csv_tsv_text(tmp_path):
    (tmp_path / "r.jsonl").write_text(
        '{"id": 1, "text": "x"}\n\n{"id": 2, "text": null}\n{"id": 3, "text": "z"}\n'
    )
    (tmp_path / "r.csv").write_text('id,text\n1,"two\nlines"\n2,b\n')
    (tmp_path / "r.tsv").write_text("id\ttext\n1\ta\n")
    (tmp_path / "r.txt").write_text("\ufefffirst\n\nthird\r\n")
    assert _read(str(tmp_path / "r.jsonl"), ["text"], 2) == ([0, 2], {"text": ["x", None, "z"]})
    assert _read(str(tmp_path / "r.csv"), ["text"], 5)[1] == {"text": ["two\nlines", "b"]}
    assert _read(str(tmp_path / "r.tsv"), ["id"], 5)[1] == {"id": ["1"]}
    assert _read(str(tmp_path / "r.txt"), ["text"], 5)[1] == {"text": ["first", "", "third"]}


def test_missing_column_and_no_match_name_the_problem(tmp_path):
    path = hf_files.write_parquet(ROWS, tmp_path / "c.parquet")
    with pytest.raises(ValueError, match=r"c.parquet: no column\(s\) \['body'\]; the columns are"):
        next(tables.iter_column_batches(path, ["body"]))
    d = hf_files.save_to_disk(ROWS, str(tmp_path / "ds"))
    with pytest.raises(ValueError, match=r"no column\(s\) \['body'\].*'id', 'text'"):
        next(tables.iter_column_batches(tables.expand_inputs(d)[0], ["body"]))
    (tmp_path / "r.jsonl").write_text('{"text": "x"}\n{"body": "y"}\n')
    with pytest.raises(ValueError, match=r"r.jsonl:2: no column\(s\) \['text'\]"):
        list(tables.iter_column_batches(str(tmp_path / "r.jsonl"), ["text"]))
    with pytest.raises(FileNotFoundError, match="'.*nope/\\*.parquet' matches nothing"):
        tables.expand_inputs(str(tmp_path / "nope/*.parquet"))


def test_damaged_files_are_named(tmp_path):
    hf_files.write_parquet(ROWS, tmp_path / "c.parquet", row_group_size=2)
    data = (tmp_path / "c.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"cut.parquet: not a readable Parquet file"):
        list(tables.iter_column_batches(str(tmp_path / "cut.parquet"), ["text"]))
    with pytest.raises(ValueError, match=r"cut.parquet: not a readable Parquet/Arrow file"):
        tables.column_names(str(tmp_path / "cut.parquet"))
    d = hf_files.save_to_disk(ROWS, str(tmp_path / "ds"))
    arrow = tables.expand_inputs(d)[0]
    data = open(arrow, "rb").read()
    with open(arrow, "wb") as f:
        f.write(data[: len(data) - 200])
    batches = tables.iter_column_batches(arrow, ["text"], batch_rows=2)
    assert next(batches) == (0, {"text": ROWS["text"][:2]})  # the rows before the damage
    with pytest.raises(ValueError, match=r"data-00000-of-00001.arrow: not a readable Arrow IPC"):
        list(batches)


def test_bucket_glob_directory_and_stream(fake_bucket):
    root, seen = fake_bucket
    hf_files.write_parquet(ROWS, root / "corpus/part-0.parquet", row_group_size=3)
    hf_files.save_to_disk(ROWS, str(root / "corpus/saved"))
    assert tables.expand_inputs(f"{BUCKET}/corpus/*.parquet") == [f"{BUCKET}/corpus/part-0.parquet"]
    files = tables.expand_inputs(f"{BUCKET}/corpus")
    assert files == [
        f"{BUCKET}/corpus/part-0.parquet",
        f"{BUCKET}/corpus/saved/data-00000-of-00001.arrow",
    ]
    for f in files:
        assert _read(f, ["text"], 4)[1] == {"text": ROWS["text"]}
    # Every read went through epath with the URL (a local path would bypass the bucket).
    assert f"{BUCKET}/corpus/saved/state.json" in seen
    assert f"{BUCKET}/corpus/part-0.parquet" in seen
