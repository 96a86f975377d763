"""`fill-mask`: the most probable tokens at each mask token of the texts given
(`heads.fill_mask`), from a checkpoint with a masked-LM head; printed, or as JSON lines."""

from __future__ import annotations

import argparse
import json

from bert_jax.inference import heads, loading
from bert_jax.inference.commands import base


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The texts, --top_k, --json, --model."""
    parser.add_argument(
        "texts",
        nargs="+",
        help="texts with the tokenizer's mask token in them ([MASK] or <mask>; [MASK] is read "
        "as <mask> where the model's vocabulary has no [MASK])",
    )
    parser.add_argument("--top_k", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print JSON lines, one per text")
    base.add_model(parser)


def run(args: argparse.Namespace) -> None:
    """Prints each text's top --top_k tokens per mask, each as the text it reads as, its piece
    beside it where that differs ("less (Ġless)"); JSON lines with --json."""
    config, params, head, tokenizer = loading.load_masked_lm(args.model)
    results = heads.fill_mask(config, params, tokenizer, args.texts, head=head, top_k=args.top_k)
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


COMMAND = base.Command(
    "fill-mask",
    "the most probable tokens for each mask token of a text (the tokenizer's own: "
    "[MASK] for BERT and ModernBERT, <mask> for RoBERTa and XLM-R)",
    add_arguments,
    run,
)
