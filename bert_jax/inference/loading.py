"""Checkpoints for inference, of any model family, and the modules that run them.

A command loads a checkpoint as it is stored (`load`: its head as the loader reports it) and takes
what it needs from the family's row in the registry (`models.families`): the bare encoder and
where a head's parameters hold it (`encoder`), whether the encoder has a pooler layer
(`check_pooler`), which heads predict masked tokens (`masked_lm_heads`), and whether a module
reads token types (`token_type_inputs`). A cross-encoder (`load_cross_encoder`: a one-output
sequence classifier, a sentence-transformers CrossEncoder directory among them) comes with the
activation its scores take and its max_seq_length. Nothing here names a family.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import tokenization
from bert_jax.checkpoints import cross_encoder, pretrained, table
from bert_jax.checkpoints.sentence_transformers import read_max_seq_length
from bert_jax.inference import batches
from bert_jax.models import rtd
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.families import EncoderConfig, Role, family_of, get_model_class
from bert_jax.paths import as_path

# The head fill-mask loads where a checkpoint names none (`Family.head_for` gives each family's).
MASKED_LM_ROLE = Role.MASKED_LM


def load(path: str, model: Role | str | None = None):
    """(config, params, model class name, tokenizer) for inference from any checkpoint path.

    Args:
      path: a Hugging Face directory, a bert_jax export, a TF checkpoint or a run directory.
      model: the head to load it as: a `Role` (Role.ENCODER: the bare encoder), or a class name
        of the checkpoint's family; None: the head it was saved with.

    Raises:
      FileNotFoundError: no tokenizer (`tokenization.TOKENIZER_FILES`) beside the weights.
    """
    loaded = pretrained.from_pretrained(path, model)
    if loaded.tokenizer is None:
        raise FileNotFoundError(
            f"no tokenizer ({', '.join(tokenization.TOKENIZER_FILES)}) beside {path}"
        )
    return loaded.config, loaded.params, loaded.head, loaded.tokenizer


def load_embedder(path: str):
    """(config, float32 params, tokenizer, sentence-transformers settings or None) of any
    checkpoint, for `embed`: the settings are those of a sentence-transformers directory (or a
    run's `hf/` that is one), which `encoder.embedding_options` takes as the defaults.

    Raises:
      FileNotFoundError: no tokenizer.json or vocab.txt beside the weights.
    """
    loaded = pretrained.load(path)
    if loaded.tokenizer is None:
        raise FileNotFoundError(f"no tokenizer.json or vocab.txt beside {path}")
    params = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), loaded.params)
    return loaded.config, params, loaded.tokenizer, loaded.sentence_transformer


class CrossEncoder(NamedTuple):
    """A cross-encoder for `rerank`: a sequence classifier whose one logit scores a pair.

    Attributes:
      config, params, head, tokenizer: as `load` returns them.
      activation: what its scores take (`checkpoints.cross_encoder.read_activation`: "sigmoid"
        or "identity").
      max_seq_length: the directory's (sentence_bert_config.json, tokenizer_config.json's
        model_max_length), or None.
    """

    config: EncoderConfig
    params: Any
    head: str
    tokenizer: Any
    activation: str
    max_seq_length: int | None

    def pair_length(self, given: int | None = 0) -> int:
        """Tokens a pair keeps: `given`, else the directory's max_seq_length, else the model's
        positions (what `CrossEncoder(path)` truncates to); not clipped to the positions (a
        `given` beyond them is cut there by the batching, with a warning)."""
        batches.warn_beyond_positions(given or None, self.config)
        return given or self.max_seq_length or self.config.max_sequence_length


def load_cross_encoder(path: str) -> CrossEncoder:
    """A cross-encoder from any checkpoint path (a transformers or sentence-transformers
    CrossEncoder directory, a bert_jax export or run), with the activation and max_seq_length
    `CrossEncoder(path)` reads. Whether its head is a one-output classifier is
    `heads.cross_encoder`'s check.

    Raises:
      FileNotFoundError: no tokenizer beside the weights; ValueError: an unknown activation.
    """
    config, params, head, tokenizer = load(path)
    folder = as_path(pretrained.resolve(path))  # a finished run: its hf/
    # What CrossEncoder truncates to: the directory's own length, where it names one.
    max_seq_length = read_max_seq_length(folder) if folder.is_dir() else None
    activation = cross_encoder.read_activation(folder)
    return CrossEncoder(config, params, head, tokenizer, activation, max_seq_length)


# The compute dtypes of the commands' --dtype: float32 (exact to transformers) or bfloat16.
DTYPES = ("float32", "bfloat16")


def runtime(dtype: str | None = None) -> RuntimeConfig:
    """How a command computes: float32 (None too), or bfloat16 matmuls and activations with
    float32 weights, LayerNorm statistics, softmax, pooling and outputs (`RuntimeConfig`; the
    accuracy it costs: docs/inference.md). ValueError naming the dtypes for another; a warning
    where a CPU emulates bfloat16 (`RuntimeConfig.resolved`)."""
    if dtype not in (None, *DTYPES):
        raise ValueError(f"--dtype {dtype!r}: expected one of {DTYPES}")
    return RuntimeConfig(dtype=dtype or "float32").resolved(jax.default_backend())


def encoder(
    config: EncoderConfig, params, *, pooled: bool = False, dtype: str | None = None
) -> tuple[nn.Module, dict]:
    """The family's bare encoder (`Family.base_model`) and its parameters.

    Args:
      config: the checkpoint's config (any family).
      params: the encoder's parameters, or a head's (holding them at `Family.encoder_name`).
      pooled: build the encoder with its pooling layer (`add_pooling_layer`).
      dtype: the compute dtype (`runtime`; None: float32).
    """
    family = family_of(config)
    model = get_model_class(family.base_model)(config, runtime(dtype), add_pooling_layer=pooled)
    return model, params.get(family.encoder_name, params)


@functools.cache
def _pooler_weights(config: EncoderConfig) -> frozenset[str]:
    """The top-level parameter names the encoder's pooling layer adds (none: no pooler layer)."""
    cls = get_model_class(family_of(config).base_model)

    def names(pooled: bool) -> set[str]:
        init = cls(config, add_pooling_layer=pooled).init
        shapes = jax.eval_shape(init, jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))
        return set(shapes["params"])

    return frozenset(names(True) - names(False))


def check_pooler(config: EncoderConfig, encoder_params: dict) -> None:
    """Raises ValueError, naming the problem, unless the encoder has a pooler layer (learned
    weights over the first token) and `encoder_params` hold them."""
    family = family_of(config)
    weights = _pooler_weights(config)
    if not weights:
        raise ValueError(
            f"{config.display_name} has no pooler layer (no weights of one in "
            f"{family.base_model}), so pooling='pooler' has nothing to read; use pooling='cls' "
            "or 'mean'"
        )
    if not weights <= set(encoder_params):
        raise ValueError(
            f"this checkpoint has no pooler (no {sorted(weights)} weights in its "
            f"{family.base_model}); use pooling='cls' or 'mean'"
        )


def masked_lm_heads(config: EncoderConfig) -> list[str]:
    """The heads of `config`'s family that predict masked tokens (class attribute `masked_lm`)."""
    classes = family_of(config).model_classes
    return sorted(name for name, cls in classes.items() if getattr(cls, "masked_lm", False))


def masked_lm_model(
    config: EncoderConfig, head: str | None = None, dtype: str | None = None
) -> nn.Module:
    """The masked-LM module `head` of `config`'s family (None: its class of Role.MASKED_LM),
    computing in `dtype` (`runtime`); raises ValueError for a head that predicts no masked
    tokens."""
    family = family_of(config)
    head = head or family.head_for(MASKED_LM_ROLE)
    if head not in masked_lm_heads(config):
        raise ValueError(
            f"{head} has no masked-LM head; fill-mask needs one of {masked_lm_heads(config)}"
        )
    return family.model_classes[head](config, runtime(dtype))


def load_masked_lm(path: str):
    """(config, params, model class name, tokenizer) of a checkpoint with a masked-LM head, as
    it is stored (e.g. BertForPreTraining, BertForMaskedLM, ModernBertForMaskedLM).

    The head is the one the loader reports (config.json's `architectures`, the run's head); a
    checkpoint that names none (a config.json without `architectures`) and is not the bare
    encoder is read as its family's masked LM. No weights are invented for a head it lacks.

    Raises:
      ValueError: the checkpoint's head predicts no masked tokens (a sentence encoder, a
        classifier), naming `path`, its head and the heads that would do; for the discriminator
        of a replaced-token detection run (ELECTRA, DeBERTa-v3), its run's generator directory
        (`generator_of`), the masked LM that does.
    """
    try:
        config, params, head, tokenizer = load(path)
    except table.ConversionError:  # no head named, and weights beyond the bare encoder's
        config, params, head, tokenizer = load(path, MASKED_LM_ROLE)
    if head not in masked_lm_heads(config):
        heads = " or ".join(masked_lm_heads(config))
        detector = family_of(config).roles.get(Role.REPLACED_TOKEN_DETECTION)
        if detector is not None and detector.__name__ == head:
            generator = generator_of(path)
            way_out = (
                f"its run's generator is one: fill-mask --model {generator}"
                if generator
                else f"its run's generator is one, which a finished run exports to "
                f"<workdir>/{rtd.GENERATOR_DIR}/hf: pass that directory"
            )
            raise ValueError(
                f"{path} holds the discriminator of replaced-token detection ({head}), which "
                f"predicts no tokens: fill-mask needs a masked LM ({heads}), and {way_out}"
            )
        raise ValueError(
            f"{path} has no masked-LM head (it holds a {head}), so it cannot fill in [MASK]: "
            f"fill-mask needs a {heads} checkpoint"
        )
    return config, params, head, tokenizer


def generator_of(path: str) -> str | None:
    """The generator export (a masked LM) of the replaced-token detection run that `path` is
    (the run's directory) or lies in (its hf/ or export/): `<workdir>/generator/hf`, or None."""
    run = as_path(path)
    for candidate in (run / rtd.GENERATOR_DIR / "hf", run.parent / rtd.GENERATOR_DIR / "hf"):
        if (candidate / "config.json").exists():
            return str(candidate)
    return None


def token_type_inputs(model: nn.Module, token_type_ids) -> dict:
    """{"token_type_ids": ...} for a module that reads them; {} for one of a family without
    token types (its heads say `token_types = False`; its encoder's call takes no such input)."""
    reads = getattr(model, "token_types", None)
    if reads is None:
        reads = "token_type_ids" in inspect.signature(type(model).__call__).parameters
    return {"token_type_ids": token_type_ids} if reads else {}
