"""sentence-transformers CrossEncoder directories: a reranker (any family's sequence-
classification head with one output), as `sentence_transformers.CrossEncoder(DIR)` loads it.

    save_cross_encoder(out, config, params, tokenizer=tokenizer, max_seq_length=256)
    CrossEncoder(out).predict([(query, passage), ...])   # sigmoid(the head's logit)

A directory is what sentence-transformers 6 saves: the transformers directory of the family's
sequence-classification class (config.json with `num_labels` 1, model.safetensors:
`checkpoints.hf.save_pytorch`), the tokenizer's files (tokenizer_config.json's `model_max_length`
the pairs' length, which CrossEncoder truncates to), `modules.json` (one Transformer module at
the root), its `sentence_bert_config.json`, and the activation CrossEncoder applies to the logit
(`read_activation` reads it where CrossEncoder does, first found first):

* `config_sentence_transformers.json`'s `activation_fn` (6.x writes it);
* config.json's `"sentence_transformers": {"activation_fn": ...}` block (4.x and 5.x);
* config.json's `sbert_ce_default_activation_function` (before 4.0);
* none: a sigmoid of the one output, CrossEncoder's default.

bert_jax writes the first two. `checkpoints.sentence_transformers.read_sentence_transformer`
reads such a directory as no embedder, so every loader reads it as its transformers directory.
"""

from __future__ import annotations

import json
import os
from typing import Any

from bert_jax import tokenization
from bert_jax.checkpoints import model_card
from bert_jax.checkpoints.hf import save_pytorch
from bert_jax.checkpoints.sentence_transformers import (
    MODULES_FILE,
    ST_CONFIG,
    TRANSFORMER_CONFIG,
    _read_json,
    _tokenizer,
    _write_json,
    check_settings,
)
from bert_jax.models.families import EncoderConfig, Role, family_of
from bert_jax.paths import as_path, prepare_out_dir, write_text_whole

PyTree = Any
# The activation applied to the logit, by name -> its torch class as sentence-transformers names it.
ACTIVATIONS = {
    "sigmoid": "torch.nn.modules.activation.Sigmoid",
    "identity": "torch.nn.modules.linear.Identity",
}
# CrossEncoder's activation for one output where its directory names none.
DEFAULT_ACTIVATION = "sigmoid"
# The one module of a 6.x CrossEncoder directory and its sentence_bert_config.json.
_TRANSFORMER_MODULE = "sentence_transformers.base.modules.transformer.Transformer"
_TRANSFORMER_SETTINGS = {
    "transformer_task": "sequence-classification",
    "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
    "module_output_name": "scores",
}


def save_cross_encoder(
    directory: str | os.PathLike,
    config: EncoderConfig,
    params: PyTree,
    *,
    tokenizer: str | os.PathLike | tokenization.SubwordTokenizer,
    max_seq_length: int,
    activation: str = "sigmoid",
    card: str | None = None,
) -> str:
    """Writes a CrossEncoder directory of the reranker in `params`.

    `CrossEncoder(directory).predict(pairs)` then equals `activation(logit)` of bert_jax's
    head on the same pairs (laid out by the family's tokenizer, truncated to `max_seq_length`).
    Files already there are replaced, each written whole.

    Args:
      directory: the folder to write (local or a URL); made if absent.
      config: the model's architecture (any family's), `num_labels` 1.
      params: the family's sequence-classification head's parameters.
      tokenizer: the tokenizer, or a folder holding one of the model's family.
      max_seq_length: tokens a pair keeps, special tokens included.
      activation: "sigmoid" (CrossEncoder's default for one output) or "identity" (raw logits).
      card: README.md's text (None: no card).

    Returns:
      `directory` as a string.

    Raises:
      ValueError: num_labels other than 1, an unknown activation, a max_seq_length the model
        cannot take, a tokenizer whose vocabulary is not the model's.
    """
    if config.num_labels != 1:
        raise ValueError(
            f"a CrossEncoder reranker has one output; the config has {config.num_labels}"
        )
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r}; expected one of {sorted(ACTIVATIONS)}")
    check_settings(config, "cls", max_seq_length)
    tokenizer = _tokenizer(tokenizer, config.vocab_size)
    head = family_of(config).head_for(Role.SEQUENCE_CLASSIFICATION)
    out = prepare_out_dir(directory, [], overwrite=True)
    save_pytorch(config, params, out, head, overwrite=True)
    tokenizer.save(out, model_max_length=max_seq_length)
    hf_config = json.loads((out / "config.json").read_text())
    hf_config["sentence_transformers"] = {"activation_fn": ACTIVATIONS[activation]}
    _write_json(out / "config.json", hf_config)
    st_config = {
        "activation_fn": ACTIVATIONS[activation],
        "default_prompt_name": None,
        "model_type": "CrossEncoder",
        "prompts": {},
    }
    _write_json(out / ST_CONFIG, st_config)
    modules = [{"idx": 0, "name": "0", "path": "", "type": _TRANSFORMER_MODULE}]
    _write_json(out / MODULES_FILE, modules)
    _write_json(out / TRANSFORMER_CONFIG, _TRANSFORMER_SETTINGS)
    if card is not None:
        write_text_whole(out / model_card.CARD_NAME, card)
    return os.fspath(out)


def read_activation(directory: str | os.PathLike) -> str:
    """The activation `CrossEncoder(directory).predict` applies to the one output's logit, read
    where CrossEncoder reads it (the module docstring's order); its default where none is.

    Args:
      directory: a folder (local or a URL), or a checkpoint file (which names none).

    Returns:
      "sigmoid" or "identity" (`ACTIVATIONS`).

    Raises:
      ValueError: an activation bert_jax does not compute, naming it and the file.
    """
    folder = as_path(directory)
    if not folder.is_dir():
        return DEFAULT_ACTIVATION
    st_config = _object(folder / ST_CONFIG)
    config = _object(folder / "config.json")
    block = config.get("sentence_transformers")
    for file, value in (
        (ST_CONFIG, st_config.get("activation_fn")),
        ("config.json", block.get("activation_fn") if isinstance(block, dict) else None),
        ("config.json", config.get("sbert_ce_default_activation_function")),
    ):
        if value is None:
            continue
        # "torch.nn.Sigmoid" and "torch.nn.modules.activation.Sigmoid" are one class
        names = {torch_name.rsplit(".", 1)[-1]: name for name, torch_name in ACTIVATIONS.items()}
        name = names.get(str(value).rsplit(".", 1)[-1])
        if name is None:
            raise ValueError(
                f"{folder / file} names the activation {value!r}; bert_jax computes "
                + ", ".join(sorted(ACTIVATIONS.values()))
            )
        return name
    return DEFAULT_ACTIVATION


def _object(path) -> dict:
    """A JSON object file's contents; {} where there is no such file."""
    value = _read_json(path) if path.is_file() else {}
    return value if isinstance(value, dict) else {}
