"""What every family's config shares: run-time knobs (`RuntimeConfig`) and `EncoderConfig`.

`RuntimeConfig` changes how the same weights are computed and never goes into a checkpoint;
`EncoderConfig` is the base of each family's architecture config (`models/<family>/config.py`).
All are frozen dataclasses: hashable, so modules can hold them and `jax.jit` can close over them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from typing import Any, ClassVar, NoReturn

from bert_jax import activations, hardware
from bert_jax.paths import as_path

# The names a config may use; the functions they stand for: `bert_jax.activations`.
ACTIVATIONS = tuple(activations.ACTIVATIONS)
REMAT_POLICIES = tuple(activations.REMAT_POLICIES)
ATTENTION_IMPLEMENTATIONS = ("xla", "fused_xla", "cudnn", "splash", "auto")
# RuntimeConfig.dropout_rng: jax.random key implementations (hash: models.hash_rng's)
DROPOUT_RNGS = ("threefry", "rbg", "hash")
DTYPES = ("float32", "bfloat16")  # parameter storage: float16 is refused (master weights)
COMPUTE_DTYPES = (*DTYPES, "float16", "auto")  # float16 trains with dynamic loss scaling

# Keys a Hugging Face config.json carries that say nothing about an encoder's weights
# (`sentence_transformers`: a CrossEncoder's block, its scores' activation, which
# `checkpoints.cross_encoder` reads).
HF_HOUSEKEEPING = frozenset(
    """
    sentence_transformers
    _name_or_path architectures transformers_version model_type torch_dtype dtype use_cache
    gradient_checkpointing output_hidden_states output_attentions return_dict torchscript
    chunk_size_feed_forward is_encoder_decoder problem_type bos_token_id eos_token_id sep_token_id
    cls_token_id decoder_start_token_id tie_word_embeddings label2id id2label tokenizer_class
    prefix task_specific_params finetuning_task pruned_heads tie_encoder_decoder
    cross_attention_hidden_size add_pooling_layer directionality pooler_fc_size
    pooler_num_attention_heads pooler_num_fc_layers pooler_size_per_head pooler_type output_past
    embedding_size
    """.split()
)


# The largest size or count a model config may hold: token ids, positions and array sizes are
# int32 on the device; a larger value (a typo, or a stranger's config.json) is refused up front.
MAX_SIZE = 2**31 - 1
# The fields that size the weights of a family of BERT's layers
# (`BertLayersConfig._check_layers`): positive integers, at most `MAX_SIZE`.
LAYER_SIZES = (
    "vocab_size",
    "vocab_pad_multiple",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "num_labels",
)


def bert_size(num_hidden_layers: int, hidden_size: int) -> dict[str, int]:
    """The layer fields of BERT's size L-H (Devlin et al. 2018, and Turc et al. 2019's
    miniatures): `num_hidden_layers` layers of width `hidden_size` (E), in heads of 64
    (H = E / 64) and with a feed-forward layer of width F = 4E. The released BERT, RoBERTa,
    ELECTRA, DeBERTa-v3 and MPNet sizes are of this shape (their `PRESETS`)."""
    return dict(
        num_hidden_layers=num_hidden_layers,
        hidden_size=hidden_size,
        num_attention_heads=hidden_size // 64,
        intermediate_size=4 * hidden_size,
    )


class EncoderConfig:
    """What every model family's config dataclass shares: the head size, `replace`, field checks
    that fail naming the field, named sizes (`_preset_fields`), and `config.json` both ways.

    A family's config has the fields hidden_size, num_attention_heads, vocab_size, pad_token_id,
    initializer_range, num_labels and label_names, and `attention_probs_dropout_prob` as a field
    or property: what the shared layers and conversion read; a family whose word table is padded
    has the field `vocab_pad_multiple` too. A family of BERT's layers derives from
    `BertLayersConfig` (most through `PostLNConfig`).

    Its fields are config.json's keys (`hf_names` renames the others), with transformers' class
    defaults, so a missing key means what it means to transformers; `num_labels` and
    `label_names` are its id2label. A family overrides `_from_hf_fields` and `_hf_derived` where a
    key is derived from the fields (ModernBERT's `layer_types`).

    Attributes:
      model_type: config.json's `model_type`, the family's registry key.
      display_name: the family's name in messages ("RoBERTa").
      hf_names: {field: config.json key} where the two differ.
      hf_fixed: {config.json key: the one value bert_jax implements}: written, and on reading a
        file holding another value raises (`position_embedding_type` "absolute").
      hf_if_set: bert_jax's own fields, written only when they differ from their default
        (`vocab_pad_multiple`: a Hugging Face export strips the padding and the field).
      hf_housekeeping: keys that say nothing about the weights: read past in silence.
      hf_derived: keys `_from_hf_fields` reads and `_hf_derived` writes (not fields).
      presets: the family's named sizes, {name: fields} (`preset`).
      released_vocab_size: the released models' vocabulary, which every preset but "tiny"
        takes (`preset`); None: the presets' own (or the default).
      vocab_pad_multiple: 1: the word table has V rows (`padded_vocab_size`), unless the family
        declares it a field (`PostLNConfig`'s).
    """

    model_type: ClassVar[str]
    display_name: ClassVar[str]
    hf_names: ClassVar[Mapping[str, str]] = {}
    hf_fixed: ClassVar[Mapping[str, Any]] = {}
    hf_if_set: ClassVar[tuple[str, ...]] = ()
    hf_housekeeping: ClassVar[frozenset[str]] = HF_HOUSEKEEPING
    hf_derived: ClassVar[tuple[str, ...]] = ()
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    released_vocab_size: ClassVar[int | None] = None
    vocab_pad_multiple: ClassVar[int] = 1

    @property
    def head_dim(self) -> int:
        """D, the width of one attention head."""
        return self.hidden_size // self.num_attention_heads

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the word-embedding table (and the MLM bias): V rounded up to
        `vocab_pad_multiple` (V itself in a family without that field: ModernBERT's)."""
        return -(-self.vocab_size // self.vocab_pad_multiple) * self.vocab_pad_multiple

    @property
    def max_sequence_length(self) -> int:
        """The most tokens a row may hold: `max_position_embeddings` (a family whose position
        table has rows no token reads, RoBERTa's, says less)."""
        return self.max_position_embeddings

    @classmethod
    def preset(cls, name: str, **overrides: Any):
        """The config of the named size `name` (any case) of the family's `presets`, with
        `overrides`. A size other than "tiny" (a CPU size, whose vocabulary is the tokenizer's:
        pass vocab_size) has the released models' vocabulary, `released_vocab_size`, where the
        family has one."""
        released = {}
        if cls.released_vocab_size is not None and name.lower() != "tiny":
            released = {"vocab_size": cls.released_vocab_size}
        return cls(**{**released, **cls._preset_fields(cls.presets, name), **overrides})

    @classmethod
    def _preset_fields(cls, presets: Mapping[str, Mapping[str, Any]], name: str, key: str = ""):
        """The fields of the size `presets[name]` (any case; `key`, when given, is the name to
        look up); an unknown name fails listing the known ones."""
        table = {k.lower(): v for k, v in presets.items()}
        fields = table.get(key or name.lower())
        if fields is None:
            raise ValueError(f"unknown {cls.__name__} preset {name!r}; known: {sorted(presets)}")
        return dict(fields)

    def _fail(self, field: str, value: Any, why: str) -> NoReturn:
        raise ValueError(f"{type(self).__name__}.{field}={value!r}: {why}")

    def _check_fields(
        self,
        sizes: tuple[str, ...] = (),
        probabilities: tuple[str, ...] = (),
        positive: tuple[str, ...] = (),
        bools: tuple[str, ...] = (),
        activations: tuple[str, ...] = (),
        optional: tuple[str, ...] = (),
    ) -> None:
        """Fails naming the first field that is not: a positive integer at most `MAX_SIZE`
        (`sizes`), a probability in [0, 1) (`probabilities`; those in `optional` may be None), a
        positive number (`positive`), a bool (`bools`) or a name in `ACTIVATIONS`
        (`activations`). A bool is no number here."""

        def number(value) -> bool:
            return not isinstance(value, bool) and isinstance(value, (int, float))

        for name in sizes:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                self._fail(name, value, "must be a positive integer")
            if value > MAX_SIZE:
                self._fail(name, value, f"must be at most {MAX_SIZE} (sizes and ids are int32)")
        for name in probabilities:
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            if not number(value) or not 0.0 <= value < 1.0:
                self._fail(name, value, "must be a probability in [0, 1)")
        for name in positive:
            value = getattr(self, name)
            if not number(value) or value <= 0:
                self._fail(name, value, "must be a positive number")
        for name in bools:
            if not isinstance(getattr(self, name), bool):
                self._fail(name, getattr(self, name), "must be a bool")
        for name in activations:
            if getattr(self, name) not in ACTIVATIONS:
                self._fail(
                    name, getattr(self, name), f"unknown activation; expected one of {ACTIVATIONS}"
                )

    def replace(self, **changes: Any):
        """A copy with `changes` applied (validated again)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"{type(self).__name__} has no field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def _check_ids_and_labels(self) -> None:
        """pad_token_id is in the vocabulary; label_names (made a tuple) number num_labels."""
        pad, vocab_size = self.pad_token_id, self.vocab_size
        if not isinstance(pad, int) or not 0 <= pad < vocab_size:
            self._fail("pad_token_id", pad, f"must be an id in [0, {vocab_size})")
        if self.label_names is not None:
            if not isinstance(self.label_names, tuple):
                object.__setattr__(self, "label_names", tuple(self.label_names))
            if len(self.label_names) != self.num_labels:
                self._fail(
                    "label_names",
                    self.label_names,
                    f"has {len(self.label_names)} names but num_labels={self.num_labels}",
                )

    def _check_special_ids(self, *names: str) -> None:
        """The special-token ids `names` (config.json's bos/eos/cls/sep_token_id, kept for the
        tokenizers and transformers, never read by the model) are non-negative integers."""
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZE:
                self._fail(name, value, "must be a non-negative integer id")

    # ---- Hugging Face config.json ----
    @classmethod
    def _hf_fields(cls) -> dict[str, str]:
        """{field: config.json key} of the fields config.json holds as they are."""
        return {
            f.name: cls.hf_names.get(f.name, f.name)
            for f in dataclasses.fields(cls)
            if f.name not in ("num_labels", "label_names")
        }

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]):
        """A config from the dict of a Hugging Face `config.json` of this model_type.

        A key the file lacks (or holds as null) takes the field's default. Keys that change the
        architecture in ways bert_jax does not implement (another `hf_fixed` value: relative
        position embeddings; a decoder, cross-attention) raise; housekeeping keys are ignored;
        any other unknown key is logged, never silently dropped.
        """
        d = dict(d)
        if d.get("model_type", cls.model_type) != cls.model_type:
            raise ValueError(
                f"config.json has model_type={d['model_type']!r}, not {cls.model_type!r}"
            )
        for key, value in cls.hf_fixed.items():
            if d.get(key) not in (None, value):
                raise ValueError(f"config.json has {key}={d[key]!r}; only {value!r} is supported")
        for flag in _ENCODER_ONLY:
            if d.get(flag):
                raise ValueError(f"config.json has {flag}=true; bert_jax implements the encoder")
        optional = {f.name for f in dataclasses.fields(cls) if f.default is None}
        names = cls._hf_fields()
        kwargs = {
            field: d[key]
            for field, key in names.items()
            if key in d and (d[key] is not None or field in optional)
        }
        kwargs.update(labels_from_hf(d))
        unknown = set(d) - set(names.values()) - cls.hf_housekeeping - set(cls.hf_derived)
        unknown -= {*cls.hf_fixed, *_ENCODER_ONLY, "num_labels"}
        if unknown:
            logging.warning("config.json keys not used by bert_jax: %s", sorted(unknown))
        return cls._from_hf_fields(d, kwargs)

    @classmethod
    def _from_hf_fields(cls, d: Mapping[str, Any], kwargs: dict[str, Any]):
        """The config of the fields `kwargs` read from config.json `d` (a family with
        `hf_derived` keys reads them here)."""
        return cls(**kwargs)

    def _hf_derived(self) -> dict[str, Any]:
        """config.json's keys derived from the fields (`hf_derived`)."""
        return {}

    def to_hf_dict(self, architecture: str | None = None) -> dict[str, Any]:
        """The dict of a Hugging Face `config.json` for this config (`architecture`: the class
        in its `architectures`)."""
        d: dict[str, Any] = {"model_type": self.model_type}
        if architecture:
            d["architectures"] = [architecture]
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for field, key in self._hf_fields().items():
            value = getattr(self, field)
            if field not in self.hf_if_set or value != defaults[field]:
                d[key] = value
        d.update(self._hf_derived())
        d.update(labels_to_hf(self.label_names, self.num_labels))
        d.update(self.hf_fixed)
        d["tie_word_embeddings"] = True  # every family's MLM decoder is its word embeddings
        return d

    @classmethod
    def from_json_file(cls, path: str | os.PathLike):
        """Reads a Hugging Face `config.json` (or the directory holding one), local or at a URL
        (`etils.epath`)."""
        path = as_path(path)
        if path.is_dir():
            path = path / "config.json"
        return cls.from_hf_dict(json.loads(path.read_text(encoding="utf-8")))

    def to_json_file(self, path: str | os.PathLike, *, architecture: str | None = None) -> None:
        """Writes a Hugging Face `config.json`."""
        write_json(path, self.to_hf_dict(architecture))


@dataclasses.dataclass(frozen=True)
class BertLayersConfig(EncoderConfig):
    """The first fields of BERT's config, which size and regularize its post-LayerNorm layers,
    with transformers' BertConfig defaults, and their checks (`_check_layers`; `__post_init__`
    runs them). `PostLNConfig` adds BERT's other fields; MPNet, which has no token types, its
    own. Either declares the others the checks read: initializer_range, layer_norm_eps,
    pad_token_id, num_labels and label_names.

    A family restates the defaults its transformers class changes (a restated field keeps its
    place) and adds its own fields, which follow these.

    Attributes:
      vocab_size: V, rows of the word-embedding table (and columns of the MLM logits).
      hidden_size: E, width of the residual stream.
      num_hidden_layers: number of transformer layers.
      num_attention_heads: H; head size D = E / H.
      intermediate_size: F, width of the feed-forward layer.
      hidden_act: feed-forward activation; "gelu" is the exact erf GELU of the original.
      hidden_dropout_prob: dropout on embeddings and on each sub-layer output.
      attention_probs_dropout_prob: dropout on the attention probabilities.
      max_position_embeddings: rows of the position table; the longest sequence the model takes.
      layer_sizes: the fields `__post_init__` checks as sizes (`_check_layers`).
      optional_dropouts: the family's own dropouts that `__post_init__` checks too, each a
        probability or None (its classifiers': None means hidden_dropout_prob).
      special_ids: the special-token ids `__post_init__` checks (`_check_special_ids`).
    """

    layer_sizes: ClassVar[tuple[str, ...]] = LAYER_SIZES
    optional_dropouts: ClassVar[tuple[str, ...]] = ()
    special_ids: ClassVar[tuple[str, ...]] = ()
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512

    def __post_init__(self):
        """The checks of BERT's layers (`_check_layers` of `layer_sizes`, with the
        `optional_dropouts`), then the ids and labels and the `special_ids`; ValueError naming
        the first field that fails. A family with more to check extends it."""
        dropouts = self.optional_dropouts
        self._check_layers(sizes=self.layer_sizes, probabilities=dropouts, optional=dropouts)
        self._check_ids_and_labels()
        self._check_special_ids(*self.special_ids)

    def _check_layers(
        self,
        sizes: tuple[str, ...] = LAYER_SIZES,
        probabilities: tuple[str, ...] = (),
        bools: tuple[str, ...] = (),
        activations: tuple[str, ...] = (),
        optional: tuple[str, ...] = (),
    ) -> None:
        """The checks of a family of BERT's layers (`_check_fields`), then the heads': `sizes`;
        hidden_dropout_prob, attention_probs_dropout_prob and `probabilities` (those in
        `optional` may be None); initializer_range and layer_norm_eps positive; hidden_act and
        `activations` known; `bools`; hidden_size split into num_attention_heads heads."""
        self._check_fields(
            sizes=sizes,
            probabilities=("hidden_dropout_prob", "attention_probs_dropout_prob", *probabilities),
            positive=("initializer_range", "layer_norm_eps"),
            bools=bools,
            activations=("hidden_act", *activations),
            optional=optional,
        )
        if self.hidden_size % self.num_attention_heads:
            self._fail(
                "hidden_size",
                self.hidden_size,
                f"not divisible by num_attention_heads={self.num_attention_heads}",
            )


@dataclasses.dataclass(frozen=True)
class PostLNConfig(BertLayersConfig):
    """The fields of a family of BERT's post-LayerNorm layers (BERT, RoBERTa, ELECTRA,
    DeBERTa-v2), with transformers' BertConfig defaults: `BertLayersConfig`'s, then these.

    Attributes:
      type_vocab_size: rows of the token-type (segment A/B) table.
      initializer_range: stddev of the truncated-normal initializer.
      layer_norm_eps: epsilon of every LayerNorm.
      pad_token_id: id of [PAD].
      num_labels: output width of the sequence/token classification heads (1 means regression).
      label_names: optional names of the labels, written to config.json as id2label.
      vocab_pad_multiple: the word-embedding table and the MLM decoder's bias have
        `padded_vocab_size` rows, V rounded up to this multiple (128 fills the TPU's matrix
        unit; 128 x the tensor axis also splits evenly over it). The extra rows are never looked
        up and their logits are cut off, so outputs are [..., V] whatever this is. Conversion and
        the Hugging Face export strip them (round trips are exact); not written to a Hugging
        Face config.json.
    """

    hf_if_set: ClassVar[tuple[str, ...]] = ("vocab_pad_multiple",)  # bert_jax's own
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    num_labels: int = 2
    label_names: tuple[str, ...] | None = None
    vocab_pad_multiple: int = 1


# config.json flags of a decoder, which bert_jax does not implement: true raises.
_ENCODER_ONLY = ("is_decoder", "add_cross_attention")


def write_json(path: str | os.PathLike, d: Mapping[str, Any]) -> None:
    """Writes `d` as a config file: indented, keys sorted, a final newline."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(d, f, indent=2, sort_keys=True)
        f.write("\n")


def labels_from_hf(d: Mapping[str, Any]) -> dict[str, Any]:
    """`num_labels` (and `label_names` unless they are LABEL_0, LABEL_1, ...) from a Hugging
    Face config.json's id2label, else its num_labels; {} when it has neither."""
    id2label = d.get("id2label")
    if id2label:
        items = sorted((int(k), v) for k, v in id2label.items())
        out: dict[str, Any] = {"num_labels": len(items)}
        if any(v != f"LABEL_{i}" for i, v in items):
            out["label_names"] = tuple(v for _, v in items)
        return out
    return {"num_labels": int(d["num_labels"])} if "num_labels" in d else {}


def labels_to_hf(label_names: tuple[str, ...] | None, num_labels: int) -> dict[str, Any]:
    """config.json's id2label and label2id for these labels (LABEL_i when unnamed)."""
    names = label_names or tuple(f"LABEL_{i}" for i in range(num_labels))
    return {
        "id2label": {str(i): n for i, n in enumerate(names)},
        "label2id": {n: i for i, n in enumerate(names)},
    }


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """How the model is computed; none of it is stored in a checkpoint.

    Attributes:
      dtype: compute dtype of matmuls and activations: "float32", "bfloat16", "float16", or
        "auto" (bfloat16 on TPUs and CUDA GPUs of compute capability >= 8.0, float16 on older
        CUDA GPUs, float32 on CPUs; `resolved` makes it concrete once at start). LayerNorm
        statistics, attention scores, the softmax and its mask stay float32. "float16" trains with
        dynamic loss scaling (`training.steps.DynamicLossScale`). bfloat16 on a CPU: docs/python.md.
      param_dtype: storage dtype of the parameters: "float32" master weights (the default) or
        "bfloat16"; never "float16" (updates would round away).
      scan_layers: run the encoder as one `nn.scan` over a stacked layer axis: compiles one layer
        instead of the stack; the weights gain a leading "layers" axis.
      remat_policy: what each layer keeps for the backward pass: "none" (everything), "dots"
        (matmul outputs), "dots_no_batch" (weight matmuls only), "full" (nothing; recompute).
      attention: "xla" (the exact reference, the only one with attention-probability dropout),
        "cudnn", "fused_xla", "splash" or "auto"; what each needs: docs/python.md, and
        `models.attention.resolve_attention` checks a choice for a platform.
      collective_matmul: on TPU, XLA's windowed einsum (each sharded matmul a ring of partial
        matmuls overlapped with collective-permutes). Off by default, as for FSDP it moves more
        HBM bytes (benchmarks/RESULTS_tpu.md): parameters are then all-gathered ahead of their
        layer and gradients reduce-scattered whole. No effect on other platforms.
      dropout_rng: the generator of each step's dropout bits: "threefry" (the same bits whatever
        the sharding or platform), "rbg" (XLA's RngBitGenerator, as t5x and MaxText use) or
        "hash" (`models.hash_rng`: a counter hash of threefry's keys, the same bits whatever the
        sharding or platform, at a fraction of threefry's cost on CPUs). Each starts from the
        run's key folded with the step (`training.steps.step_rng`), so a run repeats and resumes
        exactly either way; each draws other masks than the others ("rbg" other ones again on
        another platform).
      loss_scale_init: float16 only: the loss scale of the first step (a power of 2).
      loss_scale_period: float16 only: the scale doubles after this many finite steps in a row.
    """

    dtype: str = "float32"
    param_dtype: str = "float32"
    scan_layers: bool = False
    remat_policy: str = "none"
    attention: str = "xla"
    collective_matmul: bool = False
    dropout_rng: str = "threefry"  # or "rbg", "hash": `DROPOUT_RNGS`
    loss_scale_init: float = 2.0**15  # float16: the first step's loss scale
    loss_scale_period: int = 2000  # float16: finite steps in a row before the scale doubles

    def __post_init__(self):
        if self.param_dtype == "float16":
            raise ValueError(
                "RuntimeConfig.param_dtype='float16' is not supported: the parameters are float32 "
                "master weights (small updates round away in float16); keep "
                "param_dtype='float32' and set dtype='float16' to compute in float16 (with "
                "dynamic loss scaling)"
            )
        for name, allowed in (("dtype", COMPUTE_DTYPES), ("param_dtype", DTYPES)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"RuntimeConfig.{name}={value!r}: expected one of {allowed}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(
                f"RuntimeConfig.remat_policy={self.remat_policy!r}: "
                f"expected one of {REMAT_POLICIES}"
            )
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(
                f"RuntimeConfig.attention={self.attention!r}: expected one of "
                f"{ATTENTION_IMPLEMENTATIONS}"
            )
        if self.attention == "cudnn" and self.dtype == "float32":
            raise ValueError(
                "RuntimeConfig.attention='cudnn' takes bfloat16 or float16 (cuDNN's flash "
                "attention: float16 too on compute capability 8.0 and later), but "
                "dtype='float32'; use dtype='bfloat16' (or 'auto'), or attention='auto' (cuDNN "
                "where it applies, the exact xla path elsewhere)"
            )
        if self.dropout_rng not in DROPOUT_RNGS:
            raise ValueError(
                f"RuntimeConfig.dropout_rng={self.dropout_rng!r}: expected one of {DROPOUT_RNGS}"
            )
        for name in ("scan_layers", "collective_matmul"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"RuntimeConfig.{name}={getattr(self, name)!r}: expected a bool")
        scale = self.loss_scale_init
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale >= 1:
            raise ValueError(f"RuntimeConfig.loss_scale_init={scale!r}: expected a number >= 1")
        period = self.loss_scale_period
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ValueError(
                f"RuntimeConfig.loss_scale_period={period!r}: expected a positive integer"
            )

    def compute_dtype(self, platform: str, *, compute_capability: str | None = None) -> str:
        """The concrete compute dtype on `platform` ("cpu", "cuda"/"gpu", "rocm", "tpu").

        Args:
          platform: where the run computes.
          compute_capability: a CUDA device's compute capability ("7.5", "9.0"; a CUDA jax
            device's `.compute_capability`), or None where unknown.

        Returns:
          dtype, or for "auto": float32 on CPUs; float16 on CUDA GPUs below compute capability
          8.0 (`hardware.BFLOAT16_MIN_COMPUTE_CAPABILITY`); bfloat16 on the others, on TPUs and
          on GPUs of unknown compute capability.
        """
        if self.dtype != "auto":
            return self.dtype
        if platform == "cpu":
            return "float32"
        if platform in ("cuda", "gpu") and compute_capability:
            if not hardware.has_bfloat16_matrix_units(compute_capability):
                return "float16"
        return "bfloat16"

    def resolved(self, platform: str, *, compute_capability: str | None = None) -> RuntimeConfig:
        """A copy with dtype "auto" made concrete for `platform` (`compute_dtype`).

        Called once per run; warns (once per process) when the run computes in bfloat16 on a CPU
        without bfloat16 matrix units (`hardware.emulated_bfloat16_warning`).
        """
        dtype = self.compute_dtype(platform, compute_capability=compute_capability)
        cpuinfo = hardware.read_cpuinfo() if (dtype, platform) == ("bfloat16", "cpu") else None
        message = hardware.emulated_bfloat16_warning(dtype, platform, cpuinfo)
        if message and message not in _WARNED:
            _WARNED.add(message)
            logging.warning(message)
        return dataclasses.replace(self, dtype=dtype)

    def compiler_options(self, platform: str) -> dict[str, str]:
        """XLA options for compiling the steps on `platform` (what `collective_matmul` sets)."""
        if platform != "tpu" or self.collective_matmul:
            return {}
        return {f"xla_tpu_enable_windowed_einsum_for_{c}": "false" for c in _WINDOWED_COLLECTIVES}


_WINDOWED_COLLECTIVES = ("all_gather", "reduce_scatter")


_WARNED: set[str] = set()
