"""Lossless conversion between bert_jax parameters and other BERT checkpoint formats.

Formats (what each accepts and refuses: docs/conversion.md), one module of
`bert_jax.checkpoints` each (`detect` picks one, `verify` compares with PyTorch):
  * Hugging Face PyTorch directories (`hf`), with or without the `bert.` (ModernBERT: `model.`)
    prefix; the family by config.json's model_type (`bert_jax.models.families`).
  * google-research/bert and google-research/electra TF checkpoints (`tf`; TensorFlow is an
    optional extra, imported only there).
  * transformers' Flax classes, 4.x (`hf_flax`).
  * bert_jax's own directory: `config.json` + an Orbax `params/` checkpoint (`native`).
  * a `train.py` run directory: its newest checkpoint's parameters (`run_params`).

This module is their command and re-exports the functions users call; paths are local or URLs
(gs://...), through `etils.epath`. One table (`checkpoints.table.parameter_table`) maps every
parameter to its Hugging Face and TF name and the reshape/transpose between them.

Python API:
    config, params = load_pytorch(hf_dir, model="BertForPreTraining")
    save_pytorch(config, params, out_dir, model="BertForPreTraining")
    config, params = load_tf(ckpt_prefix, model="BertForPreTraining")
    save_pretrained(out_dir, config, params, model=...)
    config, params, model = load_pretrained(dir)
    config, params, model, step = load_training_checkpoint(workdir)
    config, params, model, report = load_any(path, model=None)
    save_hf_flax(config, params, out_dir, model="BertForPreTraining")

Command line: `python -m bert_jax.convert SRC DST [--to hf|hf_flax|bert_jax] [--model NAME]
[--verify] [--model-card]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from collections.abc import Sequence

from bert_jax.checkpoints import detect, hub, model_card, pretrained, table, verify
from bert_jax.checkpoints.detect import load_any
from bert_jax.checkpoints.hf import load_pytorch, save_pytorch
from bert_jax.checkpoints.hf_flax import save_hf_flax
from bert_jax.checkpoints.native import load_pretrained, save_pretrained
from bert_jax.checkpoints.run_params import load_training_checkpoint
from bert_jax.checkpoints.sentence_transformers import save_modules
from bert_jax.checkpoints.tf import load_tf
from bert_jax.models.family import Role
from bert_jax.models.pooling import SPARSE_POOLINGS
from bert_jax.paths import file_in_place_of_folder, is_url

# The functions README.md and docs/ name for users.
__all__ = [
    "load_any",
    "load_pretrained",
    "load_pytorch",
    "load_tf",
    "load_training_checkpoint",
    "main",
    "save_hf_flax",
    "save_pretrained",
    "save_pytorch",
]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bert_jax.convert",
        description="Convert BERT checkpoints between Hugging Face PyTorch and Flax, TF and "
        "bert_jax.",
    )
    parser.add_argument(
        "src",
        help="HF directory (PyTorch or Flax weights), TF checkpoint (prefix or folder), bert_jax "
        "directory, or a train.py workdir (its newest checkpoint); a local path, a URL or a "
        "Hugging Face Hub id (the cache, else a download unless HF_HUB_OFFLINE=1)",
    )
    parser.add_argument("dst", help="output directory")
    parser.add_argument(
        "--to",
        choices=("hf", "hf_flax", "bert_jax"),
        help="output format (default: the other one); hf_flax: flax_model.msgpack",
    )
    parser.add_argument("--max-shard-size", help="hf_flax: shard above this size, e.g. 10GB")
    parser.add_argument(
        "--model",
        help="head class of the source's family, e.g. BertForPreTraining, or a role, e.g. "
        "masked_lm or encoder (default: the source's head); another family's class is refused",
    )
    parser.add_argument("--allow-new-heads", action="store_true", help="initialize missing heads")
    parser.add_argument(
        "--hidden-act",
        choices=("gelu", "gelu_new", "relu"),
        help="TF checkpoints only: the activation, in place of bert_config.json's. Its 'gelu' is "
        "the erf GELU (assumed, as google-research/bert's 2018 release and transformers) or the "
        "tanh form of google-research/bert's code since February 2019: pass gelu_new for that",
    )
    parser.add_argument(
        "--config",
        help="TF checkpoints only: the model's config file, in place of the one beside the "
        "checkpoint (bert_config.json; a Hugging Face config.json for google-research/electra's "
        "checkpoints, which come without one: the discriminator's, or the generator's with "
        "--model ElectraForMaskedLM)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace files in dst")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="compare bert_jax and PyTorch outputs after converting",
    )
    model_card.add_flags(parser)
    return parser


def _convert(args) -> tuple:
    """Reads SRC and writes DST as `args` say: (config, params, model, report, output format).

    SRC is read by the one loader (`pretrained.load`: every directory inference reads, a
    finished run's `export/` too); its tokenizer and, for a sentence-transformers directory,
    the modules' settings go to DST with the weights (`_write_beside`)."""
    args.src = hub.resolve(args.src)  # a Hub id: its snapshot directory
    if not is_url(args.src) and os.path.exists(args.src) and not is_url(args.dst):
        if os.path.exists(args.dst) and os.path.samefile(args.src, args.dst):
            raise ValueError(
                f"DST {args.dst} is SRC: converting in place would replace the checkpoint it "
                "reads (even with --overwrite); give another DST"
            )
    loaded = pretrained.load(
        args.src,
        args.model,
        allow_new_heads=args.allow_new_heads,
        hidden_act=args.hidden_act,
        tf_config=args.config,
        with_tokenizer=False,
        log_report=False,
    )  # fmt: skip  (the command prints the report)
    config, params, model, report = loaded.config, loaded.params, loaded.head, loaded.report
    st = loaded.sentence_transformer
    if st is not None and st.query_module:
        raise ValueError(
            f"{args.src} is an inference-free SparseEncoder (a Router: its queries are weights "
            "of a SparseStaticEmbedding); convert writes one model and would drop them: convert "
            f"its document encoder's folder {os.path.join(args.src, st.transformer_path)} alone"
        )
    own = detect.detect_format(args.src) in ("bert_jax", "train")
    to = args.to or ("hf" if own else "bert_jax")
    if to == "hf":
        save_pytorch(config, params, args.dst, model, overwrite=args.overwrite)
    elif to == "hf_flax":
        save_hf_flax(
            config, params, args.dst, model, max_shard_size=args.max_shard_size,
            overwrite=args.overwrite,
        )  # fmt: skip
    else:
        save_pretrained(args.dst, config, params, model, overwrite=args.overwrite)
    _write_beside(args.src, args.dst, to, loaded)
    return config, params, model, report, to


def _write_beside(src, dst, to: str, loaded) -> None:
    """The source's tokenizer (its own files, tokenizer_config.json too) and, where the source
    was a sentence-transformers directory and the weights are its encoder's (a SparseEncoder's:
    its masked LM's), the modules' files (pooling, normalization, max_seq_length): an `hf` DST
    is then the sentence-transformers directory `save_sentence_transformer` writes, a `bert_jax`
    DST keeps them for inference and for converting back."""
    config, st = loaded.config, loaded.sentence_transformer
    own = loaded.family.base_model
    if st is not None and st.pooling in SPARSE_POOLINGS:
        own = loaded.family.head_for(Role.MASKED_LM)
    if st is not None and (loaded.head != own or to == "hf_flax"):
        st = None  # a head's weights, or Flax ones: no sentence-transformers directory
    if st is not None:  # at most what the positions hold (a file may say 514 for RoBERTa's 512)
        length = min(st.max_seq_length or config.max_sequence_length, config.max_sequence_length)
        st = dataclasses.replace(st, max_seq_length=length, transformer_path="")
    tokenizer = _source_tokenizer(src, loaded)
    if tokenizer is not None:
        tokenizer.save(
            dst, model_max_length=st.max_seq_length if st else config.max_sequence_length
        )
    if st is not None:
        save_modules(dst, config, st)


def _source_tokenizer(src, loaded):
    """The tokenizer beside the source's weights (`pretrained.find_tokenizer`, as the loader looks
    for it), or None: none there, or one that does not fit the model (a warning says so; the
    weights convert without it, as before tokenizers were carried)."""
    st = loaded.sentence_transformer
    if st is not None and st.transformer_path:  # an old directory: the encoder's own folder
        src = os.path.join(src, st.transformer_path)
    try:
        return pretrained.find_tokenizer(src, loaded.config.vocab_size)
    except ValueError as e:
        print(f"warning: the tokenizer is not carried over: {e}", file=sys.stderr)
        return None


def _verify(args, config, params, model, to: str) -> int:
    """`--verify`: bert_jax against PyTorch on sample inputs; 2 if any output differs by 1e-3."""
    hf_dir = args.dst if to == "hf" else args.src
    if to != "hf" and detect.detect_format(args.src) != "hf":
        hf_dir = tempfile.mkdtemp(prefix="bert_jax_verify_")
        save_pytorch(config, params, hf_dir, model)
    checked = verify.verify(config, params, model, hf_dir)
    print(f"verify: bert_jax's {model} against {checked.compared}")
    diffs = checked.differences
    if to == "hf_flax":  # and what was written reads back as the same parameters
        diffs["reloaded flax_model.msgpack"] = table.max_difference(
            params, load_pytorch(args.dst, model)[1]
        )
    width = max(len(k) for k in diffs)
    for k, v in diffs.items():
        print(f"  {k:<{width}}  max |jax - torch| = {v:.3e}")
    worst = max(diffs.values())
    print(f"verify: worst max abs difference {worst:.3e} over {len(diffs)} outputs")
    if not worst < 1e-3:
        print("verify: FAILED (difference above 1e-3)", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bert_jax.convert SRC DST ...`: 0 on success, 1 on a refused conversion (the
    reason on stderr), 2 when `--verify` finds outputs apart."""
    args = _parser().parse_args(argv)
    try:
        config, params, model, report, to = _convert(args)
    except (table.ConversionError, FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"error: {file_in_place_of_folder(e) or e}", file=sys.stderr)
        return 1
    print(f"{model}: {report.summary()}")
    print(f"wrote {to} checkpoint to {args.dst}")
    if args.model_card:
        fmt = detect.detect_format(args.src)
        print(f"wrote {model_card.write_from_flags(args, config, model, fmt)}")
    return _verify(args, config, params, model, to) if args.verify else 0


if __name__ == "__main__":
    from bert_jax import cli  # a user's mistake: `error: <message>`, status 1; Ctrl-C: 130

    sys.exit(cli.run(main))
