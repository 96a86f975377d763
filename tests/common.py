"""Shared tiny configurations, with odd distinct sizes so that a swapped axis cannot pass, and a
recorder of the programs JAX compiles."""

import contextlib
import importlib.util
import logging
import pathlib

import numpy as np

from bert_jax.models.bert.config import BertConfig
from bert_jax.models.modernbert.config import ModernBertConfig

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
# Overrides of configs/pretrain.py:size=tiny for `train.py --mode=compile` tests: a small model
# and batch, since the compile is what they test, not its size.
COMPILE_SMALL = [
    "--config.model.vocab_size=400",
    "--config.model.hidden_size=32",
    "--config.model.num_attention_heads=4",
    "--config.model.intermediate_size=37",
    "--config.model.max_position_embeddings=32",
    "--config.data.max_seq_length=32",
    "--config.data.max_predictions_per_seq=5",
    "--config.global_batch_size=16",
]


def load_config_file(name: str):
    """The module of `configs/<name>` (e.g. "pretrain.py"), imported from its file."""
    spec = importlib.util.spec_from_file_location(name[:-3], CONFIGS / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TINY = BertConfig(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    type_vocab_size=3,
    num_labels=5,
)

# The odd configuration of the conversion tests.
ODD = BertConfig(
    vocab_size=1001,
    hidden_size=96,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=200,
    type_vocab_size=3,
    hidden_act="gelu_new",
    max_position_embeddings=40,
    num_labels=3,
)


# The odd ModernBERT configuration: 3 layers with a global layer every 2 (not a multiple), a local
# window of 2 keys a side (shorter than the test rows), and every bias on (the released models
# have none, which would hide a swapped or missing one).
MODERN = ModernBertConfig(
    vocab_size=99,
    hidden_size=32,
    intermediate_size=37,
    num_hidden_layers=3,
    num_attention_heads=4,
    pad_token_id=0,
    global_attn_every_n_layers=2,
    local_attention=4,
    global_rope_theta=1000.0,
    local_rope_theta=77.0,
    norm_bias=True,
    attention_bias=True,
    mlp_bias=True,
    classifier_bias=True,
    num_labels=3,
)


def random_batch(cfg: BertConfig, batch: int = 3, length: int = 7, seed: int = 0):
    """input_ids, token_type_ids and an attention_mask with some padded rows, as int32 numpy."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, cfg.vocab_size, size=(batch, length)).astype(np.int32)
    types = rng.integers(0, cfg.type_vocab_size, size=(batch, length)).astype(np.int32)
    mask = np.ones((batch, length), np.int32)
    for b in range(1, batch):
        mask[b, length - b :] = 0
    ids[mask == 0] = cfg.pad_token_id
    return dict(input_ids=ids, token_type_ids=types, attention_mask=mask)


@contextlib.contextmanager
def recorded_compiles():
    """Collects (function name, argument shapes and dtypes, argument shardings) for every program
    JAX lowers inside the block.

    JAX logs each lowering (with `jax.log_compiles`) before it consults its persistent cache, so a
    program loaded from disk is counted as well: a repeated entry is a recompile.
    """
    import jax

    logger = logging.getLogger("jax._src.interpreters.pxla")
    compiles: list[tuple[str, str, str]] = []

    class Collect(logging.Handler):
        def emit(self, record):
            if record.msg.startswith("Compiling %s with global shapes and types"):
                name, avals, shardings = record.args[:3]
                compiles.append((str(name), str(avals), str(shardings)))

    handler, level = Collect(level=logging.WARNING), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        with jax.log_compiles(True):
            yield compiles
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def pyproject_table(name: str) -> dict[str, str]:
    """The `key = value` lines of pyproject.toml's `[name]` table, as text (read by line: no
    tomllib on Python 3.10), e.g. "project.scripts" -> {"bert-jax-convert": "bert_jax.convert:main"}."""
    table, inside = {}, False
    for line in open(CONFIGS.parent / "pyproject.toml", encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if line.startswith("["):
            inside = line == f"[{name}]"
        elif inside and "=" in line:
            key, value = (part.strip().strip('"') for part in line.split("=", 1))
            table[key] = value
    return table
