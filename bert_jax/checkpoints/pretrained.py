"""One call from a checkpoint directory to a model you can apply: `bert_jax.from_pretrained`.

    import bert_jax
    m = bert_jax.from_pretrained("path/to/dir", head="BertForSequenceClassification",
                                 dtype="bfloat16")
    out = m.model.apply({"params": m.params}, input_ids, attention_mask=mask)   # out.logits [B, N]

It reads every format `bert_jax.convert` reads (transformers PyTorch or Flax directories, TF
checkpoints, bert_jax exports, train.py run directories) and nothing else happens behind it: the
result is a plain Flax module, its parameter dict and its config, which you apply, jit, shard and
train yourself (docs/from_transformers_flax.md maps transformers' Flax calls to these). Nothing is
downloaded; a Hugging Face Hub id is refused with how to fetch the repository.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from bert_jax import tokenization
from bert_jax.checkpoints import detect, hf, table
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.bert.model import stack_layers
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.families import get_model_class
from bert_jax.paths import missing_path_error

PyTree = Any
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")


class Pretrained(NamedTuple):
    """What `from_pretrained` returns.

    Attributes:
      model: the head module (e.g. `BertForSequenceClassification(config, runtime)`); apply it as
        `model.apply({"params": params}, input_ids, ...)`.
      params: its parameters, a nested dict of host numpy arrays in `param_dtype`; the layers
        stacked on a leading axis with `scan_layers`.
      config: the architecture (`BertConfig`, the fields of config.json).
      tokenizer: the WordPiece tokenizer found beside the weights, or None.
      head: the head's class name ("BertForSequenceClassification").
    """

    model: nn.Module
    params: PyTree
    config: BertConfig
    tokenizer: tokenization.WordPieceTokenizer | None
    head: str


def _dtype_name(dtype) -> str:
    """ "bfloat16" for "bfloat16", jnp.bfloat16 or np.dtype(...)."""
    return jnp.dtype(dtype).name


def find_tokenizer(path: str, config: BertConfig) -> tokenization.WordPieceTokenizer | None:
    """The tokenizer.json / vocab.txt in `path` or its `hf/`, `data/` (a run directory), or None;
    raises when its vocabulary does not fit the model's."""
    for folder in (path, os.path.join(path, "hf"), os.path.join(path, "data")):
        for name in TOKENIZER_FILES:
            file = os.path.join(folder, name)
            if os.path.isfile(file):
                tokenizer = tokenization.load_tokenizer(file)
                if tokenizer.vocab_size != config.vocab_size:
                    raise ValueError(
                        f"{file} has {tokenizer.vocab_size} tokens but the model "
                        f"{config.vocab_size}"
                    )
                return tokenizer
    return None


def from_pretrained(
    path: str | os.PathLike,
    head: str | None = None,
    *,
    dtype: Any = "float32",
    param_dtype: Any = "float32",
    scan_layers: bool = False,
    remat_policy: str = "none",
    allow_new_heads: bool = False,
    num_labels: int | None = None,
) -> Pretrained:
    """Loads a checkpoint directory as (module, params, config, tokenizer).

    Args:
      path: a local directory: transformers (config.json + flax_model.msgpack, model.safetensors
        or pytorch_model.bin), a bert_jax export, a TF checkpoint, or a train.py run directory
        (its `export/`, else its newest checkpoint). Never a Hub id: nothing is downloaded.
      head: the head class, e.g. "BertForSequenceClassification" (a "FlaxBert..." name is taken
        too); None: config.json's `architectures` (what FlaxAutoModelFor... picked), and
        "BertModel" is the bare encoder (FlaxAutoModel).
      dtype: compute dtype of the module ("float32", "bfloat16", "float16" or a jnp dtype), as
        the `dtype` of transformers' Flax classes: LayerNorm and softmax stay float32.
      param_dtype: dtype the parameters are cast to and the module declares ("float32" or
        "bfloat16"); transformers left them float32 whatever `dtype` said (its `to_bf16`).
      scan_layers: stack the layers and run them as one `nn.scan` (one compiled layer).
      remat_policy: "none", "dots", "dots_no_batch" or "full": what each layer keeps for the
        backward pass (transformers' `gradient_checkpointing=True` is "full").
      allow_new_heads: initialize head weights the checkpoint lacks (seed 0) instead of raising.
      num_labels: a new head with this many labels (transformers' `num_labels=`): the encoder
        (and pooler, where the checkpoint has one) from the checkpoint, the head's weights
        initialized (seed 0) whatever head the checkpoint has.

    Returns:
      A `Pretrained` (model, params, config, tokenizer, head).
    """
    path = os.fspath(path)
    if not os.path.exists(path) and not os.path.exists(path + ".index"):  # .index: a TF prefix
        raise missing_path_error(path)
    if head is not None and head.startswith("FlaxBert"):
        head = head[len("Flax") :]
    if head is not None:
        get_model_class(head)  # an unknown name fails here, naming the known ones
    weights = path
    if os.path.isdir(os.path.join(path, "export")):  # a run directory: its exported model
        weights = os.path.join(path, "export")
    if num_labels is None:
        config, params, head, report = detect.load_any(
            weights, head, allow_new_heads=allow_new_heads
        )
    else:
        if head is None:
            raise ValueError("num_labels needs the head, e.g. head='BertForSequenceClassification'")
        config, encoder, _, _ = detect.load_any(weights, "BertModel", allow_new_heads=True)
        state = table.params_to_hf_state(config, encoder, "BertModel")
        config = config.replace(num_labels=num_labels, label_names=None)
        params, report = hf.hf_state_to_params(config, state, head, allow_new_heads=True)
    logging.info("%s from %s: %s", head, weights, report.summary())
    runtime = RuntimeConfig(
        dtype=_dtype_name(dtype),
        param_dtype=_dtype_name(param_dtype),
        scan_layers=scan_layers,
        remat_policy=remat_policy,
    )
    cast = jnp.dtype(runtime.param_dtype)
    params = jax.tree_util.tree_map(lambda x: np.asarray(x).astype(cast), params)
    if scan_layers:
        params = jax.tree_util.tree_map(np.asarray, stack_layers(params))
    model = get_model_class(head)(config, runtime)
    tokenizer = find_tokenizer(path, config) or find_tokenizer(weights, config)
    return Pretrained(model, params, config, tokenizer, head)
