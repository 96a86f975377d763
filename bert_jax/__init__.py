"""bert_jax: BERT-style encoders in JAX/Flax, exact to transformers (every registered family).

import bert_jax
model, params, config, tokenizer, head = bert_jax.from_pretrained(hf_dir, "BertForPreTraining")
out = model.apply({"params": params}, input_ids)
config, params = bert_jax.convert.load_pytorch(hf_dir, model="RobertaForMaskedLM")
out = bert_jax.RobertaForMaskedLM(config).apply({"params": params}, input_ids)

Every registered family's config class (`BertConfig`, `ModernBertConfig`, `RobertaConfig`,
`XLMRobertaConfig`, ...) and model classes (`BertModel`, `ModernBertForMaskedLM`,
`XLMRobertaForSequenceClassification`, ...) are attributes of this package, taken from the
registry (`bert_jax.models.families`): a family added there is exported with no edit here.

What importing it sets, and nothing else (tests/xla_flags_test.py checks it):
- the environment variables `XLA_FLAGS` and `LIBTPU_INIT_ARGS`, adding the project's flags for
  this machine (`xla_flags.apply`; none where none is measured, none with
  `BERT_JAX_XLA_FLAGS=0`, never one the user named);
- JAX's `jax_platforms` option, only where libtpu is installed, no TPU chip is attached and
  neither `JAX_PLATFORMS` nor the option is set: to the GPU and CPU, or the CPU alone, so that
  JAX does not start libtpu without a chip (`parallel.aot.skip_absent_tpu_backend`).
"""

# xla_flags first, before anything can start a JAX backend: importing it sets the project's XLA
# flags (bert_jax/xla_flags.py).
from bert_jax import losses, xla_flags  # noqa: F401
from bert_jax.models import families
from bert_jax.models.bert.config import PRESETS
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.families import get_model_class
from bert_jax.models.params import count_params, init_params
from bert_jax.parallel import aot

__version__ = "0.1.0"

# With libtpu installed and no TPU chip, JAX's platform search would start libtpu and print its
# errors about TPU metadata before falling back: every command and `import bert_jax` skip it.
aot.skip_absent_tpu_backend()

# The registry's classes by name: each family's config class, then its encoder and heads. Names
# are derived, not listed, so that the registry is the one list of what a family exports (static
# analysis finds them under bert_jax.models.<family>).
_REGISTERED = {
    **{f.config_class.__name__: f.config_class for f in families.FAMILIES.values()},
    **families.MODEL_CLASSES,
}
globals().update(_REGISTERED)


# Imported on first use: importing `convert` here
# would put it in sys.modules before `python -m bert_jax.convert` runs it (runpy's RuntimeWarning).
_LAZY = {
    "convert": None,
    "Pretrained": "checkpoints.pretrained",
    "from_pretrained": "checkpoints.pretrained",
}


def __getattr__(name: str):
    """`bert_jax.convert`, `bert_jax.from_pretrained` and `bert_jax.Pretrained`, on first use."""
    if name in _LAZY:
        import importlib

        module = importlib.import_module(f"bert_jax.{_LAZY[name] or name}")
        return module if _LAZY[name] is None else getattr(module, name)
    raise AttributeError(f"module 'bert_jax' has no attribute {name!r}")


__all__ = [
    "PRESETS",
    "Pretrained",
    "RuntimeConfig",
    "convert",
    "count_params",
    "from_pretrained",
    "get_model_class",
    "init_params",
    "losses",
    *sorted(_REGISTERED),
]
