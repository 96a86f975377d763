"""`gs://` (any URL) work directories stay URLs: the run's config and its exports go through
`etils.epath`, never through a local path made from the URL (Orbax's own paths:
checkpointing_test).

A fake bucket (the `fake_bucket` fixture, tests/conftest.py): epath's backend is mocked so that
gs://bucket/... lands in a temporary directory, and every path it is asked for is recorded (no
network).
"""

import json
import os

import numpy as np
import pytest
from etils import epath

from bert_jax.checkpoints import hf
from bert_jax.training import experiment
from tests.common import TINY
from tests.conftest import BUCKET


def test_run_config_and_hf_export_to_a_bucket(fake_bucket, tmp_path):
    import ml_collections

    root, seen = fake_bucket
    config = ml_collections.ConfigDict({"seed": 3, "model": {"hidden_size": 32}})
    directory = experiment.write_config(config, f"{BUCKET}/run")
    assert os.fspath(directory) == f"{BUCKET}/run"
    assert '"seed": 3' in (root / "run" / "config.json").read_text()

    from flax import linen as nn

    from bert_jax.models.families import get_model_class
    from bert_jax.models.params import init_params

    params = nn.meta.unbox(init_params(get_model_class("BertModel")(TINY), np.uint32([0, 0])))
    out = hf.save_pytorch(TINY, params, f"{BUCKET}/run/hf", "BertModel")
    assert out == f"{BUCKET}/run/hf"
    assert sorted(p.name for p in (root / "run" / "hf").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
    # A second export refuses to overwrite, reading the bucket (not a local directory).
    with pytest.raises(FileExistsError, match="gs://bucket/run/hf already holds"):
        hf.save_pytorch(TINY, params, f"{BUCKET}/run/hf", "BertModel")
    assert not (tmp_path / "gs:").exists()
    assert f"{BUCKET}/run/hf/model.safetensors" in seen
    assert not [p for p in seen if "gs:/" in p and not p.startswith(BUCKET)]
    assert isinstance(directory, epath.Path)


def _no_local_url(tmp_path, seen):
    """Nothing became a local `gs:` folder, and every URL epath was asked for kept its scheme."""
    assert not (tmp_path / "gs:").exists()
    assert not [p for p in seen if "gs:/" in p and not p.startswith(BUCKET)]


def test_metric_writer_to_a_bucket(fake_bucket, tmp_path):
    from bert_jax.training import summaries

    root, seen = fake_bucket
    w = summaries.MetricWriter(f"{BUCKET}/run", total_steps=20, progress=False)
    w.write(10, {"train/loss": 8.0})
    w.write(10, {"eval/loss": 7.5, "eval/mlm_accuracy": 0.09})
    text = w.summary(10)
    w.close()
    assert (root / "run" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert f"metrics: {BUCKET}/run/metrics.jsonl" in text
    assert f"curves: {BUCKET}/run/curves.png" in text
    assert f"tensorboard --logdir {BUCKET}/run/tensorboard" in text
    assert _scalars(root / "run" / "tensorboard") == {
        ("train/loss", 10, 8.0),
        ("eval/loss", 10, 7.5),
        ("eval/mlm_accuracy", 10, 0.09),
    }

    # A resumed run reads its history from the bucket and adds to the same file.
    resumed = summaries.MetricWriter(
        f"{BUCKET}/run", total_steps=20, initial_step=10, progress=False
    )
    assert resumed.history["eval/mlm_accuracy"] == [(10, 0.09)]
    resumed.write(20, {"train/loss": 7.0})
    resumed.close()
    lines = (root / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [10, 10, 20]
    assert ("train/loss", 20, 7.0) in _scalars(root / "run" / "tensorboard")  # a second file
    assert f"{BUCKET}/run/metrics.jsonl" in seen
    _no_local_url(tmp_path, seen)


def _scalars(directory) -> set[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in the TensorBoard event files of `directory`."""
    from tensorboardX.proto import event_pb2

    from bert_jax.pretrain.data import records

    found = set()
    for path in sorted(directory.iterdir()):
        for data in records.iter_tfrecord(path):  # event files are TFRecord files
            event = event_pb2.Event.FromString(data)
            for value in event.summary.value:
                found.add((value.tag, event.step, round(value.simple_value, 6)))  # float32
    return found


def test_tokenizer_saved_to_a_bucket(fake_bucket, tmp_path, bert_tokenizer):
    from bert_jax import tokenization

    root, seen = fake_bucket
    bert_tokenizer.save(f"{BUCKET}/run/hf")
    assert sorted(p.name for p in (root / "run" / "hf").iterdir()) == [
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    # And read back from the bucket: a directory, its tokenizer.json, its vocab.txt.
    for where in ("run/hf", "run/hf/tokenizer.json", "run/hf/vocab.txt"):
        again = tokenization.load_tokenizer(f"{BUCKET}/{where}")
        assert again.vocab == bert_tokenizer.vocab, where
        assert again.encode("Hello there") == bert_tokenizer.encode("Hello there"), where
    assert f"{BUCKET}/run/hf/vocab.txt" in seen and f"{BUCKET}/run/hf/tokenizer.json" in seen
    with pytest.raises(FileNotFoundError, match="gs://bucket/run/nothing"):
        tokenization.load_tokenizer(f"{BUCKET}/run/nothing")
    _no_local_url(tmp_path, seen)


def test_finetuning_finds_the_tokenizer_beside_a_bucket_checkpoint(fake_bucket, bert_tokenizer):
    import ml_collections

    from bert_jax.finetune import run

    root, seen = fake_bucket
    bert_tokenizer.save(f"{BUCKET}/pretrain/hf")  # a train.py run directory keeps it in hf/
    config = ml_collections.ConfigDict(
        {"init_from": f"{BUCKET}/pretrain", "finetune": {"tokenizer": ""}}
    )
    assert run.find_tokenizer(config).vocab == bert_tokenizer.vocab
    assert f"{BUCKET}/pretrain/hf/tokenizer.json" in seen


def test_finetune_prediction_files_and_results_to_a_bucket(fake_bucket, tmp_path):
    from bert_jax.data.text_io import TextExample
    from bert_jax.finetune import glue, squad
    from bert_jax.finetune.task import write_rows
    from bert_jax.training import settings as finetune_settings

    root, seen = fake_bucket
    out = f"{BUCKET}/run/predictions"
    examples = [TextExample("7", ("a", "b"), None), TextExample("8", ("c", "d"), None)]
    assert glue.write_submission(out, "mrpc", examples, [1, 0]) == f"{out}/MRPC.tsv"
    write_rows(f"{out}/dev_predictions.tsv", [("7", 1, 0)], ("no", "yes"))
    result = squad.SquadPredictions({"q": "an answer"}, {"q": []}, None)
    assert squad.write_predictions(out, result)["predictions"] == f"{out}/predictions.json"
    finetune_settings.write_results({"task": "mrpc", "seeds": {"0": {"f1": 0.5}}}, f"{BUCKET}/run")
    assert sorted(p.name for p in (root / "run" / "predictions").iterdir()) == [
        "MRPC.tsv",
        "dev_predictions.tsv",
        "nbest_predictions.json",
        "predictions.json",
    ]
    assert (
        root / "run" / "predictions" / "MRPC.tsv"
    ).read_text() == "index\tprediction\n7\t1\n8\t0\n"
    assert "7\tyes\tno" in (root / "run" / "predictions" / "dev_predictions.tsv").read_text()
    assert json.loads((root / "run" / "results.json").read_text())["mean"] == {"f1": 0.5}
    assert f"{BUCKET}/run/results.json" in seen
    _no_local_url(tmp_path, seen)


def test_default_corpus_is_not_built_into_a_bucket(fake_bucket, tmp_path):
    import ml_collections

    from bert_jax.pretrain import inputs

    root, seen = fake_bucket
    config = ml_collections.ConfigDict({"data": {"build_dir": ""}})
    with pytest.raises(ValueError, match=r"cannot be built into gs://bucket/run/data: .* local"):
        inputs.ensure_default_corpus(config, f"{BUCKET}/run")
    config.data.build_dir = f"{BUCKET}/shards"
    with pytest.raises(ValueError, match="pass a local or shared data.build_dir"):
        inputs.ensure_default_corpus(config, str(tmp_path / "run"))
    assert not list(root.iterdir())
    _no_local_url(tmp_path, seen)


def test_tfrecord_shards_read_from_a_bucket(fake_bucket, tmp_path):
    """A TFRecord build at a URL (its directory, or a glob of its files) gives the batches of the
    same build read from local files."""
    import shutil

    from bert_jax import tokenization
    from bert_jax.pretrain.data import build, pipeline, sources

    root, seen = fake_bucket
    documents = sources.default_corpus_documents()[:4]
    tokenizer = tokenization.train_wordpiece(
        (s for d in documents for s in d), vocab_size=300, lowercase=True
    )
    options = build.PretrainingOptions(
        max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1, static_masking=False
    )
    local = tmp_path / "local"
    build.build_pretraining_shards(
        documents,
        local,
        tokenizer,
        options,
        num_shards=2,
        record_format="tfrecord",
        num_workers=1,
        progress=False,
    )
    shutil.copytree(local, root / "shards")

    def batches(paths):
        ds = pipeline.make_pretraining_dataset(
            paths, global_batch_size=8, seed=3, shard_index=0, shard_count=1
        )
        it = iter(ds)
        return [next(it) for _ in range(4)]

    want = batches(str(local))
    for paths in (f"{BUCKET}/shards", f"{BUCKET}/shards/pretrain-*.tfrecord"):
        seen.clear()
        got = batches(paths)
        for a, b in zip(want, got, strict=True):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=f"{paths}: {k}")
        assert any(p.endswith(".tfrecord") for p in seen)  # read through epath
    _no_local_url(tmp_path, seen)


def test_array_record_files_at_a_url_stop_the_run_at_start(fake_bucket, tmp_path):
    from bert_jax.pretrain import inputs
    from configs import pretrain

    root, seen = fake_bucket
    (root / "data").mkdir()
    (root / "data" / "train-0.array_record").write_bytes(b"not read")
    config = pretrain.get_config("size=tiny")
    config.data.source = "records"
    config.data.paths = f"{BUCKET}/data/train-*.array_record"
    with pytest.raises(
        ValueError,
        match=r"gs://bucket/data/train-0.array_record is an ArrayRecord file at a URL"
        r".*gcsfuse.*--format=tfrecord",
    ):
        inputs.pretraining_inputs(config, str(tmp_path), mesh=None)
    _no_local_url(tmp_path, seen)


def test_a_file_written_whole_gets_the_umask_permissions_not_mkstemps(tmp_path):
    from bert_jax import paths

    paths.write_file_whole(tmp_path / "f.bin", lambda p: open(p, "wb").write(b"x"))
    assert (tmp_path / "f.bin").stat().st_mode & 0o777 == 0o666 & ~paths._UMASK
    assert os.listdir(tmp_path) == ["f.bin"]
