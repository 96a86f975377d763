"""A model family built only from the shared blocks of `bert_jax.models`, for the tests: a
pre-norm encoder with RMSNorm, SwiGLU, grouped-query attention and rotary positions (EuroBERT's
and Llama's recipe), a masked-LM head tied to its embeddings and a sequence classifier.

What it states is its own: its config (fields, config.json's `rope_parameters`), which blocks it
wires and their names, its heads, its registry facts and FLOPs. Everything else is shared code,
so a test that registers its row (`ROW`, `families.registered`) shows that a family on the
blocks needs nothing outside its folder.

Dimension legend: B batch, L length, E hidden, H heads, K key/value heads, D head size,
F intermediate, V vocabulary, P masked positions, S packed sequences, N labels.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from bert_jax.models.config import EncoderConfig
from bert_jax.models.conversion import LAYER_INDEX_RE, FamilyConversion, sized_by_config
from bert_jax.models.encoder import FinalNormEncoderModel
from bert_jax.models.family import Family, Role
from bert_jax.models.heads import Head, masked_states
from bert_jax.models.layers import Embed, dense
from bert_jax.models.norms import RMSNorm
from bert_jax.models.outputs import ClassifierOutput
from bert_jax.models.prenorm import PreNormEncoder, check_heads
from bert_jax.models.rotary import RopeParameters


@dataclasses.dataclass(frozen=True)
class ToyConfig(EncoderConfig):
    """The toy architecture: odd sizes, 4 query heads sharing 2 key/value heads."""

    model_type: ClassVar[str] = "toy-prenorm"
    display_name: ClassVar[str] = "Toy pre-norm"
    hf_derived: ClassVar[tuple[str, ...]] = ("rope_parameters",)
    vocab_size: int = 99
    hidden_size: int = 32
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 37
    hidden_act: str = "silu"
    max_position_embeddings: int = 64
    initializer_range: float = 0.2
    rms_norm_eps: float = 1e-6
    hidden_dropout_prob: float = 0.0
    attention_dropout: float = 0.0
    attention_bias: bool = False
    mlp_bias: bool = False
    rope_theta: float = 500.0
    pad_token_id: int = 0
    num_labels: int = 2
    label_names: tuple[str, ...] | None = None

    def __post_init__(self):
        self._check_fields(
            sizes=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "intermediate_size", "max_position_embeddings",
                   "num_labels"),
            probabilities=("hidden_dropout_prob", "attention_dropout"),
            positive=("initializer_range", "rms_norm_eps", "rope_theta"),
            bools=("attention_bias", "mlp_bias"),
            activations=("hidden_act",),
        )  # fmt: skip
        check_heads(self)
        self._check_ids_and_labels()

    # The names the shared blocks read (`models.prenorm`).
    norm_eps = property(lambda self: self.rms_norm_eps)
    attention_probs_dropout_prob = property(lambda self: self.attention_dropout)
    padded_vocab_size = property(lambda self: self.vocab_size)

    @property
    def rope(self) -> RopeParameters:
        return RopeParameters(rope_theta=self.rope_theta)

    @classmethod
    def _from_hf_fields(cls, d: Mapping[str, Any], kwargs: dict[str, Any]) -> ToyConfig:
        rope = RopeParameters.from_hf(d.get("rope_parameters"), kwargs.get("rope_theta"))
        return cls(**{**kwargs, "rope_theta": rope.rope_theta})

    def _hf_derived(self) -> dict[str, Any]:
        return {"rope_parameters": self.rope.to_hf()}


# ---- The registry row's facts ----
ENCODER_NAME = "model"
LAYERS_PATH = ("layers",)
LAYER_NAME = "layer_{}"
SCANNED_LAYER = "layer"
STARTING_PATHS: dict[str, tuple[str, ...]] = {}


class ToyModel(FinalNormEncoderModel):
    """embed_tokens -> the pre-norm stack (`layers`) -> RMSNorm `norm`: the shared encoder
    without token types (`FinalNormEncoderModel`); positions feed rotary angles only."""

    config: ToyConfig

    def embed(self, input_ids, *, deterministic):
        cfg, rt = self.config, self.runtime
        return Embed(
            cfg.padded_vocab_size, cfg.hidden_size, ("vocab", "embed"), cfg.initializer_range,
            rt.dtype, rt.param_dtype, name="embed_tokens",
        )(input_ids)  # fmt: skip

    def stack(self, x, mask, positions, **modes):
        layers = PreNormEncoder(self.config, self.runtime, "rms_norm", "gated", name="layers")
        return layers(x, mask, positions, **modes)

    def final_norm(self, y):
        cfg, rt = self.config, self.runtime
        return RMSNorm(cfg.rms_norm_eps, rt.dtype, rt.param_dtype, name="norm")(y)


class ToyHead(Head):
    """A head on `model` (a ToyModel); no token types."""

    config: ToyConfig
    token_types: ClassVar[bool] = False
    encoder = ToyModel
    encoder_name = ENCODER_NAME


class ToyForMaskedLM(ToyHead):
    """Logits against the tied embeddings: [B, L, V] float32, or [B, P, V] at masked_positions."""

    pooled = False
    masked_lm = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        table = self.variables["params"][ENCODER_NAME]["embed_tokens"]["embedding"]
        return self.tied_mlm(out, masked_states(out, masked_positions), table, None)


class ToyForSequenceClassification(ToyHead):
    """The first token's state -> `classifier`: logits [B, N] ([B, S, N] packed)."""

    pooled = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        cfg, rt = self.config, self.runtime
        classifier = dense(
            cfg, rt, cfg.num_labels, ("embed",), (None,), "classifier", out_dtype=jnp.float32
        )
        return ClassifierOutput(classifier(out.pooler_output), out.hidden_states, out.attentions)


ROLES: dict[Role, type[nn.Module]] = {
    Role.ENCODER: ToyModel,
    Role.MASKED_LM: ToyForMaskedLM,
    Role.SEQUENCE_CLASSIFICATION: ToyForSequenceClassification,
}


def encoder_forward_flops(cfg: ToyConfig, seq_lengths: np.ndarray) -> float:
    """Per real token and layer: q and o 2 * 2E^2, k and v 2 * 2E(KD), SwiGLU 3 * 2EF; scores
    and context 2 * 2E per (query, key) pair of a sequence."""
    n = np.asarray(seq_lengths, np.float64)
    e, f = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * cfg.head_dim
    per_token = 2.0 * (2 * e * e + 2 * e * kv + 3 * e * f)
    return cfg.num_hidden_layers * (per_token * n.sum() + 4.0 * e * (n**2).sum())


CONVERSION = FamilyConversion(
    hf_prefix="model.",
    hf_roots=("embed_tokens.", "layers.", "norm."),
    structural=r"^(model/)?(embed_tokens|layers|norm)/",
    tied_decoder="lm_head.weight",
    word_embeddings="embed_tokens/embedding",
    two_input_kernels=("self_attn/o_proj/kernel",),
    vocab_keys=re.compile(r"(^|/)embed_tokens/embedding$"),
    layer_index=LAYER_INDEX_RE,
    sized_by_config=sized_by_config("embed_tokens"),
)
_THIS = sys.modules[__name__]
ROW = Family.of(ToyConfig, model=_THIS, flops=_THIS, conversion=CONVERSION)
