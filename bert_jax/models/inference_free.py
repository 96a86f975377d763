"""An inference-free SPLADE model as one module: documents run through the family's masked LM
(their SPLADE vectors pooled from its logits, `models.pooling.splade_pool`), queries run
through nothing: a query's vector is a trained weight of each vocabulary entry it holds
(`models.pooling.token_presence`): sentence-transformers' `SparseStaticEmbedding` in a `Router`,
as OpenSearch's "doc-only" neural sparse models are built.

Parameters: {"documents": the masked LM's whole tree, "query_weight": float32 [V]} (V the
vocabulary's size, unpadded; started at ones, as `SparseStaticEmbedding` starts without IDF
weights). The module's call is the masked LM's (its logits are the documents'); the objective
(`training.splade.InferenceFreeObjective`) reads the query weights itself. One train state:
sharded, checkpointed and restored as any head's.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from bert_jax.models import families
from bert_jax.models.config import EncoderConfig, RuntimeConfig
from bert_jax.models.family import Role
from bert_jax.models.params import init_params, stack_layers

DOCUMENTS, QUERY_WEIGHT = "documents", "query_weight"  # the module's two parameters
PyTree = Any


class InferenceFreeSplade(nn.Module):
    """The family's masked LM for documents and a weight per vocabulary entry for queries.

    Attributes:
      config: the masked LM's architecture (the run's model).
      runtime: its computation settings.

    Call arguments: the masked LM's (`models.heads.Head`: input_ids [B, L] and the rest),
    deterministic (False: dropout, from the "dropout" rngs). Returns the masked LM's output
    (None while initializing).
    """

    config: EncoderConfig
    runtime: RuntimeConfig = RuntimeConfig()

    @property
    def token_types(self) -> bool:
        return self.documents_model().token_types

    def documents_model(self) -> nn.Module:
        """The documents' model, unbound: the family's masked LM."""
        family = families.family_of(self.config)
        cls = families.get_model_class(family.head_for(Role.MASKED_LM))
        return cls(self.config, self.runtime, parent=None)

    def start_from(self, fresh: PyTree, documents: PyTree) -> PyTree:
        """This module's host parameters for a run that starts from a checkpoint: its weights
        (`documents`: a whole tree of the masked LM's class, per-layer) for the documents, the
        query weights from `fresh` (this module's scratch parameters: ones)."""
        if self.runtime.scan_layers:
            documents = stack_layers(documents)
        return {DOCUMENTS: documents, QUERY_WEIGHT: fresh[QUERY_WEIGHT]}

    @nn.compact
    def __call__(self, input_ids, *, deterministic: bool = True, **inputs):
        length = input_ids.shape[-1]
        documents = self.param(
            DOCUMENTS, lambda rng: init_params(self.documents_model(), rng, length)
        )
        ones = nn.with_logical_partitioning(nn.initializers.ones, (None,))  # small: replicated
        self.param(QUERY_WEIGHT, ones, (self.config.vocab_size,), jnp.float32)
        if self.is_initializing():
            return None
        inputs = {k: v for k, v in inputs.items() if v is not None}
        rngs = None if deterministic else {"dropout": self.make_rng("dropout")}
        return self.documents_model().apply(
            {"params": documents}, input_ids, **inputs, deterministic=deterministic, rngs=rngs
        )
