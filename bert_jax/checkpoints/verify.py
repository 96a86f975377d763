"""Checking a conversion against PyTorch: bert_jax and transformers run on the same sample
inputs, every output, hidden state and attention map compared (`verify`). torch and
transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bert_jax.checkpoints.table import ConversionError, PyTree
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.families import EncoderConfig, get_model_class


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
    out = module.apply(
        {"params": params}, **args, output_hidden_states=True, output_attentions=True
    )
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


def verify(config: EncoderConfig, params: PyTree, model: str, hf_dir: str, *, seed: int = 0):
    """Runs bert_jax and PyTorch (transformers, eager attention) on the same sample inputs.

    Returns {output name: max abs difference} over every output, hidden state and attention map.
    """
    import transformers

    torch_model = (
        getattr(transformers, model).from_pretrained(hf_dir, attn_implementation="eager").eval()
    )
    inputs = sample_inputs(config, model, seed=seed)
    ours = jax_outputs(config, params, model, inputs)
    theirs = torch_outputs(torch_model, inputs)
    if set(ours) != set(theirs):
        raise ConversionError(f"outputs differ in name: {sorted(set(ours) ^ set(theirs))}")
    return {k: float(np.max(np.abs(ours[k] - theirs[k]))) for k in sorted(ours)}
