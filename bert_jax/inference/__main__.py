"""Using a trained model of any family: embeddings, predictions and reranking scores of a
corpus, attention maps.

    python -m bert_jax.inference embed --model DIR --input 'corpus/*.parquet' --text_column=text \\
        --id_column=id --output emb/
    python -m bert_jax.inference predict --model runs/genre --input 'docs/*.jsonl' --output preds/
    python -m bert_jax.inference embed --model DIR --input texts.txt --output emb.npy --pooling mean
    python -m bert_jax.inference predict --model runs/genre --input lines.txt --output preds.jsonl
    python -m bert_jax.inference rerank --model ce-dir --input 'in/*.parquet' --query_column=q \\
        --text_column=p --id_column=id --output scores/
    python -m bert_jax.inference rerank --model ce-dir --input pairs.txt --output scores.jsonl
    python -m bert_jax.inference attention --model DIR --text "Fair is foul" --layer 2 --head 0 \\
        --output attention.png
    python -m bert_jax.inference fill-mask --model runs/pretrain_tiny "to be or not to [MASK] ..."
    python -m bert_jax.inference fill-mask --model roberta-run "to be or not to <mask> ..."

`--model` is a Hugging Face directory, a bert_jax export, a train.py or fine-tuning workdir, of any
model family; the tokenizer is taken from beside it. `embed` and `attention` run the encoder of
whatever head it holds; `predict` needs a sequence classifier, `rerank` a cross-encoder (one
output, such as a sentence-transformers CrossEncoder directory), `fill-mask` a masked-LM head (the
tokenizer's own mask token). `embed` of a sentence-transformers directory pools, normalizes and
truncates as it says; elsewhere the defaults are CLS pooling, no normalization, 128 tokens.
`rerank` writes each (query, passage) pair's `score` (float32), as `CrossEncoder(DIR).predict`:
the logit through the directory's activation (sigmoid where it names none), up to its
max_seq_length (else the model's longest) tokens a pair.

Over a corpus (an --output folder): Parquet, Arrow, JSONL, CSV/TSV or text files (a glob, a folder;
local or gs://) in, one Parquet shard out per input shard, on one or many processes (train.py's
flags), resumable (`bert_jax.inference.bulk`). With --output NAME.npy (embed) or NAME.jsonl, one
UTF-8 text file in (one text a line; a tab separates a pair's texts, rerank's query and passage),
one file out, row i for line i; rerank writes {"query", "text", "score"} lines or float32 [N]
scores. A blank line before the last text, or bytes that are not UTF-8, are errors naming the line.
More: docs/inference.md.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Sequence

import jax
import numpy as np

from bert_jax import paths
from bert_jax.inference import (
    POOLINGS,
    attention_map,
    bulk,
    embed,
    embedding_options,
    fill_mask,
    heads,
    load,
    load_cross_encoder,
    load_embedder,
    load_masked_lm,
    predict,
    read_texts,
)
from bert_jax.parallel import compile_cache, multihost


def _parser() -> argparse.ArgumentParser:
    """The command line: the subcommands embed, predict, rerank, attention and fill-mask."""
    parser = argparse.ArgumentParser(
        prog="python -m bert_jax.inference",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("embed", help="embeddings of a text file into .npy")
    e.add_argument(
        "--pooling",
        choices=POOLINGS,
        default=None,
        help="default: a sentence-transformers directory's, else cls",
    )
    e.add_argument(
        "--normalize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="unit-length embeddings; default: a sentence-transformers directory's, else no",
    )
    e.add_argument("--layers", default="", help="comma-separated hidden-state indices, e.g. -1,-2")
    p = sub.add_parser("predict", help="labels of a text file with a fine-tuned classifier")
    r = sub.add_parser("rerank", help="scores of (query, passage) pairs with a cross-encoder")
    a = sub.add_parser("attention", help="a heat map PNG of one layer's head's attention")
    a.add_argument("--text", required=True)
    a.add_argument("--layer", type=int, required=True)
    a.add_argument("--head", type=int, required=True)
    f = sub.add_parser(
        "fill-mask",
        help="the most probable tokens for each mask token of a text (the tokenizer's own: "
        "[MASK] for BERT and ModernBERT, <mask> for RoBERTa and XLM-R)",
    )
    f.add_argument(
        "texts",
        nargs="+",
        help="texts with the tokenizer's mask token in them ([MASK] or <mask>; [MASK] is read "
        "as <mask> where the model's vocabulary has no [MASK])",
    )
    f.add_argument("--top_k", type=int, default=5)
    f.add_argument("--json", action="store_true", help="print JSON lines, one per text")
    for s in (e, p, r, a, f):
        s.add_argument("--model", required=True, help="checkpoint or run directory")
    for s in (e, p, r, a):
        s.add_argument("--output", required=True)
    for s in (e, p, r):
        s.add_argument(
            "--input",
            required=True,
            help="a glob, folder or file of Parquet/Arrow/JSONL/CSV/text rows (local or gs://); "
            "with --output *.npy / *.jsonl: one UTF-8 text file, one text (rerank: a query, a "
            "tab, a passage) a line",
        )
        s.add_argument("--batch_size", type=int, default=64)
        s.add_argument(
            "--max_seq_length",
            type=int,
            default=None if s is not p else 128,
            help="tokens kept per text"
            + {
                e: "; default: a sentence-transformers directory's, else 128",
                p: "",
                r: " pair; default: the directory's, else the model's longest",
            }[s],
        )
        s.add_argument(
            "--text_column",
            default="text",
            help="the text of each row" + (" (the passage)" if s is r else ""),
        )
        s.add_argument("--id_column", help="copied to the output rows (default: file and row)")
        s.add_argument(
            "--pack",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="texts several to a row, each read from its own tokens (the same outputs "
            "within float32 rounding, from fewer padding tokens); --no-pack: one a row",
        )
        s.add_argument("--no_progress", action="store_true", help="no progress bar")
        s.add_argument("--coordinator_address", help="host:port of process 0 (multi-process)")
        s.add_argument("--num_processes", type=int, help="processes in a multi-process run")
        s.add_argument("--process_id", type=int, help="this process's index in the run")
        s.add_argument(
            "--compilation_cache_dir",
            default="auto",
            help="persistent XLA compilation cache, as train.py's: 'auto', a directory, or 'off'",
        )
    p.add_argument("--text_pair_column", help="each row's second text (a pair classifier)")
    r.add_argument("--query_column", help="each row's query (needed with an --output folder)")
    return parser


def _is_single_file(args: argparse.Namespace) -> bool:
    """The one-text-file form: --output NAME.npy (embed), NAME.jsonl (predict) or either
    (rerank)."""
    suffix = {"embed": (".npy",), "predict": (".jsonl",)}.get(args.command, (".npy", ".jsonl"))
    if not args.output.endswith(suffix):
        return False
    if args.input.lower().endswith((".parquet", ".arrow", ".jsonl", ".json", ".csv", ".tsv")):
        raise ValueError(
            f"--output {args.output} writes one file from one text file; for {args.input} give "
            "an output folder (Parquet shards)"
        )
    return True


def _run_bulk(args: argparse.Namespace) -> None:
    """`embed`/`predict`/`rerank` into an --output folder (`bulk`), on one process or many."""
    multihost.initialize_job(args.coordinator_address, args.num_processes, args.process_id)
    compile_cache.enable_compilation_cache(args.compilation_cache_dir)
    layers = getattr(args, "layers", "")
    job = bulk.Job(
        command=args.command,
        model=args.model,
        input=args.input,
        output=args.output,
        text_column=args.text_column,
        text_pair_column=getattr(args, "text_pair_column", None),
        query_column=getattr(args, "query_column", None),
        id_column=args.id_column,
        pooling=getattr(args, "pooling", None),
        normalize=getattr(args, "normalize", None),
        layers=tuple(int(x) for x in layers.split(",")) if layers else None,
        batch_size=args.batch_size,
        max_seq_length=args.max_seq_length,
        pack=args.pack,
        progress=not args.no_progress,
    )
    with multihost.guard():
        summary = bulk.run(job)
    if jax.process_index() == 0:
        print(summary.line(args.command))


def _run_embed(args: argparse.Namespace) -> None:
    """`embed`: writes the --input lines' float32 [N, E] (or [N, len(layers), E]) embeddings."""
    if not _is_single_file(args):
        return _run_bulk(args)
    config, params, tokenizer, settings = load_embedder(args.model)  # any head's encoder
    options, warnings = embedding_options(
        settings,
        pooling=args.pooling,
        normalize=args.normalize,
        max_seq_length=args.max_seq_length,
    )
    for warning in warnings:
        print(f"warning: {args.model}: {warning}", file=sys.stderr)
    texts, _ = read_texts(args.input)
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    emb = embed(
        config,
        params,
        tokenizer,
        texts,
        pooling=options.pooling,
        normalize=options.normalize,
        layers=layers,
        batch_size=args.batch_size,
        max_seq_length=options.max_seq_length,
        pack=args.pack,
    )
    paths.write_bytes_whole(args.output, _npy_bytes(emb))
    print(f"wrote {emb.shape} embeddings to {args.output}")


def _npy_bytes(array: np.ndarray) -> bytes:
    """`array` as the bytes of a .npy file (`np.save`'s), to be written whole to a path or URL."""
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _run_predict(args: argparse.Namespace) -> None:
    """`predict`: writes a JSON line per --input line, its text and prediction, to --output."""
    if not _is_single_file(args):
        return _run_bulk(args)
    config, params, name, tokenizer = load(args.model)
    texts, texts_b = read_texts(args.input)
    rows = predict(
        config,
        params,
        name,
        tokenizer,
        texts,
        texts_b,
        batch_size=args.batch_size,
        max_seq_length=args.max_seq_length,
        pack=args.pack,
    )
    lines = (json.dumps({"text": text, **row}) + "\n" for text, row in zip(texts, rows))
    paths.write_text_whole(args.output, "".join(lines))
    print(f"wrote {len(rows)} predictions to {args.output}")


def _run_rerank(args: argparse.Namespace) -> None:
    """`rerank`: writes each --input line's (query<TAB>passage) score to --output: a JSON line
    {"query", "text", "score"} (.jsonl), or float32 [N] (.npy)."""
    if not _is_single_file(args):
        return _run_bulk(args)
    if args.query_column:
        raise ValueError(
            f"--query_column is for tables; {args.input} is one text file: a query, a tab and "
            "its passage on each line"
        )
    ce = load_cross_encoder(args.model)
    heads.cross_encoder(ce.config, ce.head)  # one output, before reading the input
    queries, passages = read_texts(args.input)
    if passages is None:
        line = next(i for i, q in enumerate(queries, start=1) if "\t" not in q)
        raise ValueError(
            f"{args.input}: line {line} has no tab; rerank reads a query, a tab and its "
            "passage on every line"
        )
    rows = predict(
        ce.config,
        ce.params,
        ce.head,
        ce.tokenizer,
        queries,
        passages,
        batch_size=args.batch_size,
        max_seq_length=min(ce.pair_length(args.max_seq_length), ce.config.max_sequence_length),
        pack=args.pack,
        activation=ce.activation,
    )
    scores = np.array([row["score"] for row in rows], np.float32)
    if args.output.endswith(".npy"):
        paths.write_bytes_whole(args.output, _npy_bytes(scores))
    else:
        lines = (
            json.dumps({"query": query, "text": text, "score": float(score)}) + "\n"
            for query, text, score in zip(queries, passages, scores)
        )
        paths.write_text_whole(args.output, "".join(lines))
    print(f"wrote {len(scores)} scores to {args.output}")


def _run_fill_mask(args: argparse.Namespace) -> None:
    """`fill-mask`: prints each text's top --top_k tokens per mask, each as the text it reads
    as, its piece beside it where that differs ("less (Ġless)"); JSON lines with --json."""
    config, params, head, tokenizer = load_masked_lm(args.model)
    results = fill_mask(config, params, tokenizer, args.texts, head=head, top_k=args.top_k)
    for text, masks in zip(args.texts, results):
        if args.json:
            print(json.dumps({"text": text, "masks": masks}))
            continue
        print(text)
        for j, candidates in enumerate(masks):
            guesses = "  ".join(f"{_guess(c)} {c['score']:.3f}" for c in candidates)
            print(f"  {tokenizer.mask_token} {j + 1}: {guesses}")


def _guess(candidate: dict) -> str:
    """A fill-mask candidate as its text, with its token piece where that reads otherwise."""
    text, piece = candidate["text"], candidate["token"]
    return text if text == piece else f"{text} ({piece})"


def _run_attention(args: argparse.Namespace) -> None:
    """`attention`: writes the heat map PNG of --layer's --head on --text to --output."""
    config, params, _, tokenizer = load(args.model)  # any head: its encoder is used
    attention_map(config, params, tokenizer, args.text, args.layer, args.head, args.output)
    print(f"wrote {args.output}")


_COMMANDS = {
    "embed": _run_embed,
    "predict": _run_predict,
    "rerank": _run_rerank,
    "fill-mask": _run_fill_mask,
    "attention": _run_attention,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line (`argv`, default sys.argv); 1 after an error it printed, else 0."""
    args = _parser().parse_args(argv)
    try:
        _COMMANDS[args.command](args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from bert_jax import cli  # a user's mistake: `error: <message>`, status 1; Ctrl-C: 130

    sys.exit(cli.run(main))
