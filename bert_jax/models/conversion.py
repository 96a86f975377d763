"""The shape of a family's conversion facts: how its parameters are named in other formats.

Each family folder fills one `FamilyConversion` (`models/<family>/conversion.py`) and the
registry puts it on the family's row (`families.Family.conversion`); the checkpoint formats
(`bert_jax.checkpoints`) read it and name no family. A flax key is the "/"-joined path of a
parameter in the unstacked tree ("bert/encoder/layer_0/attention/self/query/kernel"); a Hugging
Face key is the PyTorch state-dict name derived from it ("bert.encoder.layer.0....weight").
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

# A head transformers has no class for, computed from its Hugging Face weights (`FamilyConversion.
# reference_heads`): (state dict {name: array}, the base model's last hidden state [B, L, E]
# float32, the config) -> the head's logits as bert_jax's class returns them.
ReferenceHead = Callable[[Mapping[str, np.ndarray], np.ndarray, Any], np.ndarray]


@dataclasses.dataclass(frozen=True)
class FamilyConversion:
    """A family's names and layouts in Hugging Face and TF checkpoints.

    Attributes:
      hf_prefix: the encoder's prefix in a head's HF state dict ("bert."; absent in the
        encoder's own state dict).
      hf_roots: the encoder's top-level HF names (keys starting with them may lack the prefix).
      structural: regex of flax keys that must come from a checkpoint (never newly initialized:
        embeddings and layers; everything else is a task head).
      tied_decoder: the HF name of the MLM decoder weight, tied to the word embeddings (often
        omitted from a state dict; when present it must equal them).
      word_embeddings: the word-embedding table's flax key, without the encoder prefix.
      hf_aliases: {HF key: another spelling of the same tensor}, both read, both must agree
        (BERT's MLM bias is also stored as the decoder's bias).
      two_input_kernels: flax key suffixes of kernels with two input axes ([heads, head_dim,
        out], the attention output projection); every other kernel has one.
      vocab_keys: regex of flax keys with a row per token (word embeddings, MLM output bias):
        held with `padded_vocab_size` rows here, `vocab_size` rows in other formats.
      layer_index: regex whose group 1 is a layer's index in a weight name of any format.
      sized_by_config: (weight name regex, config field, axis the field sizes), checked against
        a checkpoint's shapes before anything is built from its config.
      tf_config_file: the config file read beside a TF checkpoint (google-research/bert's
        bert_config.json); "" for a family without TF checkpoints.
      tf_prefix: prepended to a flax key lacking one of `tf_top_level` to make its TF name.
      tf_top_level: flax key prefixes that are TF names' first component already.
      tf_renames: (regex, replacement) applied in order to make a TF name.
      tf_out_weights: regex of kernels TF stores [out, in] (run_classifier.py's output_weights).
      tf_num_labels_key: the TF weight whose first axis is the label count (bert_config.json
        has none).
      tf_default_head: the head a TF checkpoint is read as when none is named.
      tf_head_renames: (head class name, ((regex, replacement), ...)) applied before
        `tf_renames` to that head's names: a TF checkpoint holding several models, one under a
        scope of its own (ELECTRA's generator, `generator/encoder/...`).
      reference_heads: (head class name, `ReferenceHead`) of each of the family's heads that
        transformers has no class for (DeBERTa-v3's replaced-token detector): what `--verify`
        compares that head's logits with, written from the original code (torch imported
        inside), on transformers' base model of the family run on the same weights.
      hf_legacy: the family's older state-dict spelling rewritten to the names it reads
        ({HF key: array} -> {HF key: array}, other keys kept), applied to every state dict
        read (NomicBERT's original `encoder.layers.0.attn.Wqkv`, which transformers still
        writes, split into q, k and v); None: one spelling.
    """

    hf_prefix: str
    hf_roots: tuple[str, ...]
    structural: str
    tied_decoder: str
    word_embeddings: str
    two_input_kernels: tuple[str, ...]
    vocab_keys: re.Pattern
    layer_index: re.Pattern
    sized_by_config: tuple[tuple[str, str, int], ...]
    hf_aliases: tuple[tuple[str, str], ...] = ()
    tf_config_file: str = ""
    tf_prefix: str = ""
    tf_top_level: tuple[str, ...] = ()
    tf_renames: tuple[tuple[str, str], ...] = ()
    tf_out_weights: str = r"(?!)"  # matches nothing
    tf_num_labels_key: str = ""
    tf_default_head: str = ""
    tf_head_renames: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    reference_heads: tuple[tuple[str, ReferenceHead], ...] = ()
    hf_legacy: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]] | None = None

    def n_inputs(self, flax_key: str) -> int:
        """Leading kernel axes that are inputs: 2 for projections out of the heads [H, D, E]."""
        return 2 if flax_key.endswith(self.two_input_kernels) else 1

    def tf_key(self, flax_key: str, model: str = "") -> str:
        """The TF checkpoint name of a flax key (of a family with TF checkpoints) of the head
        class `model` (its `tf_head_renames` first)."""
        key = flax_key if flax_key.startswith(self.tf_top_level) else self.tf_prefix + flax_key
        for pattern, repl in (*dict(self.tf_head_renames).get(model, ()), *self.tf_renames):
            key = re.sub(pattern, repl, key)
        return key


# A layer's index in any spelling: HF "encoder.layer.3." / "layers.3.", TF and flax
# "encoder/layer_3/" / "layers_3/" / "layers/3/" (NomicBERT's).
LAYER_INDEX_RE = re.compile(r"(?:^|[./])layers?[._/](\d+)[./]")


def sized_by_config(
    word_embeddings: str,
    width: str = "hidden_size",
    more: tuple[tuple[str, str, int], ...] = (),
) -> tuple[tuple[str, str, int], ...]:
    """The embedding tables a config sizes, for a family whose word-embedding table is named
    `word_embeddings` ("word_embeddings", "tok_embeddings") and is `width` wide (a config field:
    ELECTRA's "embedding_size"), in every format's spelling; `more`: (table, field, axis) of its
    other tables (DeBERTa's relative positions)."""
    suffix = r"(\.weight|/embedding)?$"
    tables = (
        (word_embeddings, "vocab_size", 0),
        (word_embeddings, width, -1),
        ("position_embeddings", "max_position_embeddings", 0),
        ("token_type_embeddings", "type_vocab_size", 0),
        *more,
    )
    return tuple((table + suffix, field, axis) for table, field, axis in tables)


def encoder_names(
    encoder: str,
    roots: tuple[str, ...],
    *,
    heads_roots: tuple[str, ...] = (),
    word_table: str = "word_embeddings",
    mlm_biases: tuple[str, ...] = (),
    width: str = "hidden_size",
    more_tables: tuple[tuple[str, str, int], ...] = (),
) -> dict[str, Any]:
    """The `FamilyConversion` fields that follow from a family's encoder names.

    Args:
      encoder: the heads' encoder submodule ("bert"): the HF prefix "bert.".
      roots: its top-level submodules a checkpoint must hold ("embeddings", "encoder").
      heads_roots: its other top-level submodules, new in a head ("pooler").
      word_table: its word-embedding table ("word_embeddings").
      mlm_biases: the flax keys of its MLM heads' output biases ("cls/predictions/bias"): a row
        per token, as the table.
      width, more_tables: as `sized_by_config`'s.

    Returns:
      hf_prefix, hf_roots, structural, word_embeddings, vocab_keys, layer_index and
      sized_by_config, as keyword arguments of `FamilyConversion`.
    """
    biases = "".join(f"|^{re.escape(b)}$" for b in mlm_biases)
    return dict(
        hf_prefix=f"{encoder}.",
        hf_roots=tuple(f"{r}." for r in (*roots, *heads_roots)),
        structural=rf"^({encoder}/)?({'|'.join(roots)})/",
        word_embeddings=f"embeddings/{word_table}/embedding",
        vocab_keys=re.compile(rf"(^|/)embeddings/{word_table}/embedding${biases}"),
        layer_index=LAYER_INDEX_RE,
        sized_by_config=sized_by_config(word_table, width, more_tables),
    )


# The layers' submodule and the kernel of their attention output projection [H, D, E]: BERT's
# original layout ("encoder/layer_0/attention/output/dense") and transformers 5's
# ("layers_0/self_attn/o_proj").
BERT_LAYERS = ("encoder", "attention/output/dense/kernel")
HF5_LAYERS = ("layers", "self_attn/o_proj/kernel")


def post_ln_conversion(
    encoder: str,
    mlm_head: str,
    layers: tuple[str, str],
    *,
    bias_on_decoder: bool = False,
    more_tables: tuple[tuple[str, str, int], ...] = (),
    **fields: Any,
) -> FamilyConversion:
    """The `FamilyConversion` of a BERT-like (post-LayerNorm) encoder: embeddings and layers
    read from a checkpoint, a pooler new in a head, and an MLM head whose decoder is tied to the
    word embeddings.

    Args:
      encoder: the heads' encoder submodule ("bert"): the HF prefix "bert.".
      mlm_head: the MLM head's HF name ("cls.predictions", "lm_head"): its decoder
        `<mlm_head>.decoder.weight` is the tied one; its output bias is `<mlm_head>.bias`, which
        transformers also stores as `<mlm_head>.decoder.bias` (read as one tensor).
      layers: (the layers' submodule, the flax key suffix of their attention output kernel):
        `BERT_LAYERS`, `HF5_LAYERS` or the family's own.
      bias_on_decoder: the output bias is `<mlm_head>.decoder.bias` alone (GTE's).
      more_tables: as `sized_by_config`'s.
      fields: the family's other `FamilyConversion` fields (TF names, `hf_legacy`).

    Returns:
      The family's `FamilyConversion`.
    """
    layers_root, attention_output = layers
    bias = f"{mlm_head}.decoder.bias" if bias_on_decoder else f"{mlm_head}.bias"
    return FamilyConversion(
        **encoder_names(
            encoder,
            ("embeddings", layers_root),
            heads_roots=("pooler",),
            mlm_biases=(bias.replace(".", "/"),),
            more_tables=more_tables,
        ),
        tied_decoder=f"{mlm_head}.decoder.weight",
        hf_aliases=() if bias_on_decoder else ((bias, f"{mlm_head}.decoder.bias"),),
        two_input_kernels=(attention_output,),
        **fields,
    )


# The heads' parameters saved by google-research/bert's scripts under other names.
TF_RENAMES = (
    (r"^cls/predictions/bias$", "cls/predictions/output_bias"),
    (r"^cls/seq_relationship/kernel$", "cls/seq_relationship/output_weights"),
    (r"^cls/seq_relationship/bias$", "cls/seq_relationship/output_bias"),
    (r"^classifier/kernel$", "output_weights"),  # run_classifier.py
    (r"^classifier/bias$", "output_bias"),
    (r"^qa_outputs/kernel$", "cls/squad/output_weights"),  # run_squad.py
    (r"^qa_outputs/bias$", "cls/squad/output_bias"),
    (r"/embedding$", ""),
    (r"LayerNorm/scale$", "LayerNorm/gamma"),
    (r"LayerNorm/bias$", "LayerNorm/beta"),
)

# How google-research/bert names a parameter in TF (`FamilyConversion.tf_key`): the TF
# checkpoint format's names, which BERT's row reads and ModernBERT's rows keep.
TF_NAMES = dict(
    tf_prefix="bert/",
    tf_top_level=("bert/", "cls/", "classifier/", "qa_outputs/"),
    tf_renames=TF_RENAMES,
    tf_out_weights=r"(^|/)(seq_relationship|classifier|qa_outputs)/kernel$",
)
