"""The encoder with BERT's call, which the families of BERT's layers subclass (`EncoderModel`:
embeddings, a layer stack, a pooler), and their learned absolute embeddings (`LearnedEmbeddings`,
read at `padded_positions` where the table's first rows are the pad's);
the encoder without token types whose layers end in a final norm (`FinalNormEncoderModel`:
ModernBERT's, EuroBERT's).

A family's encoder states only what is its own: its embeddings (`embed`), a stack of its own
(`stack`; the shared post-LayerNorm `layers.PostLNEncoder` by default) and its pooler (`pool`;
the first token's state by default). Parameter names are the checkpoints'
(`embeddings/word_embeddings`, `encoder/layer_3/...`, `pooler/dense`).

Dimensions: the letters of `bert_jax.models`' legend.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.attention import AttentionMask
from bert_jax.models.config import EncoderConfig, RuntimeConfig
from bert_jax.models.layers import (
    LAYER_NAME,
    SCANNED_LAYER,
    Dropout,
    PostLNEncoder,
    constrain,
    embedding,
    encoder_inputs,
    first_tokens,
    layer_norm,
)
from bert_jax.models.outputs import EncoderOutput

# Where `EncoderModel`'s default stack (`stack`: `PostLNEncoder`, named "encoder") keeps its
# layers in the encoder's tree, and their names: a family row's `layers_path`, `layer_name` and
# `scanned_layer` (`encoder/layer_3`; one stacked `encoder/layer` under `scan_layers`).
POST_LN_LAYERS = (("encoder",), LAYER_NAME, SCANNED_LAYER)


def starting_paths(encoder_name: str, mlm_bias: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """A family row's `starting_paths` when its encoder (the heads' submodule `encoder_name`)
    has `LearnedEmbeddings`: its MLM head's bias at `mlm_bias` and the position table."""
    position_table = (encoder_name, "embeddings", "position_embeddings", "embedding")
    return {"mlm_bias": mlm_bias, "position_embeddings": position_table}


def padded_positions(input_ids: jax.Array, position_ids, padding_idx: int) -> jax.Array:
    """The position table's rows [B, L] int32 where a sequence's first position is row
    padding_idx + 1 (RoBERTa's and MPNet's tables).

    Args:
      input_ids: [B, L] token ids.
      position_ids: [B, L] positions counted from 0 in each sequence (the shared batches' packed
        rows restart them per sequence), or None.
      padding_idx: the pad id, whose row the table keeps for pad tokens.

    Returns:
      position_ids + padding_idx + 1; for None, transformers' `create_position_ids_from_input_ids`:
      padding_idx + the count of non-pad ids up to and including each token, padding_idx at pad
      ids (either side of a row, and holes).
    """
    if position_ids is not None:
        return position_ids.astype(jnp.int32) + padding_idx + 1
    real = (input_ids != padding_idx).astype(jnp.int32)
    return jnp.cumsum(real, axis=1) * real + padding_idx


class LearnedEmbeddings(nn.Module):
    """`embeddings` of learned absolute positions (BERT's, RoBERTa's, ELECTRA's, MPNet's): the
    sum of the `word_embeddings`, `token_type_embeddings` and `position_embeddings` tables, then
    LayerNorm (epsilon `layer_norm_eps`) and dropout (`hidden_dropout_prob`).

    Attributes:
      width: the tables' width (None: hidden_size; ELECTRA's `embedding_size`).
      positions_first: add the positions before the token types (BERT's order of the sum; the
        others add the token types first, as transformers does).
      token_types: whether there is a `token_type_embeddings` table (MPNet has none; its
        token_type_ids are then not read).
      position_table: whether there is a `position_embeddings` table (False: a family of
        rotary positions, Jina-v3's; positions are then not read and the length is not checked).

    Call: input_ids, token_type_ids, positions [B, L] int (positions: the table's rows) ->
    [B, L, width]; a row longer than the config's `max_sequence_length` raises, naming the
    table's size.
    """

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()
    width: int | None = None
    positions_first: bool = False
    token_types: bool = True
    position_table: bool = True

    @nn.compact
    def __call__(self, input_ids, token_type_ids, positions, *, deterministic: bool):
        cfg, rt = self.config, self.runtime
        if self.position_table and input_ids.shape[-1] > cfg.max_sequence_length:
            skipped = cfg.max_position_embeddings - cfg.max_sequence_length  # RoBERTa's offset
            unread = f", its rows 0..{skipped - 1} unused" if skipped else ""
            raise ValueError(
                f"sequence length {input_ids.shape[-1]} exceeds the {cfg.max_sequence_length} "
                f"positions of {cfg.display_name}'s table (max_position_embeddings="
                f"{cfg.max_position_embeddings}{unread})"
            )
        width = cfg.hidden_size if self.width is None else self.width
        tables = [("position_embeddings", cfg.max_position_embeddings, positions)]
        tables = tables if self.position_table else []
        if self.token_types:
            token_types = ("token_type_embeddings", cfg.type_vocab_size, token_type_ids)
            tables.insert(len(tables) if self.positions_first else 0, token_types)
        x = embedding(cfg, rt, cfg.padded_vocab_size, width, "word_embeddings", word=True)(
            input_ids
        )
        for name, rows, ids in tables:
            x += embedding(cfg, rt, rows, width, name)(ids)
        x = layer_norm(rt, cfg.layer_norm_eps, "LayerNorm")(x)
        x = Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
        return constrain(x, "act_batch", "act_len", "act_embed")


class EncoderModel(nn.Module):
    """An encoder with BERT's call: `embed` (the family's embeddings), `stack` (its layers: the
    shared post-LayerNorm stack `encoder` unless it has its own), and with `add_pooling_layer`
    `pool` (the first token's state unless it has a pooler layer). A family's encoder subclasses
    it and implements `embed`; its class docstring states what its call differs in.

    Call arguments and outputs: the encoders' call (`bert_jax.models`); token_type_ids,
    attention_mask and position_ids as the family's `embed` reads them.
    """

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()
    add_pooling_layer: bool = True
    mask_queries: ClassVar[bool] = False  # `AttentionMask.mask_queries`: padding rows masked too
    positions_from_ids: ClassVar[bool] = False  # omitted position_ids stay None (`embed` counts)
    # `stack` takes the positions [B, L] too (`positions=`): rotary layers (NomicBERT's).
    stack_reads_positions: ClassVar[bool] = False

    @nn.compact
    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        position_ids=None,
        segment_ids=None,
        cls_positions=None,
        *,
        deterministic: bool = True,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        rt = self.runtime
        token_type_ids, attention_mask = encoder_inputs(
            rt, input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        )
        if position_ids is not None or not self.positions_from_ids:
            (position_ids,) = encoder_inputs(rt, input_ids, position_ids=position_ids)
        x = self.embed(
            input_ids, token_type_ids, attention_mask, position_ids, deterministic=deterministic
        )
        mask = AttentionMask(
            attention_mask.astype(bool), segment_ids, mask_queries=self.mask_queries
        )
        y, states, probs = self.stack(
            x,
            mask,
            **({"positions": position_ids} if self.stack_reads_positions else {}),
            deterministic=deterministic,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        return EncoderOutput(
            last_hidden_state=y,
            pooler_output=self.pool(y, cls_positions) if self.add_pooling_layer else None,
            hidden_states=(x, *states) if output_hidden_states else None,
            attentions=probs,
        )

    def embed(self, input_ids, token_type_ids, attention_mask, position_ids, *, deterministic):
        """The layers' input [B, L, E] from the call's [B, L] inputs, checked and with their
        defaults (`layers.encoder_inputs`; position_ids None where `positions_from_ids`)."""
        raise NotImplementedError(f"{type(self).__name__} has no embeddings")

    def stack(self, x, mask: AttentionMask, **kwargs):
        """The layers, `encoder` (`PostLNEncoder`): (y [B, L, E], states, probs)."""
        return PostLNEncoder(self.config, self.runtime, name="encoder")(x, mask, **kwargs)

    def pool(self, y, cls_positions):
        """The pooled state [B, E] ([B, S, E]): the first tokens' (`first_tokens`)."""
        return first_tokens(y, cls_positions)


class FinalNormEncoderModel(nn.Module):
    """An encoder without token types whose layers end in a final norm (ModernBERT's,
    EuroBERT's): `embed`, `stack`, `final_norm` and `pool`, each the family's. A family's encoder
    subclasses it; its class docstring states what its call differs in.

    Call arguments and outputs: the encoders' call (`bert_jax.models`), but:
      token_type_ids: none; position_ids: the rotary angles' (`layers.encoder_inputs` fills them).
      last_hidden_state and the last of hidden_states (returned): after the final norm, as
        transformers returns them; the first of hidden_states the embeddings.
      pooler_output (returned, with `add_pooling_layer`): `pool`'s (no parameters).
    """

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()
    add_pooling_layer: bool = False
    token_types: ClassVar[bool] = False  # no token_type_ids (`objective.apply_model`)
    takes_token_type_ids: ClassVar[bool] = False  # its call has no such argument (`Head.encode`)

    @nn.compact
    def __call__(
        self,
        input_ids,
        attention_mask=None,
        position_ids=None,
        segment_ids=None,
        cls_positions=None,
        *,
        deterministic: bool = True,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        attention_mask, position_ids = encoder_inputs(
            self.runtime, input_ids, attention_mask=attention_mask, position_ids=position_ids
        )
        x = self.embed(input_ids, deterministic=deterministic)
        mask = AttentionMask(attention_mask.astype(bool), segment_ids)
        modes = dict(output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        y, states, probs = self.stack(x, mask, position_ids, deterministic=deterministic, **modes)
        y = self.final_norm(y)
        return EncoderOutput(
            last_hidden_state=y,
            pooler_output=self.pool(y, mask, cls_positions) if self.add_pooling_layer else None,
            hidden_states=(x, *states[:-1], y) if output_hidden_states else None,
            attentions=probs,
        )

    def embed(self, input_ids, *, deterministic):
        """The layers' input [B, L, E] from input_ids [B, L]."""
        raise NotImplementedError(f"{type(self).__name__} has no embeddings")

    def stack(self, x, mask: AttentionMask, positions, **modes):
        """The layers (`modes`: deterministic, output_hidden_states, output_attentions):
        (y [B, L, E] before the final norm, the n layers' outputs or None, their attention
        probabilities [B, H, L, L] or None)."""
        raise NotImplementedError(f"{type(self).__name__} has no layers")

    def final_norm(self, y):
        """The final norm of the last layer's output y [B, L, E]."""
        raise NotImplementedError(f"{type(self).__name__} has no final norm")

    def pool(self, y, mask: AttentionMask, cls_positions):
        """The pooled state [B, E] ([B, S, E]): the first tokens' (`first_tokens`)."""
        return first_tokens(y, cls_positions)
