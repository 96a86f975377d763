"""`bert-jax-create-pretraining-data`: text to pretraining shards (google-research/bert's flags).

    bert-jax-create-pretraining-data \\
      --input_file='corpus/*.txt' --vocab_file=uncased_L-12_H-768_A-12/vocab.txt \\
      --output_dir=data/pretrain --max_seq_length=128 --max_predictions_per_seq=20 \\
      --dupe_factor=10 --num_shards=64 --format=array_record

Exactly what google-research/bert's `create_pretraining_data.py` writes for the same input, vocab,
flags and seed (its defaults are spelled out; the file is `pretrain-00000-of-00001.tfrecord`):

    bert-jax-create-pretraining-data --input_file=... --vocab_file=vocab.txt --output_dir=... \
      --no-split_sentences --num_shards=1 --no-file_ends_document --original_tokenizer \
      --format=tfrecord --do_lower_case=true --max_seq_length=128 --max_predictions_per_seq=20 \
      --random_seed=12345 --dupe_factor=10 --masked_lm_prob=0.15 --short_seq_prob=0.1

Inputs (text files, tables with `--text_column`, `--tfds`, `--default_corpus`), the Beam runners
(`--runner=...`, any other flag passed to Beam) and more commands: docs/data.md, "Commands".
Rerunning the same command finishes an interrupted build and reuses its finished shards.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from absl import logging

from bert_jax import cli, tokenization
from bert_jax.pretrain.data import build, build_dir, default_corpus, records, sources
from bert_jax.pretrain.data.examples import PretrainingOptions


def _add_recipe_flags(p: argparse.ArgumentParser, defaults) -> None:
    """The example recipe's flags (google-research/bert's names and defaults)."""
    p.add_argument("--max_seq_length", type=int, default=defaults.max_seq_length)
    p.add_argument("--max_predictions_per_seq", type=int, default=defaults.max_predictions_per_seq)
    p.add_argument("--random_seed", type=int, default=defaults.random_seed)
    p.add_argument("--dupe_factor", type=int, default=defaults.dupe_factor)
    p.add_argument("--masked_lm_prob", type=float, default=defaults.masked_lm_prob)
    p.add_argument("--short_seq_prob", type=float, default=defaults.short_seq_prob)
    p.add_argument("--do_whole_word_mask", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument(
        "--next_sentence_prediction",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="A/B pairs with 50%% random B (--no-next_sentence_prediction: MLM only)",
    )
    p.add_argument(
        "--masking",
        choices=("static", "dynamic"),
        default="static",
        help="static: masks in the records (dupe_factor copies); dynamic: at load time",
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bert-jax-create-pretraining-data",
        description="Create BERT pretraining shards (masked LM + next sentence prediction).",
    )
    _add_input_flags(p)
    _add_recipe_flags(p, PretrainingOptions())
    _add_build_flags(p)
    return p


def _add_input_flags(p: argparse.ArgumentParser) -> None:
    """The corpus, output directory and tokenizer flags."""
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--input_file", help="comma-separated text files or globs")
    source.add_argument(
        "--tfds", metavar="NAME", help="tensorflow-datasets name, e.g. wikipedia/20230601.en"
    )
    source.add_argument(
        "--default_corpus", action="store_true", help="the bundled Shakespeare plays"
    )
    p.add_argument(
        "--text_column",
        help="read --input_file as tables (Parquet, datasets directories, JSONL, CSV): one "
        "document per row, its text in this column",
    )
    p.add_argument("--output_dir", required=True, help="directory for the shards (new or empty)")
    p.add_argument("--vocab_file", help="vocab.txt, tokenizer.json, or a directory holding one")
    p.add_argument(
        "--do_lower_case",
        choices=("auto", "true", "false"),
        default="auto",
        help="lower-case input; auto: as the tokenizer.json says, or inferred from vocab.txt",
    )
    p.add_argument(
        "--split_sentences",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="split lines into sentences (--no-split_sentences: one sentence a line)",
    )
    p.add_argument(
        "--file_ends_document",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="end a file's last document at its end (--no-file_ends_document: a file without a "
        "final blank line runs on into the next, as in google-research/bert's script)",
    )
    p.add_argument(
        "--original_tokenizer",
        action="store_true",
        help="tokenize as google-research/bert's FullTokenizer where it differs from "
        "BertTokenizerFast (docs/data.md lists how)",
    )
    p.add_argument("--tfds_data_dir", help="tfds data directory")
    p.add_argument("--tfds_split", default="train")
    p.add_argument("--tfds_text_key", default="text")
    p.add_argument("--tfds_download", action="store_true", help="download the tfds dataset")


def _add_build_flags(p: argparse.ArgumentParser) -> None:
    """How the shards are written: count, format, workers, partition, runner, progress."""
    p.add_argument("--num_shards", type=int, default=8)
    p.add_argument("--format", choices=records.RECORD_FORMATS, default="array_record")
    p.add_argument("--num_workers", type=int, default=None, help="default: one per CPU core")
    p.add_argument(
        "--partition",
        choices=build.PARTITIONS,
        default=None,
        help="shuffled: the shuffled corpus dealt out to shards, random next segments from the "
        "whole corpus (the local default); hash: by document hash, random next segments from the "
        "shard (what --runner builds)",
    )
    p.add_argument(
        "--runner",
        choices=("DirectRunner", "DataflowRunner", "FlinkRunner", "SparkRunner"),
        default=None,
        help="build with Apache Beam on this runner (other flags go to Beam); default: locally",
    )
    p.add_argument("--no_progress", action="store_true", help="no progress bars")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command; returns the exit status (`bert_jax.cli`: 1 after an error it printed,
    130 after Ctrl-C)."""
    return cli.run(_main, argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args, pipeline_args = parser.parse_known_args(argv)
    if pipeline_args and args.runner is None:
        parser.error(f"unrecognized arguments: {' '.join(pipeline_args)}")
    logging.set_verbosity(logging.INFO)
    if args.text_column and not args.input_file:
        parser.error("--text_column reads --input_file as tables; it needs --input_file")
    try:
        options = _options(args)
        build_dir.check_output_dir(args.output_dir)
        tokenizer = _tokenizer(args)
        if args.runner is not None:
            metadata = _build_with_beam(args, pipeline_args, tokenizer, options)
            _print_done(metadata, args.output_dir)
            return 0
        stats = sources.SourceStats()
        documents, source_id = _documents(args, stats)
        metadata = build.build_pretraining_shards(
            documents,
            args.output_dir,
            tokenizer,
            options,
            num_shards=args.num_shards,
            record_format=args.format,
            num_workers=args.num_workers,
            source_id=source_id,
            source_stats=stats,
            progress=not args.no_progress,
            partition=args.partition or "shuffled",
        )
    except (ValueError, FileNotFoundError, ImportError, KeyError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    _print_done(metadata, args.output_dir)
    return 0


def _options(args: argparse.Namespace) -> PretrainingOptions:
    """The example recipe the flags give."""
    return PretrainingOptions(
        max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq,
        masked_lm_prob=args.masked_lm_prob,
        short_seq_prob=args.short_seq_prob,
        dupe_factor=args.dupe_factor,
        whole_word_mask=args.do_whole_word_mask,
        next_sentence_prediction=args.next_sentence_prediction,
        static_masking=args.masking == "static",
        random_seed=args.random_seed,
    )


def _tokenizer(args: argparse.Namespace):
    """The tokenizer of --vocab_file, or the default corpus's own; ValueError without either."""
    lowercase = {"auto": None, "true": True, "false": False}[args.do_lower_case]
    if args.vocab_file:
        return tokenization.load_tokenizer(
            args.vocab_file, lowercase=lowercase, match_original=args.original_tokenizer
        )
    elif args.original_tokenizer:
        raise ValueError("--original_tokenizer needs a --vocab_file")
    elif args.default_corpus:
        return default_corpus.default_corpus_tokenizer(args.output_dir)
    else:
        raise ValueError("--vocab_file is required (except with --default_corpus)")


def _documents(args: argparse.Namespace, stats: sources.SourceStats) -> tuple[Callable, str | None]:
    """A callable reading the flags' documents (counting into `stats`), and the source's id."""
    source_id = None
    if args.text_column:
        if not args.file_ends_document:
            raise ValueError("--no-file_ends_document is for text files; a row is one document")
        documents = lambda: sources.table_documents(
            args.input_file, args.text_column, split_sentences=args.split_sentences, stats=stats
        )
    elif args.input_file:
        documents = lambda: sources.text_file_documents(
            args.input_file,
            split_sentences=args.split_sentences,
            file_ends_document=args.file_ends_document,
            stats=stats,
        )
    elif args.tfds:
        documents = lambda: sources.tfds_documents(
            args.tfds,
            split=args.tfds_split,
            data_dir=args.tfds_data_dir,
            text_key=args.tfds_text_key,
            download=args.tfds_download,
            stats=stats,
        )
    else:
        documents = lambda: default_corpus.default_corpus_documents(stats)
        source_id = default_corpus.default_corpus_version()
    return documents, source_id


def _print_done(metadata: dict, output_dir: str) -> None:
    print(
        f"wrote {metadata['num_records']} examples in {len(metadata['shards'])} "
        f"{metadata['record_format']} shard(s) to {output_dir}"
    )


def _build_with_beam(
    args: argparse.Namespace, pipeline_args: list[str], tokenizer, options: PretrainingOptions
) -> dict:
    """The build as a Beam pipeline on `args.runner` (imports apache_beam only here)."""
    local_only = {
        "--partition=shuffled": args.partition == "shuffled",
        "--no-file_ends_document": not args.file_ends_document,
        "--num_workers (use Beam's options, e.g. --direct_num_workers)": args.num_workers,
        "--tfds_download (prepare the dataset first)": args.tfds_download,
    }
    refused = [flag for flag, given in local_only.items() if given]
    if refused:
        raise ValueError(f"--runner builds hash-partitioned shards; drop {', '.join(refused)}")
    from bert_jax.pretrain.data import beam_build

    if args.text_column:
        source = beam_build.TableFiles(
            tuple(p for p in args.input_file.split(",") if p),
            args.text_column,
            args.split_sentences,
        )
    elif args.input_file:
        source = beam_build.TextFiles(
            tuple(p for p in args.input_file.split(",") if p), args.split_sentences
        )
    elif args.tfds:
        source = beam_build.Tfds(args.tfds, args.tfds_split, args.tfds_data_dir, args.tfds_text_key)
    else:
        source = beam_build.DefaultCorpus()
    return beam_build.build_pretraining_shards_beam(
        source,
        args.output_dir,
        tokenizer,
        options,
        num_shards=args.num_shards,
        record_format=args.format,
        pipeline_args=[f"--runner={args.runner}", *pipeline_args],
    )


if __name__ == "__main__":
    sys.exit(main())
