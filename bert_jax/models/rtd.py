"""Replaced-token detection's two models as one module (ELECTRA, Clark et al. 2020; DeBERTa-v3,
He et al. 2021): a generator, the family's masked LM (smaller), fills the masked positions with
samples of its own predictions, and a discriminator, the family's `Role.REPLACED_TOKEN_DETECTION`
class, says of every token whether it was replaced.

Parameters: {"generator": its masked LM's tree, "discriminator": its tree}, the embeddings shared
one of three ways (`SHARINGS`):
  "tied"          ELECTRA: one embeddings block (words, positions, token types, LayerNorm) in
                  the discriminator's tree, read by the generator too; both losses train it.
  "disentangled"  DeBERTa-v3's gradient-disentangled sharing: the generator owns the word (and
                  any absolute position) table; the discriminator's tree holds a difference,
                  started at zero, and reads stop_gradient(generator's) + difference, so its
                  loss does not pull the generator's table.
  "none"          each its own.
`split` gives each model's own parameters (the shared tables put in), what the export and the
fill-mask demonstration read. Both models are one train state: sharded, checkpointed and
restored as any head's.

Dimension legend: B batch, L sequence length, P predictions per row, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models import families
from bert_jax.models.config import EncoderConfig, RuntimeConfig
from bert_jax.models.family import Role
from bert_jax.models.params import get_at, init_params, replace_at, stack_layers

SHARINGS = ("tied", "disentangled", "none")
# Where a pretraining run exports its generator, a masked LM for fill-mask: <workdir>/generator
# (its hf/ and export/); the run's own hf/ holds the discriminator.
GENERATOR_DIR = "generator"
PyTree = Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RTDOutput:
    """generator_logits [B, P, V] float32 at the masked positions; sampled [B, P] the
    generator's samples there; discriminator_logits [B, L] float32 ("replaced" > 0); replaced
    [B, L] bool, the tokens the discriminator read that differ from the original text."""

    generator_logits: jax.Array
    sampled: jax.Array
    discriminator_logits: jax.Array
    replaced: jax.Array


def generator_config(config: EncoderConfig, width: float, depth: float) -> EncoderConfig:
    """The generator's architecture: the discriminator's `config` with hidden size,
    feed-forward size and heads scaled by `width` (ELECTRA's "generator size": 1/4 for small
    and large, 1/3 for base) and layers by `depth` (DeBERTa-v3's: half the layers, full width).
    The embeddings (vocabulary, positions, their width) are the discriminator's: a narrower
    generator projects them (`embedding_size`, which ELECTRA and DeBERTa have)."""
    if not (0 < width <= 1 and 0 < depth <= 1):
        raise ValueError(f"generator width {width} and depth {depth} must be in (0, 1]")
    hidden = max(1, round(config.hidden_size * width))
    heads = max(1, round(config.num_attention_heads * width))
    while hidden % heads:
        heads -= 1
    tables = {}
    if hidden != config.hidden_size:
        if not hasattr(config, "embedding_size"):
            raise ValueError(
                f"a generator narrower than the discriminator (width {width}) needs embeddings "
                f"of their own width (embedding_size), which {config.model_type} has not"
            )
        tables["embedding_size"] = config.embedding_size or config.hidden_size
    return config.replace(
        **tables,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=max(1, round(config.intermediate_size * width)),
        num_hidden_layers=max(1, round(config.num_hidden_layers * depth)),
    )


@functools.lru_cache(maxsize=64)
def _block_shapes(model: nn.Module, block: tuple[str, ...]) -> dict[str, tuple]:
    """{entry: its parameters' shapes} of the subtree `block` of `model`'s parameters."""
    shapes = jax.eval_shape(lambda: nn.meta.unbox(init_params(model, jax.random.PRNGKey(0))))
    return {
        name: tuple(x.shape for x in jax.tree_util.tree_leaves(sub))
        for name, sub in get_at(shapes, block).items()
    }


def _boxed(x) -> bool:
    return isinstance(x, nn.meta.AxisMetadata)


def _zeros(x):
    """Zeros like a parameter, its logical axes kept."""
    return x.replace_boxed(jnp.zeros_like(x.unbox())) if _boxed(x) else jnp.zeros_like(x)


def starting_paths(paths: dict, sharing: str) -> dict:
    """A family's `starting_paths` (in its heads' trees) in a pair's tree: the MLM bias is the
    generator's; the position table lives in the discriminator's tree when "tied", else in the
    generator's."""
    out = {"mlm_bias": ("generator", *paths["mlm_bias"])}
    if "position_embeddings" in paths:
        owner = "discriminator" if sharing == "tied" else "generator"
        out["position_embeddings"] = (owner, *paths["position_embeddings"])
    return out


class ReplacedTokenDetection(nn.Module):
    """A generator and a discriminator of one family, trained together.

    Attributes:
      config: the discriminator's architecture (the run's model).
      runtime: both models' computation settings.
      generator: the generator's architecture (`generator_config`); its embeddings' sizes must be
        the discriminator's.
      sharing: how the embeddings are shared (`SHARINGS`).
      temperature: the generator's samples are drawn from softmax(logits / temperature).

    Call arguments: input_ids [B, L]; masked_positions, masked_lm_ids and masked_lm_weights
    [B, P] (the pretraining batch's); deterministic (False: dropout, from the "dropout" rngs);
    by keyword, the heads' other model inputs [B, L] (`models.heads.Head`: token_type_ids,
    attention_mask, position_ids, segment_ids; None ones are left out, and cls_positions is not
    read: neither head pools). The samples draw from the "sample" rngs.
    Returns `RTDOutput` (None while initializing).
    """

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()
    generator: EncoderConfig | None = None
    sharing: str = "tied"
    temperature: float = 1.0

    def __post_init__(self):
        if self.sharing not in SHARINGS:
            raise ValueError(f"embedding sharing {self.sharing!r}: expected one of {SHARINGS}")
        super().__post_init__()

    # ---- the two models and their trees ----
    @property
    def family(self) -> families.Family:
        return families.family_of(self.config)

    @property
    def token_types(self) -> bool:
        return self.discriminator_model().token_types

    def generator_model(self) -> nn.Module:
        """The generator, unbound: the family's masked LM on `generator`."""
        cls = families.get_model_class(self.family.head_for(Role.MASKED_LM))
        return cls(self.generator or self.config, self.runtime, parent=None)

    def discriminator_model(self) -> nn.Module:
        """The discriminator, unbound: the family's replaced-token detector on `config`."""
        cls = families.get_model_class(self.family.head_for(Role.REPLACED_TOKEN_DETECTION))
        return cls(self.config, self.runtime, parent=None)

    def shared_paths(self) -> list[tuple[str, ...]]:
        """The shared subtrees' paths in either model's tree, those of the discriminator's
        embeddings block of the same shapes in the generator's: every entry ("tied": ELECTRA's
        tables and LayerNorm, read before its projection; a narrower DeBERTa generator's
        projection and LayerNorm are its own), the word and absolute position tables
        ("disentangled"), none ("none")."""
        if self.sharing == "none":
            return []
        block = (self.family.encoder_name, "embeddings")
        ours = _block_shapes(self.discriminator_model(), block)
        theirs = _block_shapes(self.generator_model(), block)
        names = ("word_embeddings", "position_embeddings")
        return [
            (*block, name)
            for name, shapes in ours.items()
            if theirs.get(name) == shapes and (self.sharing == "tied" or name in names)
        ]

    def split(self, params: PyTree) -> tuple[PyTree, PyTree]:
        """(generator's, discriminator's) parameters, each a whole tree of its class, from this
        module's {"generator", "discriminator"} (plain arrays; traced or not)."""
        gen, disc = params["generator"], params["discriminator"]
        for path in self.shared_paths():
            if self.sharing == "tied":
                gen = replace_at(gen, path, get_at(disc, path))
            else:  # the difference on the generator's table, which its loss alone trains
                base = jax.tree_util.tree_map(jax.lax.stop_gradient, get_at(gen, path))
                disc = replace_at(
                    disc, path, jax.tree_util.tree_map(jnp.add, base, get_at(disc, path))
                )
        return gen, disc

    def join(self, generator: PyTree, discriminator: PyTree) -> PyTree:
        """This module's parameters from each model's whole tree (`split`'s inverse): "tied"
        keeps the discriminator's embeddings, "disentangled" stores its tables as differences
        from the generator's."""
        for path in self.shared_paths():
            if self.sharing == "tied":
                generator = replace_at(generator, path, None)
            else:
                diff = jax.tree_util.tree_map(
                    jnp.subtract, get_at(discriminator, path), get_at(generator, path)
                )
                discriminator = replace_at(discriminator, path, diff)
        return {"generator": generator, "discriminator": discriminator}

    def start_from(self, fresh: PyTree, discriminator: PyTree) -> PyTree:
        """This module's host parameters for a run that starts from a checkpoint: its weights
        (`discriminator`: a whole tree of the discriminator's class, per-layer) for the
        discriminator, the generator's from `fresh` (this module's scratch parameters) but for
        the shared tables, which start as the checkpoint's."""
        if self.runtime.scan_layers:
            discriminator = stack_layers(discriminator)
        generator, _ = self.split(fresh)
        for path in self.shared_paths():
            generator = replace_at(generator, path, get_at(discriminator, path))
        return self.join(generator, discriminator)

    def _init(self, which: str, rng, length: int) -> PyTree:
        """Boxed initial parameters of the generator or the discriminator (`which`): the model's
        own initialization, less the tables it reads from the other ("tied": the generator has
        no embeddings block) or as a difference started at zero ("disentangled": the
        discriminator starts on the generator's tables)."""
        model = self.generator_model() if which == "generator" else self.discriminator_model()
        tree = init_params(model, rng, length)
        for path in self.shared_paths():
            if self.sharing == "tied" and which == "generator":
                tree = replace_at(tree, path, None)
            elif self.sharing == "disentangled" and which == "discriminator":
                tree = replace_at(
                    tree, path, jax.tree_util.tree_map(_zeros, get_at(tree, path), is_leaf=_boxed)
                )
        return tree

    @nn.compact
    def __call__(
        self,
        input_ids,
        masked_positions=None,
        masked_lm_ids=None,
        masked_lm_weights=None,
        *,
        deterministic: bool = True,
        **model_inputs,
    ) -> RTDOutput | None:
        length = input_ids.shape[-1]
        trees = {
            which: self.param(which, lambda rng, which=which: self._init(which, rng, length))
            for which in ("generator", "discriminator")
        }
        if self.is_initializing() or masked_positions is None:
            return None
        generator, discriminator = self.split(trees)
        inputs = {k: v for k, v in model_inputs.items() if v is not None and k != "cls_positions"}

        def rngs():
            return None if deterministic else {"dropout": self.make_rng("dropout")}

        logits = (
            self.generator_model()
            .apply(
                {"params": generator},
                input_ids,
                **inputs,
                masked_positions=masked_positions,
                deterministic=deterministic,
                rngs=rngs(),
            )
            .logits
        )  # [B, P, V]
        sampled, corrupted, original = self._corrupt(
            input_ids, logits, masked_positions, masked_lm_ids, masked_lm_weights
        )
        disc_logits = (
            self.discriminator_model()
            .apply(
                {"params": discriminator},
                corrupted,
                **inputs,
                deterministic=deterministic,
                rngs=rngs(),
            )
            .logits
        )  # [B, L]
        return RTDOutput(logits, sampled, disc_logits, corrupted != original)

    def _corrupt(self, input_ids, logits, masked_positions, masked_lm_ids, masked_lm_weights):
        """The generator's samples at the masked slots and the rows they make.

        Args:
          input_ids: [B, L] int, the masked rows; logits: [B, P, V] float32, the generator's.
          masked_positions, masked_lm_ids, masked_lm_weights: [B, P], the slots, their original
            ids and weights (0: an unused slot).

        Returns:
          (sampled [B, P], corrupted [B, L], original [B, L]): one token drawn a slot (rng
          "sample", at `temperature`, no gradient through the draw), the rows with the samples
          in the used slots, and with the original ids there.
        """
        scaled = jax.lax.stop_gradient(logits) / self.temperature  # no gradient through samples
        sampled = jax.random.categorical(self.make_rng("sample"), scaled).astype(input_ids.dtype)
        b, length = input_ids.shape
        # The masked slots' positions; unused prediction slots point past the row (dropped).
        at = jnp.where(masked_lm_weights > 0, masked_positions, length)
        rows = jnp.arange(b)[:, None]
        original = input_ids.at[rows, at].set(masked_lm_ids, mode="drop")
        corrupted = input_ids.at[rows, at].set(sampled, mode="drop")
        return sampled, corrupted, original
