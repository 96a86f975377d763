"""The end of a run: its parameters written as a model others can load.

    export(params, workdir, model_config, head, tokenizer=tokenizer)

writes `<workdir>/export` (bert_jax's format, `native.load_pretrained`) and `<workdir>/hf` (a
Hugging Face `transformers` directory: config.json, model.safetensors and, given a tokenizer, its
files with their tokenizer_config.json, which `transformers.AutoTokenizer` reads; given the
experiment config, README.md: the Hub's model card from the run's records).
Both jobs call it after their last step; the loop knows nothing of formats.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from absl import logging

from bert_jax.checkpoints import model_card, native
from bert_jax.checkpoints.hf import save_pytorch
from bert_jax.models.config import EncoderConfig
from bert_jax.paths import as_path

PyTree = Any
# config.json's special-token ids (kept for tokenizers and transformers; no model reads them) and
# the tokenizer's role that holds each (`tokenization.base`): the row's first token, a segment's
# end, the mask token.
SPECIAL_ID_ROLES = {"bos_token_id": "cls_id", "cls_token_id": "cls_id", "eos_token_id": "sep_id",
                    "sep_token_id": "sep_id", "mask_token_id": "mask_id"}  # fmt: skip


def with_tokenizer_ids(model_config: EncoderConfig, tokenizer) -> EncoderConfig:
    """`model_config` with each special-token id that lies outside its vocabulary replaced by
    the tokenizer's (`SPECIAL_ID_ROLES`), for the fields the family has: a tiny recipe keeps its
    family's released ids (EuroBERT's 128000..128002) beside a vocabulary of its own, which
    transformers refuses to trust. Ids inside the vocabulary stay as they are; each change is
    logged."""
    names = {f.name for f in dataclasses.fields(model_config)}
    changes = {}
    for name, role in SPECIAL_ID_ROLES.items():
        value = getattr(model_config, name) if name in names else None
        if isinstance(value, int) and not 0 <= value < model_config.vocab_size:
            changes[name] = int(getattr(tokenizer, role))
    if not changes:
        return model_config
    logging.info("config.json's special-token ids outside the vocabulary of %d set to the "
                 "tokenizer's: %s", model_config.vocab_size, changes)  # fmt: skip
    return dataclasses.replace(model_config, **changes)


def export(
    params: PyTree,
    out_dir: str,
    model_config: EncoderConfig,
    head: str,
    *,
    hf: bool = True,
    tokenizer=None,
    config=None,
) -> dict[str, str]:
    """Writes `out_dir/export` (bert_jax format) and, with `hf`, `out_dir/hf` (transformers).

    Every process must call this: the parameters are gathered to every host, all processes
    take part in the (collective) Orbax save, and process 0 alone writes the safetensors and the
    tokenizer.

    Args:
      params: the model's parameters (global, possibly sharded, arrays).
      out_dir: the run (or seed) directory; a `gs://` URL stays one.
      model_config: the model's architecture.
      head: the head's class name ("BertForPreTraining", ...).
      hf: also write the transformers directory.
      tokenizer: a `tokenization` tokenizer saved into `hf/` with its tokenizer_config.json
        (`model_max_length`: the model's `max_sequence_length`), whose ids replace special-token
        ids outside the vocabulary in both configs (`with_tokenizer_ids`); None: no tokenizer
        there.
      config: the experiment config: `hf/README.md` becomes the Hub's model card, from the run's
        records in `out_dir` (its metrics.jsonl) and the config's `model_card` block (None: no
        card).

    Returns:
      label -> where it went, for the run's summary ("export", and "hf" with `hf`).
    """
    from jax.experimental import multihost_utils

    host_params = multihost_utils.process_allgather(params, tiled=True)
    out = as_path(out_dir)
    if tokenizer is not None:
        model_config = with_tokenizer_ids(model_config, tokenizer)
    native.save_pretrained(out / "export", model_config, host_params, head, overwrite=True)
    places = {"export": f"{out / 'export'} (bert_jax)"}
    if hf:
        if jax.process_index() == 0:
            save_pytorch(model_config, host_params, out / "hf", head, overwrite=True)
            if tokenizer is not None:  # <out>/hf is then a complete transformers directory:
                # the tokenizer's files and its tokenizer_config.json (its class, its specials)
                tokenizer.save(out / "hf", model_max_length=model_config.max_sequence_length)
            if config is not None:
                model_card.for_run(out / "hf", model_config, head, config, out_dir)
        places["hf"] = f"{out / 'hf'} (transformers)"
    logging.info("exported %s to %s", head, out_dir)
    return places


def write_from_process_0(params: PyTree, write: Callable[[PyTree], None]) -> None:
    """Gathers `params` to every host and calls `write(host_params)` on process 0 alone: the
    way a job writes a format of its own (a sentence-transformers or CrossEncoder directory).
    Every process must call this (the gather is a collective)."""
    from jax.experimental import multihost_utils

    host_params = multihost_utils.process_allgather(params, tiled=True)
    if jax.process_index() == 0:
        write(host_params)


def training_section(
    job: str,
    config,
    data: str,
    items: list[str],
    dev: tuple[str, tuple[str, ...], list[tuple[str, ...]]] | None = None,
) -> list[str]:
    """The "## Training" lines of a job's model card (markdown), where the job writes its own
    card (the embedding and reranker jobs' exports).

    Args:
      job: the job's words and config file ("embedding job", ...: "configs/embed.py" follows
        from `config.job`).
      config: the experiment config (`job`, `init_from`).
      data: what it trained on ("1,000 pairs of `train.jsonl`").
      items: the list under it (loss, batch, schedule, ...).
      dev: (its title, the table's column names, its rows of cells) of the dev scores; None:
        no dev set.
    """
    lines = [
        "## Training",
        "",
        f"Trained with bert_jax's {job} (`train.py --config=configs/{config.job}.py`) from "
        f"`{config.init_from or 'scratch'}` on {data}:",
        "",
        *(f"- {item}" for item in items),
    ]
    if dev is not None:
        title, columns, rows = dev
        lines += ["", title, "", f"| {' | '.join(columns)} |", "|" + "---|" * len(columns)]
        lines += [f"| {' | '.join(row)} |" for row in rows]
    return lines
