"""Using a trained model of any family: embeddings, predictions and reranking scores of a
corpus, attention maps, search, fusion of searches.

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
    python -m bert_jax.inference search --model DIR --queries dev.jsonl --corpus corpus.jsonl \\
        --qrels dev_qrels.jsonl --output run.jsonl
    python -m bert_jax.inference search --index bm25 --queries dev.jsonl --corpus corpus.jsonl \\
        --output bm25.jsonl --top_k 100
    python -m bert_jax.inference fuse --runs bm25.jsonl run.jsonl --output fused.jsonl

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
`search` writes each query's top k corpus ids and scores (exact cosine search, or BM25 with
--index bm25; with --qrels, nDCG@10, MRR@10 and Recall@100 as sentence-transformers'
evaluator); `fuse` combines such runs by reciprocal rank fusion. More: docs/inference.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import jax

from bert_jax.inference import bulk, commands
from bert_jax.inference.commands import base
from bert_jax.parallel import compile_cache, multihost


def _parser() -> argparse.ArgumentParser:
    """The command line: a subcommand per registered command (`commands.COMMANDS`), each with
    the flags it adds."""
    parser = argparse.ArgumentParser(
        prog="python -m bert_jax.inference",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in commands.COMMANDS.values():
        command.add_arguments(sub.add_parser(command.name, help=command.help))
    return parser


def _run_bulk(command: base.Command, args: argparse.Namespace) -> None:
    """`command` over a corpus into an --output folder (`bulk`), on one process or many."""
    multihost.initialize_job(args.coordinator_address, args.num_processes, args.process_id)
    compile_cache.enable_compilation_cache(args.compilation_cache_dir)
    job = bulk.Job(
        command=command.name,
        model=args.model,
        input=args.input,
        output=args.output,
        text_column=args.text_column,
        id_column=args.id_column,
        options=command.bulk.options(args),
        batch_size=args.batch_size,
        max_seq_length=args.max_seq_length,
        pack=args.pack,
        progress=not args.no_progress,
    )
    with multihost.guard():
        summary = bulk.run(job)
    if jax.process_index() == 0:
        print(summary.line(command.name))


def _run(command: base.Command, args: argparse.Namespace) -> None:
    """The command's one-file form (--output NAME.npy / NAME.jsonl, as it takes), or its bulk
    form into an --output folder."""
    if command.bulk is None or base.is_single_file(args, command.bulk.file_suffixes):
        command.run(args)
    else:
        _run_bulk(command, args)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line (`argv`, default sys.argv); 1 after an error it printed, else 0."""
    args = _parser().parse_args(argv)
    try:
        _run(commands.COMMANDS[args.command], args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from bert_jax import cli  # a user's mistake: `error: <message>`, status 1; Ctrl-C: 130

    sys.exit(cli.run(main))
