"""Files laid out as Hugging Face `datasets` and the Hub leave them, written with pyarrow alone
(`datasets` is not a dependency): `save_to_disk` directories, DatasetDicts, Parquet shards."""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq


def write_parquet(
    rows: dict, path, *, row_group_size: int | None = None, class_labels: dict | None = None
) -> str:
    """`rows` ({column: values}) as one Parquet file (several row groups if `row_group_size`).

    `class_labels` ({column: names}) marks int columns as `datasets` ClassLabels (a list column
    as a sequence of them) in the schema's "huggingface" metadata, as the Hub's files carry it.
    """
    os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
    table = pa.table(rows)
    if class_labels:
        features = {}
        for name, kind in zip(table.schema.names, table.schema.types):
            feature = {"dtype": str(kind), "_type": "Value"}
            if name in class_labels:
                feature = {"names": list(class_labels[name]), "_type": "ClassLabel"}
                if pa.types.is_list(kind):
                    feature = {"feature": feature, "_type": "Sequence"}
            features[name] = feature
        metadata = {"huggingface": json.dumps({"info": {"features": features}})}
        table = table.replace_schema_metadata(metadata)
    pq.write_table(table, path, row_group_size=row_group_size)
    return os.fspath(path)


def save_to_disk(rows: dict, directory, *, num_shards: int = 1, writer_batch_size: int = 2):
    """What `Dataset.save_to_disk(directory, num_shards=...)` writes: data-0000i-of-0000n.arrow
    in the Arrow IPC stream format (datasets' ArrowWriter: record batches of
    `writer_batch_size` rows, the features in the schema's "huggingface" metadata), state.json
    listing the files, and dataset_info.json."""
    os.makedirs(directory, exist_ok=True)
    table = pa.table(rows)
    features = {
        name: {"dtype": "string" if pa.types.is_string(t) else str(t), "_type": "Value"}
        for name, t in zip(table.schema.names, table.schema.types)
    }
    schema = table.schema.with_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})}
    )
    per_shard = -(-table.num_rows // num_shards)
    names = [f"data-{i:05d}-of-{num_shards:05d}.arrow" for i in range(num_shards)]
    for i, name in enumerate(names):
        shard = table.slice(i * per_shard, per_shard).cast(schema)
        with pa.OSFile(os.path.join(directory, name), "wb") as sink:
            with pa.ipc.new_stream(sink, schema) as writer:
                for batch in shard.to_batches(max_chunksize=writer_batch_size):
                    writer.write_batch(batch)
    state = {
        "_data_files": [{"filename": n} for n in names],
        "_fingerprint": "0123456789abcdef",
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    with open(os.path.join(directory, "state.json"), "w") as f:
        json.dump(state, f, indent=2, sort_keys=True)
    with open(os.path.join(directory, "dataset_info.json"), "w") as f:
        json.dump({"citation": "", "description": "", "features": features}, f, indent=2)
    return os.fspath(directory)


def save_dataset_dict(splits: dict, directory, **kwargs) -> str:
    """What `DatasetDict.save_to_disk(directory)` writes: dataset_dict.json naming the splits
    and one `save_to_disk` directory per split."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "dataset_dict.json"), "w") as f:
        json.dump({"splits": list(splits)}, f)
    for name, rows in splits.items():
        save_to_disk(rows, os.path.join(directory, name), **kwargs)
    return os.fspath(directory)
