"""Fixtures written by transformers' own Flax classes (BERT's in hf_flax/, RoBERTa's and
XLM-RoBERTa's in hf_flax_roberta/), and the check of what bert_jax writes.

Made with transformers 4.57.1 (the last release with Flax classes), jax/jaxlib 0.10.2 and flax
0.12.8, in a virtual environment of their own (CI has transformers 5, which has no Flax classes):

    python3.11 -m venv /tmp/venv-tf457
    /tmp/venv-tf457/bin/pip install jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 transformers==4.57.1
    /tmp/venv-tf457/bin/python tests/testdata/make_hf_flax_fixtures.py bert generate
    /tmp/venv-tf457/bin/python tests/testdata/make_hf_flax_fixtures.py roberta generate

`generate` writes, into the family's folder, one tiny model per head (`<Head>/`: config.json +
flax_model.msgpack from `save_pretrained`; every weight perturbed off its initial value so that a
dropped bias shows) and `<Head>/outputs.npz`: the model's outputs on fixed inputs (`inputs`;
every hidden state and attention map, float32). BERT's also `BertForPreTraining_sharded/` (saved
with a small `max_shard_size`: shards + flax_model.msgpack.index.json). RoBERTa's inputs have
right- and left-padded rows with <pad> ids at the padding, so that positions count from
padding_idx + 1 over the real tokens. The base models save their trees without the `bert` /
`roberta` prefix; the heads with it.

`check DIR` loads every `DIR/<Head>*` that bert_jax wrote with `Flax<Head>.from_pretrained`,
fails on any missing or unexpected weight, and compares its outputs with the fixture's:

    PYTHONPATH=. python tests/testdata/make_hf_flax_fixtures.py bert write /tmp/bert_jax_flax
    /tmp/venv-tf457/bin/python tests/testdata/make_hf_flax_fixtures.py bert check /tmp/bert_jax_flax

(`write` runs with bert_jax, not transformers: it converts each fixture with
`python -m bert_jax.convert SRC DST --to hf_flax`, BERT's once sharded.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH, CHOICES, LENGTH = 3, 2, 7
# Odd, distinct sizes: a swapped axis cannot pass. A few KB of weights a model.
_SIZES = dict(
    vocab_size=23,
    hidden_size=12,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=7,
    max_position_embeddings=13,
)


def _shape(head: str) -> tuple[int, ...]:
    return (BATCH, CHOICES, LENGTH) if head.endswith("ForMultipleChoice") else (BATCH, LENGTH)


def _bert_inputs(head: str) -> dict[str, np.ndarray]:
    """Fixed int32 inputs: [B, L] ([B, C, L] for multiple choice), later rows padded."""
    config = FAMILIES["bert"].config
    rng = np.random.default_rng(0)
    shape = _shape(head)
    ids = rng.integers(1, config["vocab_size"], size=shape).astype(np.int32)
    types = rng.integers(0, config["type_vocab_size"], size=shape).astype(np.int32)
    mask = np.ones(shape, np.int32)
    for b in range(1, BATCH):
        mask[b, ..., LENGTH - 2 * b :] = 0
    return dict(input_ids=ids, token_type_ids=types, attention_mask=mask)


def _roberta_inputs(head: str) -> dict[str, np.ndarray]:
    """Fixed int32 inputs [B, L] ([B, C, L] for multiple choice): row 0 full, row 1 right-padded,
    row 2 left-padded, <pad> (id 1) at the padding."""
    config = FAMILIES["roberta"].config
    rng = np.random.default_rng(0)
    ids = rng.integers(3, config["vocab_size"], size=_shape(head)).astype(np.int32)
    mask = np.ones(ids.shape, np.int32)
    mask[1, ..., LENGTH - 2 :] = 0
    mask[2, ..., :3] = 0
    ids[mask == 0] = config["pad_token_id"]
    return dict(input_ids=ids, attention_mask=mask)


class Fixtures(NamedTuple):
    """One family's fixtures: its folder beside this file, heads (transformers' class names less
    `Flax`), config (transformers' config fields), inputs(head), and the head also saved sharded
    (as `<head>_sharded`), if any."""

    folder: str
    heads: tuple[str, ...]
    config: dict[str, Any]
    inputs: Callable[[str], dict[str, np.ndarray]]
    sharded: str | None = None

    @property
    def here(self) -> str:
        return os.path.join(HERE, self.folder)

    @property
    def names(self) -> tuple[str, ...]:
        """The fixture directories: one per head, then the sharded one."""
        return (*self.heads, *([self.sharded] if self.sharded else []))

    @staticmethod
    def head_of(name: str) -> str:
        """The head class of a fixture directory's name ("BertForPreTraining_sharded" -> ...)."""
        return name.split("_")[0]


_BERT = ("Model", "ForPreTraining", "ForMaskedLM", "ForNextSentencePrediction")
_TASKS = ("ForSequenceClassification", "ForMultipleChoice", "ForTokenClassification",
          "ForQuestionAnswering")  # fmt: skip
FAMILIES = {
    "bert": Fixtures(
        "hf_flax",
        tuple(f"Bert{t}" for t in (*_BERT, *_TASKS)),
        dict(**_SIZES, type_vocab_size=3, num_labels=4),
        _bert_inputs,
        sharded="BertForPreTraining_sharded",
    ),
    "roberta": Fixtures(
        "hf_flax_roberta",
        tuple(
            f"{m}{t}" for m in ("Roberta", "XLMRoberta") for t in ("Model", "ForMaskedLM", *_TASKS)
        ),
        # 13 position rows hold 11 positions (rows 0 and 1 = padding_idx are never a real token's).
        dict(**_SIZES, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1, num_labels=4),
        _roberta_inputs,
    ),
}


def named_outputs(out) -> dict[str, np.ndarray]:
    """A transformers output as {name: float32 array}, tuples as name[i] (bert_jax's naming)."""
    named = {}
    for key, value in out.items():
        if isinstance(value, (tuple, list)):
            for i, v in enumerate(value):
                named[f"{key}[{i}]"] = np.asarray(v, np.float32)
        elif value is not None:
            named[key] = np.asarray(value, np.float32)
    return named


def run(model, fixtures: Fixtures, head: str) -> dict[str, np.ndarray]:
    out = model(**fixtures.inputs(head), output_hidden_states=True, output_attentions=True)
    return named_outputs(out)


def generate(fixtures: Fixtures, out_dir: str) -> None:
    import jax
    import transformers

    for i, name in enumerate(fixtures.names):
        head = fixtures.head_of(name)
        # FlaxXForQuestionAnswering splits num_labels outputs into start and end: it needs 2.
        labels = 2 if head.endswith("ForQuestionAnswering") else fixtures.config["num_labels"]
        model_name = re.fullmatch(r"(\w+?)(Model|For\w+)", head).group(1)  # XLMRoberta
        config = getattr(transformers, f"{model_name}Config")(
            **{**fixtures.config, "num_labels": labels}
        )
        model = getattr(transformers, f"Flax{head}")(config, seed=i)
        leaves, tree = jax.tree_util.tree_flatten(model.params)
        rng = np.random.default_rng(100 + i)
        model.params = jax.tree_util.tree_unflatten(
            tree, [x + rng.normal(0, 0.05, x.shape).astype(x.dtype) for x in leaves]
        )
        folder = os.path.join(out_dir, name)
        # "10GB" is save_pretrained's default: one flax_model.msgpack.
        model.save_pretrained(folder, max_shard_size="8KB" if name == fixtures.sharded else "10GB")
        np.savez(os.path.join(folder, "outputs.npz"), **run(model, fixtures, head))
        print(name, sorted(os.listdir(folder)))


def write(fixtures: Fixtures, out_dir: str) -> None:
    """bert_jax side: every fixture converted with bert_jax's command line to `out_dir`."""
    for name in fixtures.names:
        extra = ["--max-shard-size", "8KB"] if name == fixtures.sharded else []
        subprocess.run(
            [sys.executable, "-m", "bert_jax.convert", os.path.join(fixtures.here, name),
             os.path.join(out_dir, name), "--to", "hf_flax", "--overwrite", *extra],
            check=True,
        )  # fmt: skip


def check(fixtures: Fixtures, out_dir: str) -> int:
    """Loads what bert_jax wrote with transformers' Flax classes; 0 when every model matches."""
    import logging

    import jax
    import transformers

    failures = 0
    for name in sorted(n for n in os.listdir(out_dir) if n in fixtures.names):
        head = fixtures.head_of(name)
        cls = getattr(transformers, f"Flax{head}")
        warnings = []
        handler = logging.Handler()
        handler.emit = lambda record, out=warnings: out.append(record.getMessage())
        logger = logging.getLogger("transformers.modeling_flax_utils")
        logger.addHandler(handler)
        try:
            model = cls.from_pretrained(os.path.join(out_dir, name))
        finally:
            logger.removeHandler(handler)
        fresh = cls(model.config, _do_init=True)
        keys = lambda p: {
            jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(p)
        }  # noqa: E731
        same_keys = keys(model.params) == keys(fresh.params)
        bad_log = [w for w in warnings if "not initialized" in w or "not used" in w]
        ours = run(model, fixtures, head)
        ref = dict(np.load(os.path.join(fixtures.here, name, "outputs.npz")))
        worst = max(float(np.max(np.abs(ours[k] - ref[k]))) for k in ref)
        ok = same_keys and not bad_log and set(ours) == set(ref) and worst <= 1e-5
        failures += not ok
        files = sorted(os.listdir(os.path.join(out_dir, name)))
        print(f"{'ok  ' if ok else 'FAIL'} {name}: max |diff| {worst:.2e} over {len(ref)} outputs; "
              f"keys {'match' if same_keys else 'DIFFER'}; {bad_log or 'no load warnings'}; {files}")  # fmt: skip
    print(f"transformers {transformers.__version__}: {failures} failure(s)")
    return int(failures > 0)


if __name__ == "__main__":
    usage = f"usage: {sys.argv[0]} {{{','.join(FAMILIES)}}} generate [DIR] | write DIR | check DIR"
    if len(sys.argv) < 3 or sys.argv[1] not in FAMILIES:
        sys.exit(usage)
    fixtures, command = FAMILIES[sys.argv[1]], sys.argv[2]
    folder = sys.argv[3] if len(sys.argv) > 3 else fixtures.here
    if command == "generate":
        generate(fixtures, folder)
    elif command == "write":
        write(fixtures, folder)
    elif command == "check":
        sys.exit(check(fixtures, folder))
    else:
        sys.exit(usage)
