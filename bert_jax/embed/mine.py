"""Hard negatives for the embedding job, mined by a model (`bert_jax.embed.mining`).

    python -m bert_jax.embed.mine --model DIR --pairs train.jsonl --output mined.jsonl \\
        [--corpus 'docs/*.parquet' --corpus_column text] --num_negatives 3 \\
        [--range_min 0 --range_max 100] [--absolute_margin X] [--relative_margin 0.05] \\
        [--max_score Z] [--min_score W] [--sampling_strategy top|random --seed 0] \\
        [--cross_encoder CE_DIR] [--search mesh|faiss] \\
        [--query_prompt_name NAME | --query_prompt TEXT] \\
        [--corpus_prompt_name NAME | --corpus_prompt TEXT] \\
        [--batch_size 64 --max_seq_length 0] [--overwrite] \\
        [--coordinator_address host:port --num_processes N --process_id i]

In: --pairs (JSONL, CSV or TSV with `anchor` and `positive`; their negatives are not read),
--corpus (further candidate texts, searched with the pairs' positives), --model (any checkpoint
with its tokenizer), --cross_encoder (a one-output classifier whose scores replace the cosine
similarities; it needs a margin, --max_score or --min_score). Out: --output, written whole, one
row per (anchor, positive) with anchor, positive, negative_1 .. negative_K: a pairs file for
`configs/embed.py`; anchors with fewer than K negatives are left out (counted in the log).
A model with prompts (config_sentence_transformers.json) embeds the anchors after its query
prompt and the candidates after its document prompt, as `mine_hard_negatives` does through
`encode_query` / `encode_document`; the prompt flags name or give others. The rows written hold
the texts without prompts.

The options have sentence-transformers' `mine_hard_negatives` meanings; details and many
processes (process 0 writes the file one process writes): docs/mining.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax import inference, paths
from bert_jax.data import tables
from bert_jax.embed import mining
from bert_jax.parallel import compile_cache, multihost
from bert_jax.retrieval import pairs as pairs_lib
from bert_jax.retrieval import records
from bert_jax.retrieval import search as search_lib


def text_embedders(
    model_dir: str,
    *,
    batch_size: int = 64,
    max_seq_length: int = 0,
    prompts: Mapping[str, str | None] | None = None,
) -> tuple[Callable[[list[str]], np.ndarray], Callable[[list[str]], np.ndarray]]:
    """(the anchors' embedder, the candidates'): texts -> float32 [N, E] embeddings of a
    checkpoint of any family, pooled and normalized as its sentence-transformers directory says
    (`inference.embedding_options`), each text after the prompt `mine_hard_negatives` puts
    before it: the one given, else the one named, else `encode_query`'s for the anchors and
    `encode_document`'s for the candidates (`resolve_prompt`). One function serves both sides
    where their prompts are the same.

    Args:
      model_dir: a checkpoint with its tokenizer; max_seq_length: tokens kept (0: the
        directory's, else 128); prompts: "query_prompt", "query_prompt_name",
        "corpus_prompt", "corpus_prompt_name" (the flags; None or absent: not given).

    Raises:
      FileNotFoundError: no such checkpoint, or no tokenizer beside it.
      ValueError: a SPLADE model (a SparseEncoder directory): mining searches dense embeddings;
        a prompt name the directory does not have (naming the flag).
    """
    model = inference.load_for_embedding(model_dir, max_seq_length=max_seq_length)
    if model.options.pooling == "splade":
        raise ValueError(
            f"{model_dir} is a SPLADE model; mining searches dense embeddings by cosine: mine "
            "with a dense embedder (the SPLADE job reads the negatives it writes)"
        )
    for warning in model.warnings:
        logging.warning("%s", warning)
    prompts = prompts or {}
    query, corpus = (
        model.for_task(
            task,
            *(prompts.get(f"{side}_{k}") for k in ("prompt_name", "prompt")),
            flag=f"--{side}_prompt_name",
        )  # fmt: skip
        for side, task in (("query", "query"), ("corpus", "document"))
    )
    logging.info("prompts: %r before anchors, %r before candidates",
                 query.options.prompt, corpus.options.prompt)  # fmt: skip

    def embedder(side: inference.EmbeddingModel) -> Callable[[list[str]], np.ndarray]:
        def embed_local(texts: list[str]) -> np.ndarray:
            return side.embed(texts, batch_size=batch_size)

        return lambda texts: shared(embed_local, texts)

    corpus_fn = embedder(corpus)
    if query.options.prompt == corpus.options.prompt:
        return corpus_fn, corpus_fn
    return embedder(query), corpus_fn


def pair_scorer(
    model_dir: str, *, batch_size: int = 64, max_seq_length: int = 0
) -> Callable[[list[str], list[str]], np.ndarray]:
    """(queries, passages) -> float32 [N] scores of a cross-encoder of any family, through its
    activation, as `sentence_transformers.CrossEncoder.predict` scores them.

    Args:
      model_dir: a one-output classifier with its tokenizer (`inference.load_cross_encoder`);
        max_seq_length: tokens a pair keeps (0: the directory's, else the model's positions).

    Raises:
      FileNotFoundError: no such checkpoint, or no tokenizer; ValueError: not one output.
    """
    ce = inference.load_cross_encoder(model_dir)
    inference.heads.cross_encoder(ce.config, ce.head)  # one output, before any text is read
    length = min(ce.pair_length(max_seq_length), ce.config.max_sequence_length)

    def score_local(pairs: list[tuple[str, str]]) -> np.ndarray:
        rows = inference.predict(
            *(ce.config, ce.params, ce.head, ce.tokenizer),
            [q for q, _ in pairs],
            [p for _, p in pairs],
            batch_size=batch_size,
            max_seq_length=length,
            activation=ce.activation,
        )
        return np.array([row["score"] for row in rows], np.float32)

    return lambda queries, passages: shared(score_local, list(zip(queries, passages)))


def shared(fn: Callable[[list], np.ndarray], items: list) -> np.ndarray:
    """`fn(items)`, float32 [N, ...], with the work split over the processes: each runs `fn` on
    its contiguous share (batches of the rows a 1-process run's would hold) and gathers the
    others' results, so every process returns the whole array."""
    count, me = jax.process_count(), jax.process_index()
    if count == 1:
        return fn(items)
    share = -(-len(items) // count)  # items per process; the last may hold fewer
    own = items[me * share : (me + 1) * share]
    local = np.asarray(fn(own or items[:1]), np.float32)[: len(own)]  # none: runs one, drops it
    block = np.zeros((share, *local.shape[1:]), np.float32)
    block[: len(own)] = local
    gathered = np.asarray(multihost_utils.process_allgather(block))  # [count, share, ...]
    return gathered.reshape(count * share, *local.shape[1:])[: len(items)]


def read_corpus(pattern: str, column: str) -> list[str]:
    """The texts in `column` of the data files `pattern` names (`data.tables`), in file order.

    Raises:
      FileNotFoundError: the pattern matches nothing; ValueError: a missing column, a value that
        is not a text (naming the file and row).
    """
    texts = []
    for path in tables.expand_inputs(pattern):
        for start, batch in tables.iter_column_batches(path, [column]):
            for row, value in enumerate(batch[column], start=start):
                if not isinstance(value, str):
                    raise ValueError(
                        f"{path}: row {row}: --corpus_column {column!r} holds {value!r:.60}, "
                        "not a text"
                    )
                texts.append(value)
    return texts


def check_output(path: str, overwrite: bool) -> None:
    """Raises unless `path` is a pairs file name (.jsonl/.csv/.tsv) that may be written."""
    records.format_of(path)
    if paths.as_path(path).exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass --overwrite to replace it")


def write_mined(mined: mining.Mined, path: str, *, overwrite: bool = False) -> None:
    """Writes the rows whole (`paths.write_text_whole`) as `pairs.read_pairs` reads them:
    anchor, positive, negative_1 .. negative_K, in JSONL, CSV or TSV by the file's suffix."""
    check_output(path, overwrite)
    if not mined.anchors:
        raise ValueError(
            f"no anchor has {mined.negative_scores.shape[1]} negatives: nothing to write"
        )
    fmt = records.format_of(path)
    header = ["anchor", "positive"] + [f"negative_{i + 1}" for i in range(len(mined.negatives[0]))]
    rows = [[a, p, *n] for a, p, n in zip(mined.anchors, mined.positives, mined.negatives)]
    if fmt == "jsonl":
        text = "".join(json.dumps(dict(zip(header, r)), ensure_ascii=False) + "\n" for r in rows)
    elif fmt == "tsv":
        bad = next((t for r in rows for t in r if any(c in t for c in "\t\n\r")), None)
        if bad is not None:
            raise ValueError(f"{path}: a text holds a tab or line break ({bad!r:.60}); use .jsonl")
        text = "".join("\t".join(r) + "\n" for r in [header, *rows])
    else:
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows([header, *rows])
        text = out.getvalue()
    paths.write_text_whole(path, text)


def _parser() -> argparse.ArgumentParser:
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m bert_jax.embed.mine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--model", required=True, help="checkpoint directory with its tokenizer")
    add("--pairs", required=True, help="the anchor/positive pairs (.jsonl, .csv, .tsv)")
    add("--output", required=True, help="the mined pairs file (.jsonl, .csv, .tsv)")
    add("--corpus", default=None, help="further candidate texts: data files, a glob or folder")
    add("--corpus_column", default=tables.TEXT_COLUMN, help="the text column of --corpus")
    add("--num_negatives", type=int, default=3, help="negatives per anchor (K)")
    add("--range_min", type=int, default=0, help="skip this many best candidates")
    add("--range_max", type=int, default=None, help="consider this many best candidates")
    add("--absolute_margin", type=float, default=None, help="keep score <= positive - X")
    add("--relative_margin", type=float, default=None, help="keep score <= positive - |pos| Y")
    add("--max_score", type=float, default=None, help="keep score <= Z")
    add("--min_score", type=float, default=None, help="keep score >= W")
    add("--sampling_strategy", choices=mining.STRATEGIES, default="top")
    add("--seed", type=int, default=0, help="the random strategy's seed")
    add(
        "--exclude_anchor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="never take an anchor's own text as its negative (sentence-transformers does)",
    )
    add(
        "--cross_encoder",
        default=None,
        help="a cross-encoder whose scores of the candidates and positives the filters use",
    )
    add(
        "--search",
        choices=tuple(search_lib.SEARCHES),
        default="mesh",
        help="mesh: exact top-k on the devices; faiss: exact, on the host (a larger corpus)",
    )
    for side, what in (("query", "the anchors"), ("corpus", "the positives and --corpus")):
        add(f"--{side}_prompt_name", default=None, help=f"the model's prompt for {what}")
        add(f"--{side}_prompt", default=None, help=f"a prompt text for {what}")
    add("--batch_size", type=int, default=64, help="texts (pairs) embedded (scored) per batch")
    add("--max_seq_length", type=int, default=0, help="tokens per text; 0: the model's")
    add("--overwrite", action="store_true", help="replace an existing --output")
    add("--coordinator_address", help="host:port of process 0 (multi-process)")
    add("--num_processes", type=int, help="processes in a multi-process run")
    add("--process_id", type=int, help="this process's index in the run")
    add(
        "--compilation_cache_dir",
        default="auto",
        help="persistent XLA compilation cache, as train.py's: 'auto', a directory, or 'off'",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Mines --pairs into --output (module docstring); prints what it wrote."""
    args = _parser().parse_args(argv)
    options = mining.MiningOptions(
        num_negatives=args.num_negatives,
        range_min=args.range_min,
        range_max=args.range_max,
        max_score=args.max_score,
        min_score=args.min_score,
        absolute_margin=args.absolute_margin,
        relative_margin=args.relative_margin,
        sampling_strategy=args.sampling_strategy,
        seed=args.seed,
        exclude_anchor=args.exclude_anchor,
        rescore=args.cross_encoder is not None,
    )
    options.window_end(1)  # the flags' own mistakes, before any file is read
    if args.batch_size < 1:
        raise ValueError(f"--batch_size must be at least 1, got {args.batch_size}")
    reads = {"--pairs": args.pairs, "--corpus": args.corpus}
    tables.check_apart({"--output": [args.output]}, reads)  # even with --overwrite
    check_output(args.output, args.overwrite)
    if args.search == "faiss":
        search_lib.faiss_module()  # installed, before any file is read
    multihost.initialize_job(args.coordinator_address, args.num_processes, args.process_id)
    compile_cache.enable_compilation_cache(args.compilation_cache_dir)
    with multihost.guard():
        pairs = pairs_lib.read_pairs(args.pairs)
        corpus = None if args.corpus is None else read_corpus(args.corpus, args.corpus_column)
        query_fn, embed_fn = text_embedders(
            args.model,
            batch_size=args.batch_size,
            max_seq_length=args.max_seq_length,
            prompts={k: v for k, v in vars(args).items() if "_prompt" in k},
        )
        rescore_fn = None
        if args.cross_encoder is not None:
            rescore_fn = pair_scorer(
                args.cross_encoder, batch_size=args.batch_size, max_seq_length=args.max_seq_length
            )
        search_fn = search_lib.SEARCHES[args.search]
        mined = mining.mine(pairs, embed_fn, options, corpus, rescore_fn, search_fn, query_fn)
        if jax.process_index() == 0:
            write_mined(mined, args.output, overwrite=args.overwrite)
    if jax.process_index() > 0:
        return 0
    print(
        f"wrote {len(mined.anchors)} rows ({options.num_negatives} negatives each) to "
        f"{args.output}; {mined.num_dropped} of {mined.num_anchors} anchors dropped "
        f"({mined.num_pairs_dropped} pairs) for lack of negatives"
    )
    return 0


if __name__ == "__main__":
    from bert_jax import cli  # a user's mistake: `error: <message>`, status 1; Ctrl-C: 130

    sys.exit(cli.run(main))
