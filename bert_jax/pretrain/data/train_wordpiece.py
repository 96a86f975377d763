"""`bert-jax-train-wordpiece`: learn a BERT WordPiece (or RoBERTa byte-level BPE, or XLM-R
Unigram) vocabulary.

    bert-jax-train-wordpiece --input_file='corpus/*.txt' --vocab_size=30522 --output_dir=vocab/
    bert-jax-train-wordpiece --kind=bpe --input_file='corpus/*.txt' --vocab_size=50265 \\
      --output_dir=vocab/
    bert-jax-train-wordpiece --kind=unigram --input_file='corpus/*.txt' --vocab_size=250002 \\
      --output_dir=vocab/

writes `vocab.txt` (google-research/bert's format) and `tokenizer.json` (Hugging Face's) into
`--output_dir`. Special tokens get ids 0-4: [PAD], [UNK], [CLS], [SEP], [MASK]. With `--kind=bpe`
it writes RoBERTa's `vocab.json`, `merges.txt`, `tokenizer.json` and `tokenizer_config.json`
(cased, ids `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3, `<mask>` last; `--lowercase` and
`--limit_alphabet` do not apply). With `--kind=unigram` it writes XLM-R's `tokenizer.json` and a
`tokenizer_config.json` naming `XLMRobertaTokenizer` (cased, ids as RoBERTa's; `--lowercase`,
`--limit_alphabet` and `--min_frequency` do not apply). `--default_corpus` trains on the bundled
Shakespeare plays instead of files; `--text_column=text` reads `--input_file` as tables (Parquet,
`datasets` directories, JSONL/CSV; one document a row), as `bert-jax-create-pretraining-data`
does.

For a corpus larger than memory, `--sample_documents=N --sample_seed=S` trains on a seeded sample
of N documents drawn in one streaming pass (`sources.sample_documents`): the same N documents for
the same files and seed, in any order, with only the sample in memory.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence

from absl import logging

from bert_jax import cli, tokenization
from bert_jax.pretrain.data import default_corpus, sources
from bert_jax.pretrain.data.sources import Document


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command; returns the exit status (`bert_jax.cli`: 1 after an error it printed,
    130 after Ctrl-C)."""
    return cli.run(_main, argv)


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    logging.set_verbosity(logging.INFO)
    existing = [
        n
        for n in ("vocab.txt", "tokenizer.json", "vocab.json", "merges.txt")
        if os.path.exists(os.path.join(args.output_dir, n))
    ]
    if existing:
        print(
            f"error: {args.output_dir} already holds {', '.join(existing)}; choose another "
            "--output_dir",
            file=sys.stderr,
        )
        return 1
    stats = sources.SourceStats()
    try:
        documents = _documents(args, stats)
        texts = (sentence for document in documents for sentence in document)
        if args.kind == "bpe":
            tokenizer = tokenization.train_byte_level_bpe(
                texts, vocab_size=args.vocab_size, min_frequency=args.min_frequency
            )
        elif args.kind == "unigram":
            tokenizer = tokenization.train_unigram(texts, vocab_size=args.vocab_size)
        else:
            tokenizer = tokenization.train_wordpiece(
                texts,
                vocab_size=args.vocab_size,
                lowercase=args.lowercase,
                min_frequency=args.min_frequency,
                limit_alphabet=args.limit_alphabet,
                show_progress=False,
            )
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    stats.log()
    if stats.sentences == 0:
        print("error: the input has no text", file=sys.stderr)
        return 1
    tokenizer.save(args.output_dir)
    print(f"wrote a {tokenizer.vocab_size}-token {tokenizer.kind} vocabulary to {args.output_dir}")
    return 0


def _parser() -> argparse.ArgumentParser:
    """The command's flags."""
    p = argparse.ArgumentParser(prog="bert-jax-train-wordpiece", description=__doc__.split("\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--input_file", help="comma-separated text files or globs")
    source.add_argument("--default_corpus", action="store_true", help="the Shakespeare plays")
    p.add_argument(
        "--text_column", help="read --input_file as tables (Parquet, ...): this column's text"
    )
    p.add_argument("--output_dir", required=True)
    p.add_argument(
        "--kind",
        choices=("wordpiece", "bpe", "unigram"),
        default="wordpiece",
        help="wordpiece (BERT's), bpe (RoBERTa's byte-level BPE) or unigram (XLM-R's)",
    )
    p.add_argument("--vocab_size", type=int, default=30522)
    p.add_argument(
        "--lowercase",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="uncased vocabulary (--no-lowercase: cased)",
    )
    p.add_argument("--min_frequency", type=int, default=2)
    p.add_argument("--limit_alphabet", type=int, default=1000)
    p.add_argument(
        "--sample_documents",
        type=int,
        default=None,
        help="train on a seeded sample of this many documents (default: every document)",
    )
    p.add_argument("--sample_seed", type=int, default=0, help="picks the sample")
    return p


def _documents(args: argparse.Namespace, stats: sources.SourceStats) -> Iterable[Document]:
    """The documents the flags name (counted into `stats`), or the seeded sample of them."""
    if args.default_corpus:
        documents = default_corpus.default_corpus_documents(stats)
    elif args.text_column:
        documents = sources.table_documents(
            args.input_file, args.text_column, split_sentences=False, stats=stats
        )
    else:
        documents = sources.text_file_documents(args.input_file, split_sentences=False, stats=stats)
    if args.sample_documents is not None:
        documents = sources.sample_documents(documents, args.sample_documents, args.sample_seed)
        logging.info("training on a sample of %d documents", len(documents))
    return documents


if __name__ == "__main__":
    sys.exit(main())
