"""The call every family's task heads share, and the tied MLM decoder's logits.

A family's heads subclass `Head` once (its head base, which sets `encode`: the family's encoder
under its name in the parameter tree, `Family.encoder_name`), then once per task (`head`: the
task's layers on the encoder's outputs). Batches, objectives and steps call every head alike.

Dimension legend:
  B batch            L sequence length     E hidden size
  V vocabulary (V' the table's rows, padded: `padded_vocab_size`)
  P predictions per sequence (masked positions)
  S sequences packed in one row            C choices (multiple choice)
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.config import EncoderConfig, RuntimeConfig
from bert_jax.models.outputs import EncoderOutput

Array = jax.Array


class Head(nn.Module):
    """A task head on top of a family's encoder. Every head takes the same inputs:

      input_ids, token_type_ids, attention_mask, position_ids, segment_ids: [B, L]
        ([B, C, L] for multiple choice), as the family's encoder takes them;
      cls_positions: [B, S] the first token of each packed sequence (pooled heads);
      masked_positions: [B, P] positions to compute MLM logits at (MLM heads only);
      deterministic, output_hidden_states, output_attentions: as the encoder's.

    Subclasses set the class flags and implement `encode` (a family's head base) and `head`
    (each task), which returns the head's output record (`models.outputs`).
    """

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()
    pooled: ClassVar[bool] = True  # the head reads the encoder's pooled state
    choices: ClassVar[bool] = False  # inputs are [B, C, L]: encode every choice
    masked_lm: ClassVar[bool] = False  # accepts masked_positions
    token_types: ClassVar[bool] = True  # reads token_type_ids (a family without them: False)

    @nn.compact
    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        position_ids=None,
        segment_ids=None,
        cls_positions=None,
        masked_positions=None,
        *,
        deterministic: bool = True,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ):
        if masked_positions is not None and not self.masked_lm:
            raise ValueError(f"{type(self).__name__} has no MLM head; masked_positions is for one")
        inputs = dict(
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            segment_ids=segment_ids,
        )
        batch_shape = input_ids.shape
        if self.choices:
            if input_ids.ndim != 3:
                raise ValueError(
                    f"{type(self).__name__} takes input_ids [batch, choices, length]; "
                    f"got {input_ids.shape}"
                )
            flat = lambda a: None if a is None else a.reshape(-1, a.shape[-1])  # noqa: E731
            input_ids, inputs = flat(input_ids), {k: flat(v) for k, v in inputs.items()}
        out = self.encode(
            input_ids,
            inputs,
            cls_positions=cls_positions if self.pooled else None,
            deterministic=deterministic,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        return self.head(
            out,
            deterministic=deterministic,
            masked_positions=masked_positions,
            batch_shape=batch_shape,
        )

    def encode(self, input_ids: Array, inputs: dict, **kwargs) -> EncoderOutput:
        """The encoder's outputs (pooled when `pooled`) for input_ids [B', L] (B' = B * C with
        choices) and the other [B', L] `inputs` by name; `kwargs` as the encoder's call."""
        raise NotImplementedError(f"{type(self).__name__} sets no encoder")

    def head(self, out: EncoderOutput, *, deterministic, masked_positions, batch_shape):
        """The task's output record from the encoder's `out`; `batch_shape` is input_ids'."""
        raise NotImplementedError(f"{type(self).__name__} has no head")


def tied_logits(h: Array, table: Array, dtype) -> Array:
    """The tied decoder's logits: h [..., E] against the word-embedding table [V', E], computed
    in `dtype` and accumulated and returned in float32 [..., V'] (a bfloat16 result would round
    every logit to 8 bits of mantissa before the loss sees it)."""
    return jnp.einsum(
        "...e,ve->...v",
        h.astype(dtype),
        nn.meta.unbox(table).astype(dtype),
        preferred_element_type=jnp.float32,
    )
