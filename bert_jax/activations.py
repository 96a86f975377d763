"""What a layer computes and what it keeps, by the names configs use: the activation functions
(`BertConfig.hidden_act`, Hugging Face's names) and the remat policies
(`RuntimeConfig.remat_policy`: which activations a layer keeps for the backward pass).

The one declaration of both: `bert_jax.models.config` validates names against these tables' keys and
the family model modules (`bert_jax.models.<family>.model`) look the functions up in them.
"""

from __future__ import annotations

import functools

import jax

# hidden_act -> the elementwise function (x [...] -> [...]). "gelu" is the exact (erf) GELU, as in
# transformers and google-research/bert's 2018 release; "gelu_new" / "gelu_pytorch_tanh" the tanh
# approximation, which google-research/bert's code calls "gelu" since February 2019 (a TF
# checkpoint's bert_config.json cannot tell them apart: docs/conversion.md).
ACTIVATIONS = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
}


def kept_input_only(fn, *, scanned: bool):
    """`fn` (elementwise) whose backward pass keeps only its input and recomputes the rest.

    Autodiff of the exact GELU keeps, beside its input, the intermediate products of its
    derivative ([B, L, F] each: on BERT-large 128 x 128 in bfloat16, two 3 GiB stacks that
    PyTorch does not keep); recomputing them from the input is the same arithmetic, so values and
    gradients are unchanged. `scanned`: inside `nn.scan`, where XLA cannot merge the recomputation
    back into the forward pass and no barrier is needed (`jax.checkpoint`'s prevent_cse).
    """
    return jax.checkpoint(fn, prevent_cse=not scanned)


# remat_policy -> the `jax.checkpoint` policy of each layer (None: no remat, everything is kept).
REMAT_POLICIES = {
    "none": None,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    "full": jax.checkpoint_policies.nothing_saveable,
}
