"""Bulk inference as a job (`python -m bert_jax.inference embed|predict --output FOLDER`): Parquet,
JSONL and text shards in, one Parquet shard out per input, each row equal to the model applied
directly; reruns skip finished shards, redo those whose input changed and compare the settings
as used (a folder without finished shards takes new ones); bad rows named by file and row; a
bucket as the output; a failure (and, e2e, a SIGKILL) then a rerun equal to one run, its
progress bar ended before the error line; 2 processes x 4 devices equal to 1 process (e2e: the
subprocesses take about a minute on 2 cores)."""

import json
import os
import signal
import subprocess
import sys
import time

import flax.linen as nn
import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bert_jax import convert, inference, tokenization
from bert_jax.inference.__main__ import main
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.families import get_model_class
from bert_jax.models.modernbert.config import ModernBertConfig
from bert_jax.models.params import init_params
from tests import faults

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORDS = "when shall we three meet again in thunder lightning or rain fair is foul and".split()
LABELS = ("comedy", "history", "tragedy")
FLAGS = ["--batch_size=8", "--no_progress", "--compilation_cache_dir=off"]


def make_texts(n: int, seed: int) -> list[str]:
    """n texts of 1 to 20 words (several length buckets)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(1, 21))) for _ in range(n)]


class Models:
    """A BERT encoder and a ModernBERT classifier with random weights, saved as transformers
    saves them, and their shared tokenizer."""

    def __init__(self, root):
        self.tokenizer = tokenization.train_wordpiece([" ".join(WORDS)] * 3, 60, min_frequency=1)
        vocab = self.tokenizer.vocab_size
        bert = BertConfig(
            vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=64,
        )  # fmt: skip
        modern = ModernBertConfig(
            vocab_size=vocab, pad_token_id=0, hidden_size=32, intermediate_size=48,
            num_hidden_layers=2, num_attention_heads=4, global_attn_every_n_layers=2,
            local_attention=4, max_position_embeddings=64, classifier_pooling="mean",
            initializer_range=0.2, num_labels=3, label_names=LABELS,
        )  # fmt: skip
        self.encoder = self._save(root / "bert", bert, "BertModel")
        self.classifier = self._save(
            root / "modernbert", modern, "ModernBertForSequenceClassification"
        )

    def _save(self, path, config, head) -> str:
        params = init_params(get_model_class(head)(config), jax.random.PRNGKey(0))
        convert.save_pytorch(config, jax.device_get(nn.meta.unbox(params)), path, head)
        self.tokenizer.save(path)
        return str(path)

    def embeddings(self, texts, pooling="mean"):
        config, params, _, tokenizer = inference.load(self.encoder)
        return inference.embed(config, params, tokenizer, texts, pooling=pooling)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return Models(tmp_path_factory.mktemp("models"))


def write_parquet(path, ids, texts):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "text": texts}), path)


def make_corpus(root, sizes=(13, 0, 21, 6)) -> dict[int, str]:
    """Parquet shards of `sizes` rows (ids counted across them; one shard empty), in two
    folders; returns id -> text."""
    texts, start = {}, 0
    for k, n in enumerate(sizes):
        ids = list(range(start, start + n))
        batch = make_texts(n, seed=k)
        write_parquet(str(root / ("a" if k < 2 else "b") / f"part-{k}.parquet"), ids, batch)
        texts.update(zip(ids, batch))
        start += n
    return texts


def read_rows(out) -> dict:
    """id -> embedding of every output shard, checking that no id appears twice."""
    rows = {}
    for dirpath, _, files in os.walk(out):
        for name in sorted(f for f in files if f.endswith(".parquet")):
            table = pq.read_table(os.path.join(dirpath, name)).to_pydict()
            for i, e in zip(table["id"], table["embedding"]):
                assert i not in rows, f"id {i} written twice"
                rows[i] = np.asarray(e, np.float32)
    return rows


def check_rows(rows: dict, texts: dict, models, atol=1e-5):
    assert sorted(rows) == sorted(texts)
    ids = sorted(texts)
    expected = models.embeddings([texts[i] for i in ids])
    np.testing.assert_allclose(np.stack([rows[i] for i in ids]), expected, atol=atol)


def embed_argv(inputs, out, *extra):
    return ["embed", "--input", str(inputs), "--output", str(out), *FLAGS, *extra]


def test_embed_parquet_shards_then_rerun_skips_them(models, tmp_path, capsys):
    texts = make_corpus(tmp_path / "in")
    out = tmp_path / "out"
    argv = embed_argv(tmp_path / "in", out, "--model", models.encoder, "--id_column=id")
    assert main([*argv, "--pooling=mean"]) == 0
    # One output shard per input shard, under the same relative names; the empty one too.
    shards = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.parquet"))
    assert shards == [
        "a/part-0.parquet",
        "a/part-1.parquet",
        "b/part-2.parquet",
        "b/part-3.parquet",
    ]
    table = pq.read_table(out / "b" / "part-2.parquet")
    assert table.column_names == ["id", "embedding"]
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 32)
    assert table.column("id").to_pylist() == list(range(13, 34))  # input order
    assert pq.read_table(out / "a" / "part-1.parquet").num_rows == 0
    assert json.loads(table.schema.metadata[b"bert_jax"])["pooling"] == "mean"
    check_rows(read_rows(out), texts, models)
    line = capsys.readouterr().out
    assert "embed: 40 rows" in line and "tokens/s" in line and f"written to {out}" in line

    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")}
    assert main([*argv, "--pooling=mean"]) == 0
    line = capsys.readouterr().out
    assert "embed: 0 rows" in line and "0 shard(s) written (4 done before, skipped)" in line
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")} == mtimes
    # Packing changes no row beyond float rounding: not a setting a rerun must keep.
    assert main([*argv, "--pooling=mean", "--no-pack"]) == 0
    assert "4 done before, skipped" in capsys.readouterr().out
    unpacked = embed_argv(tmp_path / "in", tmp_path / "unpacked", "--model", models.encoder)
    assert main([*unpacked, "--id_column=id", "--pooling=mean", "--no-pack"]) == 0
    check_rows(read_rows(tmp_path / "unpacked"), texts, models)
    # Other settings into the same folder: an error naming them; nothing rewritten.
    assert main([*argv, "--pooling=cls"]) == 1
    assert "pooling: 'mean' before, 'cls' now" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.parquet")} == mtimes


def test_predict_jsonl_and_text_files_with_modernbert(models, tmp_path):
    texts = make_texts(11, seed=5)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts[:6])
    )
    (tmp_path / "in" / "y.txt").write_text("\n".join(texts[6:]) + "\n")
    out = tmp_path / "out"
    argv = ["predict", "--model", models.classifier, "--input", str(tmp_path / "in" / "*")]
    assert main([*argv, "--output", str(out), *FLAGS]) == 0
    config, params, head, tokenizer = inference.load(models.classifier)
    expected = inference.predict(config, params, head, tokenizer, texts)
    got = []
    for name in ("x.parquet", "y.parquet"):
        table = pq.read_table(out / name)
        assert table.column_names == ["file", "row", "label", "probabilities"]
        # Each probability names its label, as the JSONL form does: a float32 field per label.
        probabilities = table.schema.field("probabilities").type
        assert [(f.name, f.type) for f in probabilities] == [(n, pa.float32()) for n in LABELS]
        meta = json.loads(table.schema.metadata[b"bert_jax"])
        assert meta["label_names"] == list(LABELS) and meta["command"] == "predict"
        rows = table.to_pylist()
        assert [r["row"] for r in rows] == list(range(len(rows)))
        assert {r["file"] for r in rows} == {
            str(tmp_path / "in" / name.replace("parquet", "jsonl" if name[0] == "x" else "txt"))
        }
        got.extend(rows)
    assert [r["label"] for r in got] == [e["label"] for e in expected]
    assert [list(r["probabilities"]) for r in got] == [list(LABELS)] * len(texts)
    np.testing.assert_allclose(
        [[r["probabilities"][n] for n in LABELS] for r in got],
        [[e["probabilities"][n] for n in LABELS] for e in expected],
        atol=1e-5,
    )


def test_a_row_without_text_is_named_and_finished_shards_are_kept(models, tmp_path, capsys):
    write_parquet(str(tmp_path / "in" / "part-0.parquet"), [0, 1], make_texts(2, 0))
    write_parquet(str(tmp_path / "in" / "part-1.parquet"), [10, 11, 12], ["a b", None, "c"])
    out = tmp_path / "out"
    argv = embed_argv(tmp_path / "in" / "*.parquet", out, "--model", models.encoder)
    assert main([*argv, "--id_column=id"]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'in' / 'part-1.parquet'}: row 1 (id 11) has a null in column 'text'" in err
    assert sorted(os.listdir(out)) == ["_job.json", "part-0.parquet"]  # no partial file
    # Without ids, the row alone; an empty text and a missing column named too.
    (tmp_path / "in2").mkdir()
    (tmp_path / "in2" / "t.jsonl").write_text('{"text": "a"}\n{"text": ""}\n')
    assert main([*embed_argv(tmp_path / "in2", tmp_path / "o2", "--model", models.encoder)]) == 1
    assert "t.jsonl: row 1 has an empty text in column 'text'" in capsys.readouterr().err
    argv = embed_argv(tmp_path / "in2", tmp_path / "o3", "--model", models.encoder)
    assert main([*argv, "--text_column=body"]) == 1
    assert "body" in capsys.readouterr().err
    assert not list((tmp_path / "o2").glob("*.parquet"))


def test_a_bucket_in_and_out(models, fake_bucket, tmp_path):
    from tests.conftest import BUCKET

    root, seen = fake_bucket
    texts = make_corpus(root / "in", sizes=(5, 7))
    argv = embed_argv(f"{BUCKET}/in/*/*.parquet", f"{BUCKET}/emb", "--model", models.encoder)
    assert main([*argv, "--id_column=id", "--pooling=mean"]) == 0
    assert f"{BUCKET}/emb/part-1.parquet" in seen  # both inputs are in in/a
    assert not (tmp_path / "gs:").exists()  # never a local folder named after the URL
    check_rows(read_rows(root / "emb"), texts, models)


def test_a_failure_after_the_first_shard_then_a_rerun_equals_one_run(models, tmp_path, monkeypatch):
    from bert_jax.inference import bulk

    texts = make_corpus(tmp_path / "in")
    job = embed_argv(tmp_path / "in", tmp_path / "out", "--model", models.encoder, "--id_column=id")
    write_shard = bulk._write_shard

    def crash_after_one(*args, **kwargs):
        write_shard(*args, **kwargs)
        raise faults.InjectedFault("stopped after one shard")

    monkeypatch.setattr(bulk, "_write_shard", crash_after_one)
    with pytest.raises(faults.InjectedFault):
        main([*job, "--pooling=mean"])
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "out").rglob("*.parquet")] == ["part-0.parquet"]
    # What a SIGKILL leaves: a shard's temporary file (and the lock, taken over: see below).
    (tmp_path / "out" / "b").mkdir()
    (tmp_path / "out" / "b" / ".part-2.parquet.k1ll3d.tmp").write_bytes(b"PAR1 half a shard")
    assert main([*job, "--pooling=mean"]) == 0
    assert not list((tmp_path / "out").rglob("*.tmp"))
    check_rows(read_rows(tmp_path / "out"), texts, models)


def test_a_changed_input_is_redone_and_the_unchanged_kept(models, tmp_path, capsys, caplog):
    write_parquet(str(tmp_path / "in" / "part-0.parquet"), list(range(5)), make_texts(5, 0))
    write_parquet(str(tmp_path / "in" / "part-1.parquet"), [10, 11, 12], make_texts(3, 1))
    out = tmp_path / "out"
    argv = embed_argv(tmp_path / "in", out, "--model", models.encoder, "--id_column=id")
    argv.append("--pooling=mean")  # as check_rows computes them
    assert main(argv) == 0
    kept = (out / "part-1.parquet").stat().st_mtime_ns
    # part-0 grows from 5 rows to 8 (new ids and texts); part-1 stays as it was.
    texts = dict(zip(range(100, 108), make_texts(8, 7)))
    write_parquet(str(tmp_path / "in" / "part-0.parquet"), list(texts), list(texts.values()))
    capsys.readouterr()
    caplog.clear()
    assert main(argv) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [w.split(" changed since")[0] for w in warnings] == [
        str(tmp_path / "in" / "part-0.parquet")
    ]
    assert "1 shard(s) written (1 done before, skipped)" in capsys.readouterr().out
    assert (out / "part-1.parquet").stat().st_mtime_ns == kept
    texts.update(zip([10, 11, 12], make_texts(3, 1)))
    check_rows(read_rows(out), texts, models)
    # Unchanged since: a third run redoes nothing.
    assert main(argv) == 0
    assert "0 shard(s) written (2 done before, skipped)" in capsys.readouterr().out


def test_a_rerun_compares_the_effective_settings(models, tmp_path, capsys):
    write_parquet(str(tmp_path / "in" / "part-0.parquet"), [0, 1, 2], make_texts(3, 0))
    out = tmp_path / "out"
    argv = embed_argv(tmp_path / "in", out, "--model", models.encoder)
    assert main(argv) == 0
    capsys.readouterr()
    # The model's defaults spelled out (CLS, not normalized, 128 tokens cut to its 64
    # positions): the same job, so it proceeds (and skips the shard).
    assert main([*argv, "--pooling=cls", "--no-normalize", "--max_seq_length=64"]) == 0
    assert "1 done before, skipped" in capsys.readouterr().out
    record = json.loads((out / "_job.json").read_text())
    assert (record["pooling"], record["normalize"], record["max_seq_length"]) == ("cls", False, 64)
    # A setting that changes the rows: refused, naming it.
    assert main([*argv, "--max_seq_length=16"]) == 1
    assert "max_seq_length: 64 before, 16 now" in capsys.readouterr().err
    # float32 spelled out is the default (recorded as unset); bfloat16 changes the rows.
    assert main([*argv, "--dtype=float32"]) == 0 and record["dtype"] is None
    capsys.readouterr()
    assert main([*argv, "--dtype=bfloat16"]) == 1
    assert "dtype: None before, 'bfloat16' now" in capsys.readouterr().err


def test_a_rerun_after_a_job_that_wrote_nothing_may_change_its_settings(models, tmp_path, capsys):
    write_parquet(str(tmp_path / "in" / "part-0.parquet"), [0, 1, 2], ["a b", None, "c"])
    out = tmp_path / "out"
    argv = embed_argv(tmp_path / "in", out, "--model", models.encoder, "--id_column=id")
    # A bad column: an error before anything is written, so the corrected rerun proceeds.
    assert main([*argv, "--text_column=body"]) == 1
    assert "'body'" in capsys.readouterr().err
    # A job that failed in its first shard (a null text) wrote no shard: other settings may
    # follow it.
    assert main(argv) == 1
    assert "row 1 (id 1) has a null" in capsys.readouterr().err
    assert not list(out.glob("*.parquet"))
    write_parquet(str(tmp_path / "in" / "part-0.parquet"), [0, 1, 2], make_texts(3, 0))
    assert main([*argv, "--pooling=mean"]) == 0
    assert json.loads((out / "_job.json").read_text())["pooling"] == "mean"
    # Finished shards in the folder: other settings are refused, and nothing is rewritten.
    mtime = (out / "part-0.parquet").stat().st_mtime_ns
    capsys.readouterr()
    assert main([*argv, "--pooling=cls"]) == 1
    assert "pooling: 'mean' before, 'cls' now" in capsys.readouterr().err
    assert (out / "part-0.parquet").stat().st_mtime_ns == mtime


# Subprocesses (e2e): the multi-process job and a SIGKILL.


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "bert_jax.inference", *args]


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_two_processes_equal_one_and_a_kill_then_rerun_equals_one_run(models, tmp_path):
    from tests.parallel.multiprocess_test import TwoProcesses
    from tests.train_test import env

    texts = make_corpus(tmp_path / "in", sizes=(9, 0, 17, 6, 11))
    job = ["embed", "--model", models.encoder, "--input", str(tmp_path / "in"), "--id_column=id"]
    job += ["--pooling=mean", *FLAGS]
    # 2 processes x 4 devices: each takes its share of the shards; together every row, once.
    two = tmp_path / "two"
    TwoProcesses(lambda flags: cli(*job, "--output", str(two), *flags), tmp_path / "logs").check()
    check_rows(read_rows(two), texts, models)
    # One process, killed (SIGKILL) after its first shard, then the same command again.
    once = tmp_path / "once"
    e = {**env(4), faults.FAULT_ENV: "process=0,at=shard:1,sleep=600"}
    with open(tmp_path / "killed.err", "w") as err:
        proc = subprocess.Popen(faults.command(cli(*job, "--output", str(once))), env=e,
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
        deadline = time.monotonic() + 300
        while "sleeping" not in (tmp_path / "killed.err").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, (
                tmp_path / "killed.err"
            ).read_text()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert [p.name for p in once.rglob("*.parquet")] == ["part-0.parquet"]
    assert main([*job, "--output", str(once)]) == 0  # the killed run's lock is taken over
    assert read_rows(once).keys() == read_rows(two).keys()
    check_rows(read_rows(once), texts, models)


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_two_processes_that_cannot_reach_their_bucket_say_so_in_one_line_each(models, tmp_path):
    """`embed --input gs://... --num_processes=2` where the bucket cannot be reached (every
    request to a proxy at a closed port, as tests/paths_test.py's train.py case; the coordinator
    on 127.0.0.1 bypasses it): status 1 on both processes, the failing one's "error: cannot
    reach gs://..." line and each process's ending naming it; no traceback anywhere."""
    import socket

    from tests.parallel.multiprocess_test import TwoProcesses

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    proxies = {k: closed for k in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY")}
    extra = {**proxies, "no_proxy": "127.0.0.1,localhost", "NO_PROXY": "127.0.0.1,localhost"}
    extra.update(NO_GCE_CHECK="true", GCS_RETRY_CONFIG_MAX_RETRIES="0")
    job = ["embed", "--model", models.encoder, "--input", "gs://some-bucket/in/*.parquet"]
    job += ["--output", str(tmp_path / "out"), *FLAGS]
    two = TwoProcesses(lambda flags: cli(*job, *flags), tmp_path / "logs", extra_env=extra)
    assert two.wait() == [1, 1], two.last_output()
    said = "cannot reach gs://some-bucket/in: "
    errors = [two.output(i)[1] for i in range(2)]
    assert all("Traceback" not in err for err in errors), two.last_output()
    assert any(f"error: {said}" in err for err in errors), two.last_output()
    assert all(f"StorageUnreachableError: {said}" in err for err in errors), two.last_output()
    assert not (tmp_path / "out").exists()


def test_a_failed_job_ends_its_progress_bar_before_the_error_line(models, tmp_path):
    from tests.commands_test import clean_env

    write_parquet(str(tmp_path / "in" / "part-0.parquet"), [0, 1, 2], make_texts(3, 0))
    write_parquet(str(tmp_path / "in" / "part-1.parquet"), [10, 11], ["a b", None])
    (tmp_path / "home").mkdir()
    command = cli("embed", "--model", models.encoder, "--input", str(tmp_path / "in"),
                  "--output", str(tmp_path / "out"), "--id_column=id", "--batch_size=8",
                  "--compilation_cache_dir=off")  # fmt: skip
    proc = subprocess.run(command, env=clean_env(tmp_path / "home"), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert "embed" in proc.stderr and "rows" in proc.stderr  # the bar was shown
    assert lines[-1].startswith("error: ") and "row 1 (id 11) has a null" in lines[-1], lines[-5:]
