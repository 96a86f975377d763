"""The task heads every family shares, parametrized by names: the call, the tasks, the MLM head.

A family's heads subclass `Head` once (its head base, which names its encoder: `encoder`, the
class, and `encoder_name`, its submodule in the parameter tree, `Family.encoder_name`), then once
per task: one of the task classes here (`SequenceClassification`, `MultipleChoice`,
`TokenClassification`, `QuestionAnswering`) before the family's base, or a `head` of its own (the
task's layers on the encoder's outputs). A task class calls the base's hooks (`classify`,
`score_choices`, `classify_tokens`, `span_logits`), whose defaults are BERT's layers (dropout,
then a dense output layer named `classifier` or `qa_outputs`); a family overrides the hooks where
its layers differ. Batches, objectives and steps call every head alike.

The MLM head (`MaskedLMHead`: a transform, then the decoder tied to the word embeddings with its
own `bias`), the classification head on the first token (`ClassificationHead`: dense, activation,
`out_proj`) and their parts take their submodule names as arguments, so each family's tree keeps
its checkpoints' names.

Dimensions: the letters of `bert_jax.models`' legend.
"""

from __future__ import annotations

import sys
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.activations import ACTIVATIONS
from bert_jax.models.config import EncoderConfig, RuntimeConfig
from bert_jax.models.family import Role
from bert_jax.models.layers import (
    Dropout,
    dense,
    first_tokens,
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
# The heads' activations by name: the layers' (`hidden_act`) and tanh (transformers'
# `get_activation` names, as RoBERTa's classifier and ELECTRA's sequence summary use them).
HEAD_ACTIVATIONS = {**ACTIVATIONS, "tanh": jnp.tanh}


class Head(nn.Module):
    """A task head on top of a family's encoder. Every head takes the same inputs:

      input_ids, token_type_ids, attention_mask, position_ids, segment_ids: [B, L]
        ([B, C, L] for multiple choice), as the family's encoder takes them;
      cls_positions: [B, S] the first token of each packed sequence (pooled heads);
      masked_positions: [B, P] positions to compute MLM logits at (MLM heads only);
      deterministic, output_hidden_states, output_attentions: as the encoder's.

    Subclasses set the class flags and the encoder (a family's head base: `encoder`,
    `encoder_name`, or an `encode` of their own) and implement `head` (each task, or a task class
    of this module), which returns the head's output record (`models.outputs`).
    """

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()
    pooled: ClassVar[bool] = True  # the head reads the encoder's pooled state
    choices: ClassVar[bool] = False  # inputs are [B, C, L]: encode every choice
    masked_lm: ClassVar[bool] = False  # accepts masked_positions
    token_types: ClassVar[bool] = True  # reads token_type_ids (a family without them: False)
    # The encoder's pooling layer: None builds it where the head is `pooled`, else as set.
    pooler: ClassVar[bool | None] = None
    encoder: ClassVar[type[nn.Module] | None] = None  # the family's encoder class
    encoder_name: ClassVar[str] = ""  # its submodule's name (`Family.encoder_name`)

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
        choices) and the other [B', L] `inputs` by name; `kwargs` as the encoder's call: the
        family's `encoder` under `encoder_name`, its pooling layer by `pooler`. An encoder whose
        call has no token_type_ids (`takes_token_type_ids` False) gets none, and a head given
        some refuses them."""
        if self.encoder is None:
            raise NotImplementedError(f"{type(self).__name__} sets no encoder")
        if not getattr(self.encoder, "takes_token_type_ids", True):
            inputs = dict(inputs)
            if inputs.pop("token_type_ids") is not None:
                raise ValueError(
                    f"{type(self).__name__} takes no token_type_ids "
                    f"({self.config.display_name} has none)"
                )
        pooler = self.pooled if self.pooler is None else self.pooler
        model = self.encoder(
            self.config, self.runtime, add_pooling_layer=pooler, name=self.encoder_name
        )
        return model(input_ids, **inputs, **kwargs)

    def head(self, out: EncoderOutput, *, deterministic, masked_positions, batch_shape):
        """The task's output record from the encoder's `out`; `batch_shape` is input_ids'."""
        raise NotImplementedError(f"{type(self).__name__} has no head")

    # ---- What the heads read, and the hooks of the task classes (BERT's layers by default) ----
    def word_embeddings(self, table: str = "word_embeddings") -> Array:
        """The encoder's word-embedding table [V', E] (`embeddings/<table>`), for a tied decoder."""
        tables = self.variables["params"][self.encoder_name]["embeddings"]
        return nn.meta.unbox(tables[table]["embedding"])

    def tied_mlm(self, out: EncoderOutput, h: Array, table: Array, bias: str | None):
        """The masked LM's `MaskedLMOutput`: h [B, L|P, E] against the tied word table [V, E]
        (`tied_logits`, float32), plus a `TiedBias` named `bias` (None: no bias)."""
        cfg, rt = self.config, self.runtime
        logits = tied_logits(h, table, rt.dtype)
        if bias is not None:
            logits += TiedBias(cfg.vocab_size, rt.param_dtype, name=bias)()
        return MaskedLMOutput(logits, out.hidden_states, out.attentions)

    def linear(self, x: Array, features: int, name: str, **kwargs) -> Array:
        """A dense output layer `name`: [..., E] -> float32 [..., features]; `kwargs` as
        `layers.dense`'s (`stddev`)."""
        cfg, rt = self.config, self.runtime
        # Accumulated in float32: a bfloat16 result would round every logit (and a regression
        # output) to 8 bits of mantissa, and the predictions of a barely trained model to one value.
        layer = dense(cfg, rt, features, ("embed",), (None,), name, out_dtype=jnp.float32, **kwargs)
        return layer(x)

    def dropout_rate(self) -> float:
        """The classifiers' dropout: `classifier_dropout`, else `hidden_dropout_prob`."""
        return classifier_dropout(self.config)

    def classify(self, pooled: Array, features: int, deterministic: bool) -> Array:
        """The pooled states [..., E] -> float32 logits [..., features] (sequence classification,
        and multiple choice's score): dropout, then `classifier`."""
        pooled = Dropout(self.dropout_rate())(pooled, deterministic=deterministic)
        return self.linear(pooled, features, "classifier")

    def score_choices(self, pooled: Array, deterministic: bool) -> Array:
        """Each choice's pooled states [B*C, E] -> float32 scores [B*C, 1]: `classify`'s."""
        return self.classify(pooled, 1, deterministic)

    def classify_tokens(self, h: Array, features: int, deterministic: bool) -> Array:
        """Every token's states [B, L, E] -> float32 logits [B, L, features]: dropout, then
        `classifier`."""
        h = Dropout(self.dropout_rate())(h, deterministic=deterministic)
        return self.linear(h, features, "classifier")

    def span_logits(self, h: Array, deterministic: bool) -> Array:
        """Every token's states [B, L, E] -> float32 [B, L, 2] start and end logits:
        `qa_outputs`."""
        return self.linear(h, 2, "qa_outputs")


def classifier_dropout(config: EncoderConfig) -> float:
    """A config's classifier dropout: `classifier_dropout`, else `hidden_dropout_prob`."""
    rate = config.classifier_dropout
    return config.hidden_dropout_prob if rate is None else rate


def masked_states(out: EncoderOutput, masked_positions: Array | None) -> Array:
    """The states an MLM head reads: [B, L, E], or [B, P, E] at `masked_positions` (P/L of the
    head's cost; equal to gathering its full logits there)."""
    h = out.last_hidden_state
    return h if masked_positions is None else gather_positions(h, masked_positions)


# ---- The task classes: each a task's `head` on the family's hooks ----
# Plain mixins, listed before the family's head base (`class BertForQuestionAnswering(
# QuestionAnswering, BertHead)`), so that their `head` and flags come first; `head` runs inside
# `Head.__call__`, whose compact scope holds the submodules it makes.
class SequenceClassification:
    """The pooled states -> `classify`: logits [B, N] (N = 1: regression); [B, S, N] with packed
    rows (`segment_ids`, `cls_positions` [B, S])."""

    pooled: ClassVar[bool] = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        logits = self.classify(out.pooler_output, self.config.num_labels, deterministic)
        return ClassifierOutput(logits, out.hidden_states, out.attentions)


class MultipleChoice:
    """Inputs [B, C, L]; each choice is encoded, pooled and scored (`score_choices`): logits
    [B, C]."""

    pooled: ClassVar[bool] = True
    choices: ClassVar[bool] = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        logits = self.score_choices(out.pooler_output, deterministic)  # [B*C, 1]
        return ClassifierOutput(logits.reshape(batch_shape[:2]), out.hidden_states, out.attentions)


class TokenClassification:
    """Per-token labels (NER): the sequence output -> `classify_tokens`: logits [B, L, N]."""

    pooled: ClassVar[bool] = False

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        logits = self.classify_tokens(out.last_hidden_state, self.config.num_labels, deterministic)
        return ClassifierOutput(logits, out.hidden_states, out.attentions)


class QuestionAnswering:
    """Extractive QA: `span_logits` on every token: start_logits, end_logits [B, L]."""

    pooled: ClassVar[bool] = False

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        logits = self.span_logits(out.last_hidden_state, deterministic)
        return QuestionAnsweringOutput(
            logits[..., 0], logits[..., 1], out.hidden_states, out.attentions
        )


# ---- RoBERTa's head layout, which MPNet took: mixins of a family's head base and heads ----
class FirstTokenHooks:
    """Hooks of a head base whose classifier reads <s> with no pooler layer (listed before
    `Head`): `classify` is `classifier` (`ClassificationHead`: dense, tanh, `out_proj`) on the
    <s> states; the multiple-choice score the encoder's pooler, dropout (`hidden_dropout_prob`)
    and `classifier`."""

    pooled: ClassVar[bool] = False  # reads <s>'s state (and takes cls_positions)
    pooler: ClassVar[bool] = False  # its encoder has the pooler layer

    def classify(self, pooled, features, deterministic):
        """`classifier` (`ClassificationHead`, tanh) on the <s> states."""
        classify = ClassificationHead(self.config, self.runtime, "tanh", name="classifier")
        return classify(pooled, deterministic=deterministic)

    def score_choices(self, pooled, deterministic):
        """The pooler's output, dropout (`hidden_dropout_prob`), `classifier`: [B*C, 1]."""
        pooled = Dropout(self.config.hidden_dropout_prob)(pooled, deterministic=deterministic)
        return self.linear(pooled, 1, "classifier")


class FirstTokenSequenceClassification(SequenceClassification):
    """`SequenceClassification` of the <s> states [B, E] ([B, S, E] packed): the head's input in
    place of a pooler layer's output."""

    def encode(self, input_ids, inputs, *, cls_positions=None, **kwargs) -> EncoderOutput:
        out = super().encode(input_ids, inputs, **kwargs)
        return out.replace(pooler_output=first_tokens(out.last_hidden_state, cls_positions))


class LayerNormMaskedLM:
    """The masked LM: `lm_head` = LayerNorm(GELU(dense(h))) (the exact GELU whatever
    `hidden_act`, as in transformers; `layer_norm`), then the decoder tied to the word embeddings
    plus `bias`, on every token: logits [B, L, V] float32, or [B, P, V] at `masked_positions`
    (P/L of the cost; equal to gathering the full logits)."""

    masked_lm: ClassVar[bool] = True

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        cfg = self.config
        lm_head = MaskedLMHead(
            cfg, self.runtime, cfg.hidden_size, "gelu", "layer_norm", name="lm_head"
        )
        logits = lm_head(masked_states(out, masked_positions), self.word_embeddings())
        return MaskedLMOutput(logits, out.hidden_states, out.attentions)


class OwnMaskedLM:
    """The masked LM of the family's own head module `lm_head_cls` (its config and runtime;
    called on h [B, L|P, E] and the word embeddings [V', E], it returns float32 logits), named
    `lm_head_name`, on the unpooled states: logits [B, L, V], or [B, P, V] at
    `masked_positions` (P/L of the cost; equal to gathering the full logits)."""

    pooled: ClassVar[bool] = False
    masked_lm: ClassVar[bool] = True
    lm_head_cls: ClassVar[type[nn.Module]]
    lm_head_name: ClassVar[str] = "lm_head"

    def head(self, out, *, deterministic, masked_positions, batch_shape):
        lm_head = self.lm_head_cls(self.config, self.runtime, name=self.lm_head_name)
        logits = lm_head(masked_states(out, masked_positions), self.word_embeddings())
        return MaskedLMOutput(logits, out.hidden_states, out.attentions)


class PoolerMultipleChoice(MultipleChoice):
    """`MultipleChoice` over `FirstTokenHooks`: the encoder's pooler layer (built for this head
    alone) pools each choice, then dropout (`hidden_dropout_prob`) and `classifier`: logits
    [B, C]."""

    pooler: ClassVar[bool] = True


# ---- A family's task classes: the shared tasks over its head base, named as transformers does ----
SUFFIXES = {
    Role.MASKED_LM: "ForMaskedLM",
    Role.SEQUENCE_CLASSIFICATION: "ForSequenceClassification",
    Role.MULTIPLE_CHOICE: "ForMultipleChoice",
    Role.TOKEN_CLASSIFICATION: "ForTokenClassification",
    Role.QUESTION_ANSWERING: "ForQuestionAnswering",
}
# The tasks on the pooled state (BERT's pooler layer, or the family's `pool`) and on every token.
POOLED_TASKS = {
    Role.SEQUENCE_CLASSIFICATION: SequenceClassification,
    Role.MULTIPLE_CHOICE: MultipleChoice,
    Role.TOKEN_CLASSIFICATION: TokenClassification,
    Role.QUESTION_ANSWERING: QuestionAnswering,
}
# RoBERTa's layout over `FirstTokenHooks` (MPNet's and Jina-v3's too): its masked LM as well.
FIRST_TOKEN_TASKS = {
    Role.MASKED_LM: LayerNormMaskedLM,
    Role.SEQUENCE_CLASSIFICATION: FirstTokenSequenceClassification,
    Role.MULTIPLE_CHOICE: PoolerMultipleChoice,
    Role.TOKEN_CLASSIFICATION: TokenClassification,
    Role.QUESTION_ANSWERING: QuestionAnswering,
}


def task_classes(
    base: type[Head], tasks: dict, *, own: dict | None = None, without: tuple[Role, ...] = ()
) -> dict[Role, type[nn.Module]]:
    """{role: class} in `tasks`' order: each task of `tasks` ({role: task class}) over the
    family's head `base`, named as transformers names it ("RobertaHead" -> "RobertaForMaskedLM")
    and documented by its task class; `own`'s class ({role: class}) in place of the shared one
    for its roles; none for the roles `without` (transformers has no such class)."""
    prefix, own = base.__name__.removesuffix("Head"), own or {}
    return {
        role: own.get(role) or declared(prefix + SUFFIXES[role], (task, base), task.__doc__)
        for role, task in tasks.items()
        if role not in without
    }


def renamed(roles: dict[Role, type[nn.Module]], old: str, new: str) -> dict[Role, type[nn.Module]]:
    """{role: subclass}: `roles`' classes under another family's names (`old` prefix -> `new`:
    XLM-RoBERTa's of RoBERTa's), each the same module."""
    return {
        role: declared(cls.__name__.replace(old, new, 1), (cls,), f"{cls.__name__} named {new}'s.")
        for role, cls in roles.items()
    }


def declared(name: str, bases: tuple[type, ...], doc: str | None) -> type[nn.Module]:
    """The class `name` of `bases`, declared in the last base's module: an attribute there, as
    a class written in it is (imports and pickle find it by its module and name). A name the
    module already has is refused: the class would replace what it names."""
    module = bases[-1].__module__
    if hasattr(sys.modules[module], name):
        raise ValueError(f"{module} has {name} already: a task class would replace it")
    cls = type(name, bases, {"__module__": module, "__qualname__": name, "__doc__": doc})
    setattr(sys.modules[module], name, cls)
    return cls


# ---- Layers of the heads, named by their arguments ----
def transform(cfg: EncoderConfig, rt: RuntimeConfig, h: Array, width: int, activation: str,
              norm_name: str = "LayerNorm") -> Array:  # fmt: skip
    """LayerNorm(activation(dense(h))), [..., E] -> [..., width]: submodules `dense` and
    `norm_name` of the module calling it (epsilon `layer_norm_eps`)."""
    h = dense(cfg, rt, width, ("embed",), (None,), "dense")(h)
    return layer_norm(rt, cfg.layer_norm_eps, norm_name)(HEAD_ACTIVATIONS[activation](h))


class Transform(nn.Module):
    """`transform` as a module of its own (BERT's `cls/predictions/transform`, ELECTRA's
    `generator_predictions`): [..., E] -> [..., width]."""

    config: EncoderConfig
    runtime: RuntimeConfig
    width: int
    activation: str
    norm_name: str = "LayerNorm"

    @nn.compact
    def __call__(self, h):
        return transform(self.config, self.runtime, h, self.width, self.activation, self.norm_name)


class MaskedLMHead(nn.Module):
    """An MLM head: the transform (`transform`; in a submodule `transform_name`, or in this
    module where it is None; none where `width` is None), then logits against the tied word
    embeddings plus this module's `bias` [V']. h [..., E], embedding [V', width] -> float32
    logits [..., V] (the table's padding rows, `vocab_pad_multiple`, cut off).

    BERT's `cls/predictions` (transform in `transform`), RoBERTa's `lm_head` (in place, GELU,
    `layer_norm`), ELECTRA's `generator_lm_head` (no transform), DeBERTa's two spellings.
    """

    config: EncoderConfig
    runtime: RuntimeConfig
    width: int | None = None
    activation: str = "gelu"
    norm_name: str = "LayerNorm"
    transform_name: str | None = None

    @nn.compact
    def __call__(self, h, embedding):
        cfg, rt = self.config, self.runtime
        if self.width is not None:
            args = (self.width, self.activation, self.norm_name)
            if self.transform_name is None:
                h = transform(cfg, rt, h, *args)
            else:
                h = Transform(cfg, rt, *args, name=self.transform_name)(h)
        bias = self.param("bias", zeros_init(("vocab",)), (cfg.padded_vocab_size,), rt.param_dtype)
        logits = tied_logits(h, embedding, rt.dtype)  # float32 [..., V']
        return (logits + bias.astype(jnp.float32))[..., : cfg.vocab_size]


class ClassificationHead(nn.Module):
    """A classifier on the first token's states (RoBERTa's and ELECTRA's `classifier`): dropout
    (`classifier_dropout`), `dense`, `activation`, dropout, `out_proj`: [..., E] -> float32
    logits [..., N]."""

    config: EncoderConfig
    runtime: RuntimeConfig
    activation: str

    @nn.compact
    def __call__(self, first, *, deterministic: bool):
        cfg, rt = self.config, self.runtime
        drop = Dropout(classifier_dropout(cfg))
        h = dense(cfg, rt, cfg.hidden_size, ("embed",), (None,), "dense")(
            drop(first, deterministic=deterministic)
        )
        h = drop(HEAD_ACTIVATIONS[self.activation](h), deterministic=deterministic)
        return dense(
            cfg, rt, cfg.num_labels, ("embed",), (None,), "out_proj", out_dtype=jnp.float32
        )(h)


class TiedBias(nn.Module):
    """`<name>/bias` [V] float32 (zeros at init): the output bias of an MLM decoder tied to the
    word embeddings, under the name its family's checkpoints give it (`lm_head`, `decoder`)."""

    size: int
    param_dtype: str = "float32"

    @nn.compact
    def __call__(self):
        bias = self.param("bias", zeros_init(("vocab",)), (self.size,), self.param_dtype)
        return bias.astype(jnp.float32)


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
