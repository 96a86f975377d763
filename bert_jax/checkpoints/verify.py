"""Checking a conversion against PyTorch: bert_jax and transformers run on the same sample
inputs, every output, hidden state and attention map compared (`verify`). A head transformers
has no class for (DeBERTa-v3's replaced-token detector) is checked on what transformers can
load: the family's base model, and the head's logits computed from the written weights by the
family's reference (`FamilyConversion.reference_heads`). torch and transformers are imported
inside the functions that need them.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import numpy as np

from bert_jax.checkpoints.hf import read_hf_state_dict
from bert_jax.checkpoints.table import ConversionError, PyTree
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.families import EncoderConfig, family_of, get_model_class


class Verification(NamedTuple):
    """What `verify` found.

    Attributes:
      differences: {output name: max abs difference between bert_jax and PyTorch}, float.
      compared: what PyTorch ran, in words: "transformers' BertForMaskedLM", or for a head
        transformers lacks, its family's base model and the head computed from the weights.
    """

    differences: dict[str, float]
    compared: str


def sample_inputs(
    config: EncoderConfig, model: str, batch: int = 2, seq_len: int = 16, seed: int = 0
) -> dict[str, np.ndarray]:
    """Random ids, token types (where the family has them) and a padding mask (later rows
    padded) for checking a model: int64 [batch, seq_len] ([batch, 3, seq_len] for a
    multiple-choice head)."""
    rng = np.random.default_rng(seed)
    seq_len = min(seq_len, config.max_sequence_length)
    choices = getattr(get_model_class(model), "choices", False)
    shape = (batch, 3, seq_len) if choices else (batch, seq_len)
    ids = rng.integers(0, config.vocab_size, size=shape, dtype=np.int64)
    mask = np.ones(shape, np.int64)
    for b in range(1, batch):
        mask[b, ..., seq_len - 1 - (3 * b) % max(1, seq_len // 2) :] = 0
    if getattr(config, "type_vocab_size", 0) < 1:  # no token-type table
        return dict(input_ids=ids, attention_mask=mask)
    types = rng.integers(0, config.type_vocab_size, size=shape, dtype=np.int64)
    return dict(input_ids=ids, token_type_ids=types, attention_mask=mask)


def jax_outputs(config, params, model, inputs) -> dict[str, np.ndarray]:
    """bert_jax's outputs, hidden states and attention maps on `inputs`, named as
    `torch_outputs` names transformers'."""
    module = get_model_class(model)(config, RuntimeConfig())
    args = {k: np.asarray(v, np.int32) for k, v in inputs.items()}
    out = jax.jit(  # one compile of the whole model, not one per operation: several times faster
        lambda p, a: module.apply(
            {"params": p}, **a, output_hidden_states=True, output_attentions=True
        )
    )(params, args)
    return named_outputs(out)


def named_outputs(out) -> dict[str, np.ndarray]:
    """{field name (with "[i]" for a tuple's items): float32 array} of a model output dataclass."""
    named = {}
    for field in dataclasses.fields(out) if dataclasses.is_dataclass(out) else []:
        value = getattr(out, field.name)
        if value is None:
            continue
        if isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                named[f"{field.name}[{i}]"] = np.asarray(v, np.float32)
        else:
            named[field.name] = np.asarray(value, np.float32)
    return named


def torch_outputs(torch_model, inputs) -> dict[str, np.ndarray]:
    """Runs a transformers model and names its outputs like bert_jax's."""
    import torch

    with torch.no_grad():
        out = torch_model(
            **{k: torch.as_tensor(v) for k, v in inputs.items()},
            output_hidden_states=True,
            output_attentions=True,
            return_dict=True,
        )
    named = {}
    for key, value in out.items():
        if value is None or key == "loss":
            continue
        if isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                named[f"{key}[{i}]"] = v.float().numpy()
        else:
            named[key] = value.float().numpy()
    return named


def verify(
    config: EncoderConfig, params: PyTree, model: str, hf_dir: str, *, seed: int = 0
) -> Verification:
    """Runs bert_jax and PyTorch (transformers, eager attention) on the same sample inputs.

    `model` is transformers' class of that name loaded from `hf_dir`; for a head transformers
    has no class for, its family's base model loaded from `hf_dir` (hidden states and attention
    maps) with the head's logits computed from `hf_dir`'s weights by the family's reference
    (`FamilyConversion.reference_heads`) on that model's last hidden state.

    Returns:
      A `Verification`: the max abs difference of every output, hidden state and attention map,
      and what PyTorch ran.

    Raises:
      ConversionError: transformers lacks the class and the family names no reference for its
        head (naming what can be checked instead), or the outputs differ in name.
    """
    inputs = sample_inputs(config, model, seed=seed)
    ours = jax_outputs(config, params, model, inputs)
    theirs, compared = _reference_outputs(config, model, hf_dir, inputs)
    if set(ours) != set(theirs):
        raise ConversionError(f"outputs differ in name: {sorted(set(ours) ^ set(theirs))}")
    return Verification(
        {k: float(np.max(np.abs(ours[k] - theirs[k]))) for k in sorted(ours)}, compared
    )


def _reference_outputs(config, model: str, hf_dir: str, inputs) -> tuple[dict, str]:
    """PyTorch's outputs for `verify`, named as bert_jax's, and what ran (`Verification`)."""
    import transformers

    def load(name: str):
        cls = getattr(transformers, name)
        return cls.from_pretrained(hf_dir, attn_implementation="eager").eval()

    if hasattr(transformers, model):
        return torch_outputs(load(model), inputs), f"transformers' {model}"
    family = family_of(config)
    reference = dict(family.conversion.reference_heads).get(model)
    if reference is None:
        raise ConversionError(
            f"transformers has no {model} and {family.config_class.display_name} names no "
            f"reference for its head, so --verify cannot check it; convert without --verify, "
            f"or with --model {family.base_model} to check the encoder"
        )
    theirs = torch_outputs(load(family.base_model), inputs)
    last = theirs.pop("last_hidden_state")  # ours: hidden_states[-1]
    theirs["logits"] = reference(read_hf_state_dict(hf_dir), last, config)
    compared = (
        f"transformers' {family.base_model} (it has no {model}: the head's weights are unused "
        f"there) and the head's logits from the written weights by {reference.__name__}"
    )
    return theirs, compared
