"""The state a run starts from, and its step.

    start = starting_state(exp, ckpt, data, init_from=config.init_from, starting_values=...)
    state, step = start.state, start.step

In this order: the newest good checkpoint in the run's directory (with the data position);
given parameters (`init_params`: fine-tuning's encoder with a new head); the weights of
`init_from` (any checkpoint `checkpoints.pretrained.load` reads: a path, a URL or a Hub id; a
`train.py` run of the same head is read straight into its shardings); scratch. Every fresh
state is made by one jitted init per Experiment (reused by every seed), with a scratch run's
special starting values (e.g. the MLM bias at the data's log frequencies, `starting_values`) set
inside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from bert_jax import tokenization
from bert_jax.checkpoints import checkpointing, pretrained, table
from bert_jax.models import families
from bert_jax.models.params import get_at, init_params, replace_at, stack_layers
from bert_jax.training.experiment import Experiment

PyTree = Any
# A parameter's place in the params tree, e.g. ("cls", "predictions", "bias").
ParamPath = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Start:
    """Where a run starts.

    Attributes:
      state: the sharded TrainState.
      step: its step (0 unless restored from a checkpoint).
      source: what it came from, for the log: "checkpoint", "params", "init_from" or "scratch".
    """

    state: Any
    step: int
    source: str


def architecture(config, vocab_size: int | None = None, *, preset: str = ""):
    """The run's architecture: `config.init_from`'s (its config alone, `pretrained.read_config`:
    a path, a URL or a Hub id) when the run starts from one, else the `model` block's
    (`families.config_from_fields`, its family named by `model.model_type`).

    Args:
      config: the experiment config.
      vocab_size: the tokenizer's size, taken where `model.vocab_size` is 0 (None: none known).
      preset: the config variant that sets an architecture, named in the error
        ("configs/finetune.py:task=...,model=base"); "": the job has none.

    Raises:
      ValueError: no init_from, `model.vocab_size` 0 and no `vocab_size` given.
    """
    if config.init_from:
        return pretrained.read_config(config.init_from)
    fields = config.model.to_dict()
    fields["vocab_size"] = fields.get("vocab_size") or vocab_size
    if not fields["vocab_size"]:
        take = f"take a preset ({preset}) or " if preset else ""
        raise ValueError(
            f"the model's vocab_size is unknown without init_from or a tokenizer: {take}set "
            "--config.model.vocab_size"
        )
    return families.config_from_fields(fields)


def starting_state(
    exp: Experiment,
    ckpt: checkpointing.Checkpointer,
    data_iterator=None,
    *,
    init_from: str = "",
    init_params: PyTree | None = None,
    seed: int | None = None,
    starting_values: Callable[[], Mapping[ParamPath, np.ndarray]] | None = None,
    init_values: Callable[[], Mapping[ParamPath, np.ndarray]] | None = None,
) -> Start:
    """The state a run starts from, and its step (see the module's docstring for the order).

    Args:
      exp: the run's Experiment.
      ckpt: the run's Checkpointer; its newest good checkpoint wins.
      data_iterator: the checkpointable source of the training batches, moved to the saved
        position when a checkpoint is restored (None: no data position).
      init_from: a checkpoint of any format, path, URL or Hub id (`pretrained.load`), or "".
      init_params: host parameters of the model (unstacked layers), or None.
      seed: seeds a fresh state's initialization and dropout (default: the config's).
      starting_values: () -> {parameter path: value [the parameter's shape]} set in a scratch
        state; called only for a scratch start (a restored or converted state keeps its values).
      init_values: () -> {parameter path: value} set over what `init_from` gives a model of two
        (`start_from`): what the checkpoint holds beside its encoder, e.g. an inference-free
        model's query weights; called only for that start.
    """
    restored = ckpt.restore_latest(exp.targets(), data_iterator=data_iterator)
    if restored is not None:
        state, source = restored[1], "checkpoint"
    elif init_params is not None:
        state, source = init_state(exp, init_params, seed=seed), "params"
    elif init_from and hasattr(exp.model, "start_from"):  # a model of two (`_init_pair`)
        values = init_values() if init_values is not None else {}
        state, source = _init_pair(exp, init_from, seed, values), "init_from"
    elif init_from:
        loaded = pretrained.load(
            init_from,
            exp.head,
            allow_new_heads=True,
            targets=exp.targets().params,
            with_tokenizer=False,
        )
        state, source = init_state(exp, loaded.params, seed=seed, placed=loaded.placed), "init_from"
    else:
        overrides = starting_values() if starting_values is not None else None
        state, source = init_state(exp, seed=seed, overrides=overrides), "scratch"
    return Start(state, int(jax.device_get(state.step)), source)


def graft(cfg, head: str, encoder, seed: int):
    """Head parameters: `encoder` (the family's base-model params) under the heads' encoder name
    (`bert`, ModernBERT's `model`), new head weights (seeded); or `encoder` itself where it is
    already the whole model of `head` (a fine-tuned head trained on: nothing new).

    Returns (params, names of the newly initialized weights).
    """
    name = families.family_of(cfg).encoder_name
    if name in encoder:  # the head's own tree: {"bert": ..., "classifier": ...}
        table.check_params(cfg, encoder, head)
        return encoder, []
    params = jax.device_get(
        jax.tree_util.tree_map(
            np.asarray, init_params(families.get_model_class(head)(cfg), jax.random.PRNGKey(seed))
        )
    )
    params = nn.meta.unbox(params)
    base = dict(encoder)
    if "pooler" not in params[name]:
        base.pop("pooler", None)
    elif "pooler" not in base:
        base["pooler"] = params[name]["pooler"]
    new = sorted(f"{k}/..." for k in params if k != name)
    params = {**params, name: base}
    table.check_params(cfg, params, head)
    return params, new


def init_state(
    exp: Experiment,
    params: PyTree | None = None,
    *,
    seed: int | None = None,
    overrides: Mapping[ParamPath, np.ndarray] | None = None,
    placed: bool = False,
):
    """A fresh sharded state: from scratch, or around given parameters.

    Args:
      exp: the run's Experiment.
      params: host parameters of the model (unstacked layers; vocabulary rows padded or not),
        or its sharded parameters (`placed`, as `pretrained.load(..., targets=...)` reads a
        run's), or None for scratch.
      seed: the PRNG seed of the initialization and of the run's dropout (default: the
        config's `seed`).
      overrides: parameter path -> value set after a scratch initialization (the same on every
        host; cast to the parameter's dtype, placed in its sharding).
      placed: `params` are already the model's sharded parameters (no host copy is made).

    Returns:
      The sharded TrainState (fresh optimizer state, step 0).
    """
    rng = jax.random.PRNGKey(exp.seed if seed is None else seed)
    if params is None:
        overrides = {path: np.asarray(value) for path, value in (overrides or {}).items()}
        init = exp.cached(("init", tuple(sorted(overrides))), lambda: _jit_init(exp))
        return init(rng, overrides)
    if placed:
        return _init_from_params_fn(exp)(rng, params)
    params = table.fit_vocab_rows(params, exp.model_config)  # e.g. unpadded HF weights
    params = stack_layers(params) if exp.runtime.scan_layers else params
    params = jax.device_put(
        jax.tree_util.tree_map(lambda x: np.asarray(x, exp.runtime.param_dtype), params),
        exp.state_shardings.params,
    )
    return _init_from_params_fn(exp)(rng, params)


def _init_pair(
    exp: Experiment, init_from: str, seed: int | None, values: Mapping[ParamPath, np.ndarray]
):
    """The state of a model that starts from a checkpoint its own way (its `start_from`:
    replaced-token detection's pair, `models.rtd.ReplacedTokenDetection`) from `init_from`: the
    checkpoint read as the discriminator (a head it lacks initialized), the generator fresh but
    for the shared embeddings; `values` set over it (`starting_state`'s init_values)."""
    loaded = pretrained.load(init_from, exp.head, allow_new_heads=True, with_tokenizer=False)
    rng = jax.random.PRNGKey(exp.seed if seed is None else seed)
    fresh = jax.device_get(nn.unbox(init_params(exp.model, jax.random.fold_in(rng, 1))))
    params = exp.model.start_from(fresh, table.fit_vocab_rows(loaded.params, exp.model_config))
    for path, value in values.items():
        params = _with_param(params, path, np.asarray(value))
    params = jax.device_put(
        jax.tree_util.tree_map(lambda x: np.asarray(x, exp.runtime.param_dtype), params),
        exp.state_shardings.params,
    )
    return _init_from_params_fn(exp)(rng, params)


def _jit_init(exp: Experiment):
    """The jitted (rng, {path: value}) -> scratch state with those parameters set."""

    def init(rng, overrides):
        state = nn.unbox(exp.init_fn(rng))
        params = state.params
        for path, value in overrides.items():
            params = _with_param(params, path, value)
        return state.replace(params=params)

    return jax.jit(init, out_shardings=exp.state_shardings)


def _with_param(tree: dict, path: ParamPath, value) -> dict:
    """`tree` with the leaf at `path` replaced by `value` (cast to its dtype)."""
    old = get_at(tree, path)
    if tuple(value.shape) != tuple(old.shape):
        raise ValueError(
            f"starting value for {'/'.join(path)}: shape {tuple(value.shape)}, the parameter's "
            f"is {tuple(old.shape)}"
        )
    return replace_at(tree, path, value.astype(old.dtype))


def _init_from_params_fn(exp: Experiment):
    """The jitted (rng, sharded params) -> state around them (fresh optimizer state)."""
    return exp.cached(
        ("init_from_params",),
        lambda: jax.jit(lambda r, p: exp.init_fn(r, params=p), out_shardings=exp.state_shardings),
    )


def job_tokenizer(
    config, block: str, files: str = "tokenizer.json or vocab.txt"
) -> tokenization.SubwordTokenizer:
    """The tokenizer of a job whose block (`config.<block>`) has a `tokenizer` setting: that
    file, else the vocabulary beside `init_from` (or in its hf/, data/;
    `pretrained.find_tokenizer`: a path, a URL or a Hub id).

    Raises:
      ValueError: neither is set; FileNotFoundError: init_from holds no tokenizer (`files`
        names what was looked for); both naming the setting to set.
    """
    setting, source = config[block].tokenizer, config.init_from
    if setting:
        return tokenization.load_tokenizer(setting)
    if not source:
        raise ValueError(f"set config.{block}.tokenizer (no init_from to take the vocabulary from)")
    tokenizer = pretrained.find_tokenizer(source)
    if tokenizer is None:
        raise FileNotFoundError(
            f"no {files} in {source} (or its hf/, data/); set config.{block}.tokenizer"
        )
    return tokenizer
