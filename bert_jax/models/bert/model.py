"""BERT in Flax linen: the encoder of google-research/bert and every Hugging Face task head.

Post-LayerNorm layers, exact (erf) GELU by default, absolute learned positions, a tanh pooler on
[CLS], and an MLM decoder tied to the word embeddings with its own bias. Submodule names mirror
Hugging Face's `BertModel` state dict (`encoder/layer_3/attention/self/query`), so conversion is a
rename and a transpose. Built from the shared blocks (`models.layers`), attention kernels
(`models.attention`), head call (`models.heads.Head`) and output records (`models.outputs`).

Dimension legend:
  B batch            L sequence length     E hidden size (hidden_size)
  H attention heads  D head size (E / H)   F intermediate size
  V vocabulary       P predictions per sequence (masked positions)
  S sequences packed in one row            C choices (multiple choice)   N labels

Logical axis names carried by the parameters (mapped to mesh axes by `bert_jax.parallel.sharding`):
  vocab, embed, heads, kv, mlp, layers (the stacked axis under `scan_layers`); None = replicated.
Activations use act_batch, act_len, act_embed, act_heads, act_mlp.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bert_jax.activations import ACTIVATIONS, REMAT_POLICIES, kept_input_only
from bert_jax.models.attention import AttentionMask, attend
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.heads import Head, tied_logits
from bert_jax.models.layers import (
    DenseWeights,
    Dropout,
    Embed,
    constrain,
    dense,
    encoder_inputs,
    gather_positions,
    layer_norm,
    zeros_init,
)
from bert_jax.models.outputs import (
    ClassifierOutput,
    EncoderOutput,
    MaskedLMOutput,
    QuestionAnsweringOutput,
)

Array = jax.Array

# The family's facts its registry row reads (`models.families.Family`): the heads' encoder
# submodule, where its layers sit in the encoder's tree and their names (one stacked `layer`
# under `scan_layers`), and the parameters a pretraining run may start specially.
ENCODER_NAME = "bert"
LAYERS_PATH = ("encoder",)
LAYER_NAME = "layer_{}"
SCANNED_LAYER = "layer"
STARTING_PATHS = {
    "mlm_bias": ("cls", "predictions", "bias"),
    "position_embeddings": (ENCODER_NAME, "embeddings", "position_embeddings", "embedding"),
}


def _layer_norm(cfg: BertConfig, rt: RuntimeConfig, name: str = "LayerNorm") -> nn.LayerNorm:
    """BERT's LayerNorm over E, with a bias, epsilon `layer_norm_eps`."""
    return layer_norm(rt, cfg.layer_norm_eps, name)


class BertEmbeddings(nn.Module):
    """Word + position + token-type embeddings, LayerNorm, dropout. Returns [B, L, E]."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, input_ids, token_type_ids, position_ids, *, deterministic: bool):
        cfg, rt = self.config, self.runtime

        def embed(num, axes, name, one_hot=False):
            return Embed(
                num,
                cfg.hidden_size,
                axes,
                cfg.initializer_range,
                rt.dtype,
                rt.param_dtype,
                one_hot,
                name=name,
            )

        x = embed(cfg.padded_vocab_size, ("vocab", "embed"), "word_embeddings")(input_ids)
        x += embed(
            cfg.max_position_embeddings, (None, "embed"), "position_embeddings", one_hot=True
        )(position_ids)
        x += embed(cfg.type_vocab_size, (None, "embed"), "token_type_embeddings", one_hot=True)(
            token_type_ids
        )
        x = _layer_norm(cfg, rt)(x)
        x = Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)
        return constrain(x, "act_batch", "act_len", "act_embed")


class BertSelfAttention(nn.Module):
    """Query/key/value projections and attention. Returns context [B, L, H, D] and probs or None.

    The kernel is the one `bert_jax.models.attention.attend` picks; asking for the probabilities
    (`output_attentions`) takes the xla path, which forms them.
    """

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, x, mask: AttentionMask, *, deterministic: bool, output_attentions: bool):
        cfg, rt = self.config, self.runtime
        heads = (cfg.num_attention_heads, cfg.head_dim)

        # The three projections run as one matmul [E] x [E, 3, H, D] (a third of the launches and
        # one wide GEMM); their weights stay separate parameters, named as in the checkpoints.
        weights = [
            DenseWeights(
                heads, ("embed",), ("heads", "kv"), cfg.initializer_range, rt.param_dtype, name=name
            )((cfg.hidden_size,))
            for name in ("query", "key", "value")
        ]
        kernel = jnp.stack([w.astype(rt.dtype) for w, _ in weights], axis=1)  # [E, 3, H, D]
        bias = jnp.stack([b.astype(rt.dtype) for _, b in weights], axis=0)  # [3, H, D]
        qkv = jax.lax.dot_general(x.astype(rt.dtype), kernel, (((2,), (0,)), ((), ()))) + bias
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, L, H, D] each
        q = constrain(q, "act_batch", "act_len", "act_heads", None)
        k = constrain(k, "act_batch", "act_len", "act_heads", None)
        v = constrain(v, "act_batch", "act_len", "act_heads", None)
        dropping = not deterministic and cfg.attention_probs_dropout_prob > 0.0
        rng = self.make_rng("dropout") if dropping else None
        return attend(
            q,
            k,
            v,
            mask,
            config=cfg,
            runtime=rt,
            dropout_rng=rng,
            output_attentions=output_attentions,
        )


class BertOutput(nn.Module):
    """Dense projection back to E, dropout, residual add, post-LayerNorm: LN(x + dropout(W h)).

    Serves as both `attention/output` (h is the per-head context [B, L, H, D]) and the layer's
    `output` (h is the intermediate activation [B, L, F]).
    """

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()
    from_heads: bool = False

    @nn.compact
    def __call__(self, h, residual, *, deterministic: bool):
        cfg, rt = self.config, self.runtime
        in_axes = ("heads", "kv") if self.from_heads else ("mlp",)
        out = dense(cfg, rt, cfg.hidden_size, in_axes, ("embed",), "dense")
        y = Dropout(cfg.hidden_dropout_prob)(out(h), deterministic=deterministic)
        return _layer_norm(cfg, rt)(y + residual)


class BertAttention(nn.Module):
    """Self-attention sub-layer (`attention/self` + `attention/output`): [B, L, E], probs."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, x, mask, *, deterministic: bool, output_attentions: bool):
        cfg, rt = self.config, self.runtime
        context, probs = BertSelfAttention(cfg, rt, name="self")(
            x, mask, deterministic=deterministic, output_attentions=output_attentions
        )
        out = BertOutput(cfg, rt, from_heads=True, name="output")(
            context, x, deterministic=deterministic
        )
        return out, probs


class BertIntermediate(nn.Module):
    """Feed-forward expansion with the configured activation: [B, L, E] -> [B, L, F]."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, x):
        cfg, rt = self.config, self.runtime
        h = dense(cfg, rt, cfg.intermediate_size, ("embed",), ("mlp",), "dense")(x)
        act = ACTIVATIONS[cfg.hidden_act]
        if rt.dtype != "float32":  # keep h alone for the backward pass (PyTorch's two [B, L, F])
            act = kept_input_only(act, scanned=rt.scan_layers)
        return constrain(act(h), "act_batch", "act_len", "act_mlp")


class BertLayer(nn.Module):
    """One post-LayerNorm transformer layer.

    The run mode lives in attributes rather than call arguments so that `nn.scan` and
    `nn.remat` see only arrays. `__call__(x [B, L, E], mask) -> (x', (x' or None, probs or None))`,
    the (carry, output) shape `nn.scan` wants.
    """

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()
    deterministic: bool = True
    output_hidden_states: bool = False
    output_attentions: bool = False

    @nn.compact
    def __call__(self, x, mask):
        cfg, rt, det = self.config, self.runtime, self.deterministic
        a, probs = BertAttention(cfg, rt, name="attention")(
            x, mask, deterministic=det, output_attentions=self.output_attentions
        )
        h = BertIntermediate(cfg, rt, name="intermediate")(a)
        y = BertOutput(cfg, rt, name="output")(h, a, deterministic=det)
        y = constrain(y, "act_batch", "act_len", "act_embed")
        return y, (y if self.output_hidden_states else None, probs)


class BertEncoder(nn.Module):
    """The layers: `layer_0 ... layer_{n-1}`, or one scanned `layer` with stacked weights."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(
        self,
        x,
        mask,
        *,
        deterministic: bool,
        output_hidden_states: bool,
        output_attentions: bool,
    ):
        cfg, rt = self.config, self.runtime
        layer_cls = BertLayer
        if rt.remat_policy != "none":
            layer_cls = nn.remat(
                BertLayer, policy=REMAT_POLICIES[rt.remat_policy], prevent_cse=not rt.scan_layers
            )
        kwargs = dict(
            deterministic=deterministic,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        if rt.scan_layers:
            scanned = nn.scan(
                layer_cls,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=nn.broadcast,
                length=cfg.num_hidden_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, (states, probs) = scanned(cfg, rt, name=SCANNED_LAYER, **kwargs)(x, mask)
            states = tuple(states) if output_hidden_states else None  # unstack [n, B, L, E]
            probs = tuple(probs) if output_attentions else None
        else:
            states, probs = [], []
            for i in range(cfg.num_hidden_layers):
                x, (s, p) = layer_cls(cfg, rt, name=LAYER_NAME.format(i), **kwargs)(x, mask)
                states.append(s)
                probs.append(p)
            states = tuple(states) if output_hidden_states else None
            probs = tuple(probs) if output_attentions else None
        return x, states, probs


class BertPooler(nn.Module):
    """tanh(W h_[CLS] + b): [B, L, E] -> [B, E]; with cls_positions [B, S] -> [B, S, E]."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, sequence_output, cls_positions=None):
        cfg, rt = self.config, self.runtime
        if cls_positions is None:
            first = sequence_output[:, 0]
        else:
            first = jnp.take_along_axis(sequence_output, cls_positions[..., None], axis=1)
        return jnp.tanh(dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense")(first))


class BertModel(nn.Module):
    """The BERT encoder: embeddings, layers and (optionally) the pooler.

    Call arguments:
      input_ids: [B, L] int token ids.
      token_type_ids: [B, L] int segment A/B ids; zeros when omitted.
      attention_mask: [B, L] 1 for real tokens, 0 for padding; ones when omitted.
      position_ids: [B, L] int positions; 0..L-1 when omitted (restart per packed sequence).
      segment_ids: [B, L] int ids of packed sequences (0 = padding); attention stays inside one.
      cls_positions: [B, S] int positions of each packed sequence's [CLS] for the pooler.
      deterministic: False turns dropout on (needs `rngs={"dropout": key}`).
      output_hidden_states / output_attentions: also return every layer's states / probabilities.
    """

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()
    add_pooling_layer: bool = True

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
        cfg, rt = self.config, self.runtime
        token_type_ids, attention_mask, position_ids = encoder_inputs(
            rt,
            input_ids,
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
        )
        seq_len = input_ids.shape[1]
        if seq_len > cfg.max_position_embeddings:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_position_embeddings="
                f"{cfg.max_position_embeddings}"
            )
        x = BertEmbeddings(cfg, rt, name="embeddings")(
            input_ids, token_type_ids, position_ids, deterministic=deterministic
        )
        mask = AttentionMask(attention_mask.astype(bool), segment_ids)
        y, states, probs = BertEncoder(cfg, rt, name="encoder")(
            x,
            mask,
            deterministic=deterministic,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        pooled = None
        if self.add_pooling_layer:
            pooled = BertPooler(cfg, rt, name="pooler")(y, cls_positions)
        return EncoderOutput(
            last_hidden_state=y,
            pooler_output=pooled,
            hidden_states=(x, *states) if output_hidden_states else None,
            attentions=probs,
        )


# --------------------------------------------------------------------------------------------
# Heads
# --------------------------------------------------------------------------------------------
@flax.struct.dataclass
class BertForPreTrainingOutput:
    """prediction_logits [B, L, V], or [B, P, V] at `masked_positions`;
    seq_relationship_logits [B, 2] (or [B, S, 2] packed). Logits are float32."""

    prediction_logits: Array
    seq_relationship_logits: Array
    hidden_states: tuple[Array, ...] | None = None
    attentions: tuple[Array, ...] | None = None


class TransformHead(nn.Module):
    """`cls/predictions/transform`: LayerNorm(act(W h + b)), [..., E] -> [..., E]."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h):
        cfg, rt = self.config, self.runtime
        h = dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense")(h)
        return _layer_norm(cfg, rt)(ACTIVATIONS[cfg.hidden_act](h))


class BertLMPredictionHead(nn.Module):
    """`cls/predictions`: dense + activation + LayerNorm, then logits against the tied word
    embeddings plus an own output bias. h [..., E], embedding [V', E] (V' = the padded vocabulary,
    `BertConfig.padded_vocab_size`) -> float32 logits [..., V]."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @nn.compact
    def __call__(self, h, embedding):
        cfg, rt = self.config, self.runtime
        t = TransformHead(cfg, rt, name="transform")(h)
        bias = self.param("bias", zeros_init(("vocab",)), (cfg.padded_vocab_size,), rt.param_dtype)
        logits = tied_logits(t, embedding, rt.dtype)  # float32 [..., V']
        # The padding rows of the table (`vocab_pad_multiple`) are no tokens: cut them off.
        return (logits + bias.astype(jnp.float32))[..., : cfg.vocab_size]


class BertPreTrainingHeads(nn.Module):
    """`cls`: the MLM head (`predictions`) and/or the NSP head (`seq_relationship`)."""

    config: BertConfig
    runtime: RuntimeConfig = RuntimeConfig()
    mlm: bool = True
    nsp: bool = True

    @nn.compact
    def __call__(self, sequence_output, pooled_output, embedding, masked_positions=None):
        cfg, rt = self.config, self.runtime
        mlm_logits = nsp_logits = None
        if self.mlm:
            h = sequence_output
            if masked_positions is not None:
                h = gather_positions(h, masked_positions)  # [B, P, E]
            mlm_logits = BertLMPredictionHead(cfg, rt, name="predictions")(h, embedding)
        if self.nsp:
            nsp = dense(cfg, rt, 2, ("embed",), (None,), "seq_relationship")
            nsp_logits = nsp(pooled_output).astype(jnp.float32)
        return mlm_logits, nsp_logits


def _word_embedding(module: nn.Module) -> Array:
    """The word-embedding table [V', E] (V' = `padded_vocab_size`) of the module's `bert` child,
    for the tied decoder."""
    table = module.variables["params"][ENCODER_NAME]["embeddings"]["word_embeddings"]["embedding"]
    return nn.meta.unbox(table)


class BertHead(Head):
    """A task head on top of `bert` (a BertModel), with every head's call (`models.heads.Head`):
    input_ids, token_type_ids, attention_mask, position_ids, segment_ids [B, L] ([B, C, L] for
    multiple choice), cls_positions [B, S] (pooled heads), masked_positions [B, P] (MLM heads)."""

    config: BertConfig

    def encode(self, input_ids, inputs, **kwargs) -> EncoderOutput:
        """The encoder's outputs (pooled when `pooled`): `bert`, a BertModel."""
        model = BertModel(
            self.config, self.runtime, add_pooling_layer=self.pooled, name=ENCODER_NAME
        )
        return model(input_ids, **inputs, **kwargs)

    def _dropout(self, x, deterministic):
        """BERT's classifier dropout: `classifier_dropout`, else `hidden_dropout_prob`."""
        cfg = self.config
        rate = cfg.hidden_dropout_prob if cfg.classifier_dropout is None else cfg.classifier_dropout
        return Dropout(rate)(x, deterministic=deterministic)

    def _linear(self, x, features: int, name: str):
        """A dense output layer `name`: [..., E] -> float32 [..., features]."""
        cfg, rt = self.config, self.runtime
        # Accumulated in float32: a bfloat16 result would round every logit (and a regression
        # output) to 8 bits of mantissa, and the predictions of a barely trained model to one value.
        return dense(cfg, rt, features, ("embed",), (None,), name, out_dtype=jnp.float32)(x)


class BertForPreTraining(BertHead):
    """Masked LM + next sentence prediction, as in the original pretraining.

    With `masked_positions` [B, P] the MLM logits are computed only there ([B, P, V]), which is
    what pretraining needs and costs P/L of the full head; equal to gathering the full [B, L, V]
    logits at those positions.
    """

    masked_lm = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        mlm, nsp = BertPreTrainingHeads(self.config, self.runtime, name="cls")(
            out.last_hidden_state, out.pooler_output, _word_embedding(self), masked_positions
        )
        return BertForPreTrainingOutput(mlm, nsp, out.hidden_states, out.attentions)


class BertForMaskedLM(BertHead):
    """Masked LM only (no pooler, as in Hugging Face). `masked_positions` as in pretraining."""

    pooled = False
    masked_lm = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        mlm, _ = BertPreTrainingHeads(self.config, self.runtime, nsp=False, name="cls")(
            out.last_hidden_state, None, _word_embedding(self), masked_positions
        )
        return MaskedLMOutput(mlm, out.hidden_states, out.attentions)


class BertForNextSentencePrediction(BertHead):
    """Next-sentence prediction only: logits [B, 2], 0 = B follows A, 1 = B is random."""

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        _, nsp = BertPreTrainingHeads(self.config, self.runtime, mlm=False, name="cls")(
            out.last_hidden_state, out.pooler_output, None
        )
        return ClassifierOutput(nsp, out.hidden_states, out.attentions)


class BertForSequenceClassification(BertHead):
    """Pooled [CLS] -> dropout -> `classifier`: logits [B, N]; N = 1 is regression.

    With packed rows (`segment_ids`, `cls_positions` [B, S]) the logits are [B, S, N].
    """

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        pooled = self._dropout(out.pooler_output, deterministic)
        logits = self._linear(pooled, self.config.num_labels, "classifier")
        return ClassifierOutput(logits, out.hidden_states, out.attentions)


class BertForMultipleChoice(BertHead):
    """Inputs [B, C, L]; each choice is encoded, pooled and scored: logits [B, C]."""

    choices = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        pooled = self._dropout(out.pooler_output, deterministic)
        logits = self._linear(pooled, 1, "classifier")  # [B*C, 1]
        return ClassifierOutput(logits.reshape(batch_shape[:2]), out.hidden_states, out.attentions)


class BertForTokenClassification(BertHead):
    """Per-token labels (NER): sequence output -> dropout -> `classifier`: logits [B, L, N]."""

    pooled = False

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        h = self._dropout(out.last_hidden_state, deterministic)
        logits = self._linear(h, self.config.num_labels, "classifier")
        return ClassifierOutput(logits, out.hidden_states, out.attentions)


class BertForQuestionAnswering(BertHead):
    """Extractive QA: `qa_outputs` maps each token to start/end logits, each [B, L]."""

    pooled = False

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        logits = self._linear(out.last_hidden_state, 2, "qa_outputs")
        return QuestionAnsweringOutput(
            logits[..., 0], logits[..., 1], out.hidden_states, out.attentions
        )


MODEL_CLASSES: dict[str, type[nn.Module]] = {
    cls.__name__: cls
    for cls in (
        BertModel,
        BertForPreTraining,
        BertForMaskedLM,
        BertForNextSentencePrediction,
        BertForSequenceClassification,
        BertForMultipleChoice,
        BertForTokenClassification,
        BertForQuestionAnswering,
    )
}
