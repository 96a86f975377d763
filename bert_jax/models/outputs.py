"""What the encoders and task heads of every family return: pytrees with Hugging Face's field
names, so `out.logits`, `out.last_hidden_state` and `out.hidden_states` read as in transformers.

Dimensions: the letters of `bert_jax.models`' legend.
"""

from __future__ import annotations

import flax.struct
import jax

Array = jax.Array


@flax.struct.dataclass
class EncoderOutput:
    """last_hidden_state [B, L, E]; pooler_output [B, E] (or [B, S, E] packed) or None;
    hidden_states: L+1 arrays [B, L, E] (embeddings, then each layer) when asked for;
    attentions: one [B, H, L, L] float32 array per layer when asked for."""

    last_hidden_state: Array
    pooler_output: Array | None = None
    hidden_states: tuple[Array, ...] | None = None
    attentions: tuple[Array, ...] | None = None


@flax.struct.dataclass
class MaskedLMOutput:
    """logits [B, L, V], or [B, P, V] at `masked_positions`; float32."""

    logits: Array
    hidden_states: tuple[Array, ...] | None = None
    attentions: tuple[Array, ...] | None = None


@flax.struct.dataclass
class ClassifierOutput:
    """logits: [B, N] sequence classification (N = 1: regression), [B, 2] next-sentence,
    [B, C] multiple choice, [B, L, N] token classification; float32."""

    logits: Array
    hidden_states: tuple[Array, ...] | None = None
    attentions: tuple[Array, ...] | None = None


@flax.struct.dataclass
class QuestionAnsweringOutput:
    """start_logits, end_logits [B, L]; float32."""

    start_logits: Array
    end_logits: Array
    hidden_states: tuple[Array, ...] | None = None
    attentions: tuple[Array, ...] | None = None
