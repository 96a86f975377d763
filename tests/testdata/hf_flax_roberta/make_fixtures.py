"""Fixtures written by transformers' own Flax RoBERTa and XLM-RoBERTa classes, and the check of
what bert_jax writes.

Made with transformers 4.57.1 (the last release with Flax classes), jax/jaxlib 0.10.2 and flax
0.12.8, in a virtual environment of their own (CI has transformers 5, which has no Flax classes):

    python3.11 -m venv /tmp/tf457
    /tmp/tf457/bin/pip install jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 transformers==4.57.1
    /tmp/tf457/bin/python tests/testdata/hf_flax_roberta/make_fixtures.py generate

`generate` writes, next to this file, one tiny model per head of FlaxRoberta* and
FlaxXLMRoberta* (`<Head>/`: config.json + flax_model.msgpack from `save_pretrained`; every weight
perturbed off its initial value so that a dropped bias shows) and `<Head>/outputs.npz`: the
model's outputs on fixed inputs (`inputs`: right- and left-padded rows with <pad> ids at the
padding, so that positions count from padding_idx + 1 over the real tokens; every hidden state
and attention map, float32). The base models save their trees without the `roberta` prefix; the
heads with it.

`check DIR` loads every `DIR/<Head>` that bert_jax wrote with `Flax<Head>.from_pretrained`, fails
on any missing or unexpected weight, and compares its outputs with the fixture's:

    PYTHONPATH=. python tests/testdata/hf_flax_roberta/make_fixtures.py write /tmp/rb_flax
    /tmp/tf457/bin/python tests/testdata/hf_flax_roberta/make_fixtures.py check /tmp/rb_flax

(`write` runs with bert_jax, not transformers: it converts each fixture with
`python -m bert_jax.convert SRC DST --to hf_flax`.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TASKS = (
    "Model",
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForMultipleChoice",
    "ForTokenClassification",
    "ForQuestionAnswering",
)
HEADS = tuple(f"{model}{task}" for model in ("Roberta", "XLMRoberta") for task in TASKS)
# Odd, distinct sizes: a swapped axis cannot pass. 13 position rows hold 11 positions (rows 0
# and 1 = padding_idx are never a real token's). A few KB of weights a model.
CONFIG = dict(
    vocab_size=23,
    hidden_size=12,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=7,
    max_position_embeddings=13,
    type_vocab_size=1,
    layer_norm_eps=1e-5,
    pad_token_id=1,
    num_labels=4,
)
BATCH, CHOICES, LENGTH = 3, 2, 7


def inputs(head: str) -> dict[str, np.ndarray]:
    """Fixed int32 inputs [B, L] ([B, C, L] for multiple choice): row 0 full, row 1 right-padded,
    row 2 left-padded, <pad> (id 1) at the padding."""
    rng = np.random.default_rng(0)
    shape = (BATCH, CHOICES, LENGTH) if head.endswith("ForMultipleChoice") else (BATCH, LENGTH)
    ids = rng.integers(3, CONFIG["vocab_size"], size=shape).astype(np.int32)
    mask = np.ones(shape, np.int32)
    mask[1, ..., LENGTH - 2 :] = 0
    mask[2, ..., :3] = 0
    ids[mask == 0] = CONFIG["pad_token_id"]
    return dict(input_ids=ids, attention_mask=mask)


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


def run(model, head: str) -> dict[str, np.ndarray]:
    out = model(**inputs(head), output_hidden_states=True, output_attentions=True)
    return named_outputs(out)


def _config(head: str):
    import transformers

    cls = transformers.XLMRobertaConfig if head.startswith("XLM") else transformers.RobertaConfig
    # FlaxRobertaForQuestionAnswering splits num_labels outputs into start and end: it needs 2.
    return cls(**{**CONFIG, "num_labels": 2 if head.endswith("QuestionAnswering") else 4})


def generate(out_dir: str) -> None:
    import jax
    import transformers

    for i, head in enumerate(HEADS):
        model = getattr(transformers, f"Flax{head}")(_config(head), seed=i)
        leaves, tree = jax.tree_util.tree_flatten(model.params)
        rng = np.random.default_rng(100 + i)
        model.params = jax.tree_util.tree_unflatten(
            tree, [x + rng.normal(0, 0.05, x.shape).astype(x.dtype) for x in leaves]
        )
        folder = os.path.join(out_dir, head)
        model.save_pretrained(folder)
        np.savez(os.path.join(folder, "outputs.npz"), **run(model, head))
        print(head, sorted(os.listdir(folder)))


def write(out_dir: str) -> None:
    """bert_jax side: every fixture converted with bert_jax's command line to `out_dir`."""
    for head in HEADS:
        subprocess.run(
            [sys.executable, "-m", "bert_jax.convert", os.path.join(HERE, head),
             os.path.join(out_dir, head), "--to", "hf_flax", "--overwrite"],
            check=True,
        )  # fmt: skip


def check(out_dir: str) -> int:
    """Loads what bert_jax wrote with transformers' Flax classes; 0 when every model matches."""
    import logging

    import jax
    import transformers

    failures = 0
    for head in sorted(h for h in os.listdir(out_dir) if h in HEADS):
        cls = getattr(transformers, f"Flax{head}")
        warnings = []
        handler = logging.Handler()
        handler.emit = lambda record, out=warnings: out.append(record.getMessage())
        logger = logging.getLogger("transformers.modeling_flax_utils")
        logger.addHandler(handler)
        try:
            model = cls.from_pretrained(os.path.join(out_dir, head))
        finally:
            logger.removeHandler(handler)
        fresh = cls(model.config, _do_init=True)
        keys = lambda p: {
            jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(p)
        }  # noqa: E731
        same_keys = keys(model.params) == keys(fresh.params)
        bad_log = [w for w in warnings if "not initialized" in w or "not used" in w]
        ours = run(model, head)
        ref = dict(np.load(os.path.join(HERE, head, "outputs.npz")))
        worst = max(float(np.max(np.abs(ours[k] - ref[k]))) for k in ref)
        ok = same_keys and not bad_log and set(ours) == set(ref) and worst <= 1e-5
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {head}: max |diff| {worst:.2e} over {len(ref)} outputs; "
              f"keys {'match' if same_keys else 'DIFFER'}; {bad_log or 'no load warnings'}")  # fmt: skip
    print(f"transformers {transformers.__version__}: {failures} failure(s)")
    return int(failures > 0)


if __name__ == "__main__":
    command, folder = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else HERE)
    if command == "generate":
        generate(folder)
    elif command == "write":
        write(folder)
    elif command == "check":
        sys.exit(check(folder))
    else:
        sys.exit(f"usage: {sys.argv[0]} generate [DIR] | write DIR | check DIR")
