"""`attention`: the heat map PNG of one layer's head's attention over a text
(`encoder.attention_map`), from the encoder of any checkpoint."""

from __future__ import annotations

import argparse

from bert_jax.inference import encoder, loading
from bert_jax.inference.commands import base


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--text, --layer, --head, --model, --output."""
    parser.add_argument("--text", required=True)
    parser.add_argument("--layer", type=int, required=True)
    parser.add_argument("--head", type=int, required=True)
    base.add_model(parser)
    parser.add_argument("--output", required=True)


def run(args: argparse.Namespace) -> None:
    """Writes the heat map PNG of --layer's --head on --text to --output."""
    config, params, _, tokenizer = loading.load(args.model)  # any head: its encoder is used
    encoder.attention_map(config, params, tokenizer, args.text, args.layer, args.head, args.output)
    print(f"wrote {args.output}")


COMMAND = base.Command(
    "attention", "a heat map PNG of one layer's head's attention", add_arguments, run
)
