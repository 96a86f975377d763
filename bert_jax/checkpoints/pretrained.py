"""The one loader: every path into weights (`init_from`, fine-tuning, inference, `from_pretrained`)
reads a checkpoint through `load`, which returns one record.

    loaded = pretrained.load("path/or/gs://bucket/dir/or/org/name", "BertForMaskedLM")
    loaded.config, loaded.params, loaded.head, loaded.tokenizer, loaded.family

    import bert_jax
    m = bert_jax.from_pretrained("path/to/dir", head="BertForSequenceClassification",
                                 dtype="bfloat16")
    out = m.model.apply({"params": m.params}, input_ids, attention_mask=mask)   # out.logits [B, N]

A source is any checkpoint `bert_jax.convert` reads (transformers PyTorch or Flax directories, TF
checkpoints, bert_jax exports, train.py run directories), a local path or a URL (`gs://...`,
through `etils.epath`), or a Hugging Face Hub id (`checkpoints.hub`: the cache, else a
download where one is allowed). An existing path always wins over a Hub id. `from_pretrained`
adds the module, the dtypes and the layer layout: the result is a plain Flax module, its
parameter dict and its config (docs/from_transformers_flax.md maps transformers' Flax calls).
Beside them: `resolve` (where a source's model is: a finished run's `hf/`), `find_tokenizer` (the
one vocabulary lookup), `read_config` (the config alone) and `read_head` (the head class it
stores).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import traverse_util

from bert_jax import tokenization
from bert_jax.checkpoints import checkpointing, detect, hf, hub, run_params, table
from bert_jax.checkpoints.sentence_transformers import (
    SentenceTransformerSettings,
    read_sentence_transformer,
)
from bert_jax.models import families
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.params import stack_layers
from bert_jax.paths import as_path

PyTree = Any
TOKENIZER_FILES = tokenization.TOKENIZER_FILES


class Loaded(NamedTuple):
    """What `load` returns.

    Attributes:
      config: the architecture (the family's config class: `BertConfig`, `ModernBertConfig`).
      params: a nested dict of host numpy arrays as stored (float32 from HF files; layers
        unstacked), or, where `placed`, jax.Arrays in the shardings of `load`'s `targets`.
      head: the class name of `params` ("BertForPreTraining", "ModernBertModel", ...).
      tokenizer: the WordPiece tokenizer found beside the weights (or in a run's `hf/`, `data/`),
        or None (or not looked for: `load(..., with_tokenizer=False)`).
      family: the model family's registry row (`models.families.Family`).
      placed: whether `params` are the sharded arrays of `targets` (a train.py run of this head
        and layout, read without a host copy).
      report: what was loaded, left unused or newly initialized (`table.ConversionReport`);
        None where `placed`.
      sentence_transformer: the pooling, normalization and max_seq_length of a
        sentence-transformers directory (the source, or a run's `hf/`), else None.
    """

    config: Any
    params: PyTree
    head: str
    tokenizer: tokenization.SubwordTokenizer | None
    family: families.Family
    placed: bool = False
    report: Any = None
    sentence_transformer: SentenceTransformerSettings | None = None


class Pretrained(NamedTuple):
    """What `from_pretrained` returns.

    Attributes:
      model: the head module (e.g. `BertForSequenceClassification(config, runtime)`); apply it as
        `model.apply({"params": params}, input_ids, ...)`.
      params: its parameters, a nested dict of host numpy arrays in `param_dtype`; the layers
        stacked on a leading axis with `scan_layers`.
      config: the architecture (the family's config class: `BertConfig`, `ModernBertConfig`;
        the fields of config.json).
      tokenizer: the WordPiece tokenizer found beside the weights, or None.
      head: the head's class name ("BertForSequenceClassification").
    """

    model: nn.Module
    params: PyTree
    config: families.EncoderConfig
    tokenizer: tokenization.SubwordTokenizer | None
    head: str


def resolve(source: str | os.PathLike) -> str:
    """Where the checkpoint `source` names is (`hub.resolve`: a path, a URL or a Hub id); for a
    finished train.py run (no `checkpoints/` or `export/` left) the model it wrote at its end, its
    `hf/` (the embedding and reranker jobs' sentence-transformers directory).

    Raises:
      ValueError: `source` is a run of several seeds, each with its own model
        (`detect.several_seeds`: naming the seeds' directories to choose from).
    """
    path = hub.resolve(source)
    local = as_path(path)
    if not local.is_dir() or (local / "checkpoints").is_dir() or (local / "export").is_dir():
        return path
    if (local / "hf").is_dir():
        return os.fspath(local / "hf")
    error = detect.several_seeds(local)
    if error is not None:
        raise error
    return path


def find_tokenizer(
    path: str | os.PathLike, vocab_size: int | None = None
) -> tokenization.SubwordTokenizer | None:
    """The tokenizer.json / vocab.txt in `path` (a directory, or beside a checkpoint file or TF
    prefix), in its encoder's folder (a sentence-transformers Router's route) or in its `hf/`,
    `data/` (a run directory), local, a URL or a Hub id (`resolve`); None when there is none.

    Raises:
      ValueError: `vocab_size` is given and the vocabulary found has another number of tokens.
    """
    base = as_path(resolve(path))
    base = base if base.is_dir() else base.parent
    st = _sentence_transformer_of(os.fspath(base), run=False)
    encoder = [base / st.transformer_path] if st is not None and st.transformer_path else []
    for folder in (base, *encoder, base / "hf", base / "data"):
        for name in TOKENIZER_FILES:
            file = folder / name
            if file.is_file():
                tokenizer = tokenization.load_tokenizer(file)
                if vocab_size is not None and tokenizer.vocab_size != vocab_size:
                    raise ValueError(
                        f"{file} has {tokenizer.vocab_size} tokens but the model {vocab_size}"
                    )
                return tokenizer
    return None


def load(
    source: str | os.PathLike,
    head: families.Role | str | None = None,
    *,
    allow_new_heads: bool = False,
    num_labels: int | None = None,
    hidden_act: str | None = None,
    tf_config: str | os.PathLike | None = None,
    targets: PyTree | None = None,
    with_tokenizer: bool = True,
    log_report: bool = True,
) -> Loaded:
    """Reads a checkpoint: a path, a URL or a Hub id (see the module's docstring).

    A run directory gives its newest checkpoint read straight into `targets` where they are
    given and fit (same head and layer layout); else its `export/` where it has one (the model
    the run wrote at its end: fine-tuning's best under `finetune.keep=best`); else its newest
    checkpoint on the host. A sentence-transformers directory (or a run whose `hf/` is one) gives
    its encoder and, in `sentence_transformer`, its pooling, normalization and max_seq_length.

    Args:
      source: where the checkpoint is.
      head: the head of the result: a `Role` (or its value, "masked_lm": a RoBERTa checkpoint's
        RobertaForMaskedLM), or a class name of the checkpoint's family (transformers'
        "FlaxBert..." names are taken too); None: the checkpoint's own (config.json's
        `architectures`).
      allow_new_heads: initialize head weights the checkpoint lacks (seed 0) instead of raising.
      num_labels: a new `head` with this many labels: the encoder (and pooler) from the
        checkpoint, the head's weights initialized (seed 0).
      hidden_act: TF checkpoints only, the activation in place of bert_config.json's.
      tf_config: TF checkpoints only, the model's config file in place of the one beside the
        checkpoint (`checkpoints.tf.load_tf`'s config_path).
      targets: `jax.ShapeDtypeStruct`s with `.sharding` of a run's parameters, or None.
      with_tokenizer: look for the tokenizer (checked against the model's vocabulary).
      log_report: log what was loaded once (`ConversionReport.log`: a warning where weights were
        left unused or newly initialized, or a choice was noted); False for a caller that shows
        the report itself (`bert_jax.convert`).

    Returns:
      A `Loaded` (config, params, head, tokenizer, family, placed, report,
      sentence_transformer).

    Raises:
      ValueError: a sentence-transformers directory with modules bert_jax does not compute; a
        `head` of another family than the checkpoint's (naming the family's own class).
    """
    head = _canonical_head(head)
    path = weights = resolve(source)
    run = (as_path(path) / "checkpoints").is_dir()
    st = _sentence_transformer_of(path, run)
    if st is not None and st.transformer_path and not run:  # an old directory: the encoder's folder
        path = weights = os.fspath(as_path(path) / st.transformer_path)
    loaded = None
    if run and targets is not None and head is not None and num_labels is None:
        loaded = _run_into_targets(path, head, targets)
    if loaded is None:
        if (as_path(path) / "export").is_dir():  # a run's model as it wrote it at its end
            weights, run = os.fspath(as_path(path) / "export"), False
        loaded = _read(weights, head, allow_new_heads, hidden_act, num_labels, tf_config)
        if log_report:
            loaded.report.log(f"{loaded.head} from {weights}")
    if with_tokenizer:
        vocab_size = loaded.config.vocab_size
        tokenizer = find_tokenizer(path, vocab_size)
        if tokenizer is None and weights != path:
            tokenizer = find_tokenizer(weights, vocab_size)
        loaded = loaded._replace(tokenizer=tokenizer)
    return loaded._replace(sentence_transformer=st)


def _sentence_transformer_of(path: str, run: bool) -> SentenceTransformerSettings | None:
    """The settings of the sentence-transformers directory at `path` (a run: its `hf/`), or None
    (no such directory, or `path` a file or a TF prefix)."""
    folder = as_path(path) / "hf" if run else as_path(path)
    return read_sentence_transformer(folder) if folder.is_dir() else None


def _canonical_head(head: families.Role | str | None) -> families.Role | str | None:
    """`head` as a role or a class name of some family: transformers' Flax class names
    ("FlaxBertModel") are the class without the prefix; an unknown name raises naming the known
    ones."""
    if head is None:
        return None
    if isinstance(head, str) and head not in families.MODEL_CLASSES:
        flax_name = head.removeprefix("Flax")
        head = flax_name if flax_name in families.MODEL_CLASSES else head
    return families.check_head(head)


def _run_into_targets(path: str, head: str, targets: PyTree) -> Loaded | None:
    """The newest checkpoint of the run at `path` read into `targets`' shardings; None when it is
    of another head or its parameters have other shapes (another layer layout)."""
    run = run_params.read_run_params(path, targets=targets)
    if run is None:
        return None
    config = families.config_from_hf_dict(run.config)
    if run.head != families.head_in_family(config, head):
        return None
    logging.info("%s: the parameters of step %d, read into their shardings", path, run.step)
    return Loaded(config, run.params, run.head, None, families.family_of(config), placed=True)


def _read(path: str, head, allow_new_heads: bool, hidden_act, num_labels, tf_config=None) -> Loaded:
    """The host parameters of the checkpoint at `path` (local or a URL), as `load`'s record
    without the tokenizer."""
    role = families.Role.ENCODER if num_labels is not None else head
    if (as_path(path) / "checkpoints").is_dir():
        config, params, stored, _ = run_params.load_training_checkpoint(path)
        report = table.ConversionReport(loaded=list(traverse_util.flatten_dict(params, sep="/")))
        role = role and families.head_in_family(config, role)
        if role and role != stored:
            params, report = _rehead(config, params, stored, role, allow_new_heads)
            stored = role
    else:
        config, params, stored, report = detect.load_any(
            path, role, allow_new_heads=allow_new_heads or num_labels is not None,
            hidden_act=hidden_act, config_path=tf_config,
        )  # fmt: skip
    if num_labels is not None:
        if head is None:
            raise ValueError("num_labels needs the head, e.g. head='BertForSequenceClassification'")
        config = config.replace(num_labels=num_labels, label_names=None)
        head = families.head_in_family(config, head)
        stored, (params, report) = head, _rehead(config, params, stored, head, True)
    return Loaded(config, params, stored, None, families.family_of(config), report=report)


def _rehead(config, params: PyTree, stored: str, head: str, allow_new_heads: bool):
    """(params of `head`, report) from `params` of `stored`, mapped through the HF names."""
    state = table.params_to_hf_state(config, params, stored)
    return hf.hf_state_to_params(config, state, head, allow_new_heads=allow_new_heads)


def _description(source: str | os.PathLike) -> tuple[Any, dict | None]:
    """Where a checkpoint describes itself: (the directory or file beside its config.json,
    None), or for a run without an export (its checkpoints' folder, its newest checkpoint's
    record; {} where it has none yet)."""
    path = as_path(resolve(source))
    if (path / "export").is_dir():
        return path / "export", None
    if (path / "checkpoints").is_dir():
        root = checkpointing.run_checkpoints(path)
        steps = checkpointing.saved_steps(root)
        return root, checkpointing.read_meta(root, steps[-1]) if steps else {}
    return path, None


def read_config(source: str | os.PathLike) -> Any:
    """The model config of a checkpoint without its weights: config.json (or bert_config.json)
    beside them (a sentence-transformers directory's: its encoder folder's), a run's `export/`
    one or its newest checkpoint's record.

    Returns:
      The family's config (`BertConfig`, `ModernBertConfig`).
    """
    path, record = _description(source)
    if record == {}:
        raise FileNotFoundError(f"no training checkpoints in {path}")
    if record is not None:
        return families.config_from_hf_dict(record["config"])
    if not path.is_dir():
        return families.config_from_json_file(path.parent)  # a TF checkpoint: beside it
    st = _sentence_transformer_of(os.fspath(path), run=False)
    if st is not None and st.transformer_path:  # the encoder's own folder (a Router's route)
        path = path / st.transformer_path
    return families.config_from_json_file(path)


def read_head(source: str | os.PathLike) -> str | None:
    """The head class a checkpoint stores, without its weights: the first class config.json's
    `architectures` names (a transformers or bert_jax directory, a run's `export/`), or a run's
    newest checkpoint's record; None where none is named (a TF checkpoint)."""
    path, record = _description(source)
    if record is not None:
        return record.get("model")
    config_json = (path if path.is_dir() else path.parent) / "config.json"
    return (hf.default_model(config_json, "") or None) if config_json.is_file() else None


def from_pretrained(
    path: str | os.PathLike,
    head: families.Role | str | None = None,
    *,
    dtype: Any = "float32",
    param_dtype: Any = "float32",
    scan_layers: bool = False,
    remat_policy: str = "none",
    allow_new_heads: bool = False,
    num_labels: int | None = None,
) -> Pretrained:
    """Loads a checkpoint as (module, params, config, tokenizer, head): `load` and the module.

    Args:
      path: a local path, a URL (`gs://...`) or a Hugging Face Hub id ("org/name": the cache,
        else a download unless HF_HUB_OFFLINE=1) of a transformers directory (config.json +
        flax_model.msgpack, model.safetensors or pytorch_model.bin), a bert_jax export, a TF
        checkpoint, or a train.py run directory (its `export/`, else its newest checkpoint).
      head: the head class of the checkpoint's family, e.g. "BertForSequenceClassification"
        (a "FlaxBert..." name is taken too; another family's class raises ValueError naming
        this family's), or its `Role` (any family: "sequence_classification"); None:
        config.json's `architectures`; Role.ENCODER ("encoder") is the bare encoder.
      dtype: compute dtype of the module ("float32", "bfloat16", "float16" or a jnp dtype), as
        the `dtype` of transformers' Flax classes: LayerNorm and softmax stay float32.
      param_dtype: dtype the parameters are cast to and the module declares ("float32" or
        "bfloat16"); transformers left them float32 whatever `dtype` said (its `to_bf16`).
      scan_layers: stack the layers and run them as one `nn.scan` (one compiled layer).
      remat_policy: "none", "dots", "dots_no_batch" or "full": what each layer keeps for the
        backward pass (transformers' `gradient_checkpointing=True` is "full").
      allow_new_heads: initialize head weights the checkpoint lacks (seed 0) instead of raising.
      num_labels: a new head with this many labels (transformers' `num_labels=`).

    Returns:
      A `Pretrained` (model, params, config, tokenizer, head): params host numpy arrays in
      `param_dtype`.
    """
    loaded = load(path, head, allow_new_heads=allow_new_heads, num_labels=num_labels)
    runtime = RuntimeConfig(
        dtype=jnp.dtype(dtype).name,
        param_dtype=jnp.dtype(param_dtype).name,
        scan_layers=scan_layers,
        remat_policy=remat_policy,
    )
    cast = jnp.dtype(runtime.param_dtype)
    params = jax.tree_util.tree_map(lambda x: np.asarray(x).astype(cast), loaded.params)
    if scan_layers:
        params = jax.tree_util.tree_map(np.asarray, stack_layers(params))
    model = families.get_model_class(loaded.head)(loaded.config, runtime)
    return Pretrained(model, params, loaded.config, loaded.tokenizer, loaded.head)
