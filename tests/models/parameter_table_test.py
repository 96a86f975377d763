"""The parameter table, frozen: every row `parameter_table` gives for every head of every family,
small odd configs (vocab 99, hidden 32, 4 heads, intermediate 37, 2 layers, 64 positions; the
BERT config also with `vocab_pad_multiple=8`), and for the families that scan their layers the
stacked tree's paths and shapes (`load_pytorch(..., scan_layers=True)`'s layout).

The golden file tests/testdata/parameter_table.json was written by this test from the table as it
stood before the checkpoint formats were split into modules. Regenerate it (only for an intended
change of the on-disk names or layouts, which every saved checkpoint would feel) with

    PYTHONPATH=. python tests/models/parameter_table_test.py --regen
"""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
from flax import traverse_util

from bert_jax.checkpoints import table
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.deberta_v2.config import DebertaV2Config
from bert_jax.models.electra.config import ElectraConfig
from bert_jax.models.eurobert.config import EuroBertConfig
from bert_jax.models.families import FAMILIES
from bert_jax.models.gte.config import GteConfig
from bert_jax.models.jina_embeddings_v3.config import JinaEmbeddingsV3Config
from bert_jax.models.modernbert.config import ModernBertConfig
from bert_jax.models.mpnet.config import MPNetConfig
from bert_jax.models.nomic_bert.config import NomicBertConfig
from bert_jax.models.params import stack_layers
from bert_jax.models.roberta.config import RobertaConfig, XLMRobertaConfig

GOLDEN = pathlib.Path(__file__).parents[1] / "testdata" / "parameter_table.json"
_SIZES = dict(
    vocab_size=99,
    hidden_size=32,
    num_attention_heads=4,
    intermediate_size=37,
    num_hidden_layers=2,
    max_position_embeddings=64,
)
CONFIGS = {
    "bert": BertConfig(**_SIZES, num_labels=3),
    "bert_padded": BertConfig(**_SIZES, num_labels=3, vocab_pad_multiple=8),
    "modernbert": ModernBertConfig(**_SIZES, num_labels=3, pad_token_id=0, local_attention=16),
    "roberta": RobertaConfig(**_SIZES, num_labels=3, type_vocab_size=1),
    "xlm-roberta": XLMRobertaConfig(**_SIZES, num_labels=3, type_vocab_size=1),
    "electra": ElectraConfig(**_SIZES, num_labels=3, embedding_size=24),
    "deberta-v2": DebertaV2Config(**_SIZES, num_labels=3, position_buckets=8),
    "mpnet": MPNetConfig(**_SIZES, num_labels=3),
    "nomic_bert": NomicBertConfig(**_SIZES, num_labels=3, type_vocab_size=3),
    "gte": GteConfig(**_SIZES, num_labels=3, type_vocab_size=2),
    "eurobert": EuroBertConfig(**_SIZES, num_labels=3, pad_token_id=0, num_key_value_heads=2),
    "jina_embeddings_v3": JinaEmbeddingsV3Config(**_SIZES, num_labels=3, type_vocab_size=2),
}
# the families whose layers `scan_layers` stacks
SCANNED = {t for t, f in FAMILIES.items() if f.scanned_layer is not None}


def _family(name: str) -> str:
    return name.removesuffix("_padded")


def _stacked(rules) -> list[list]:
    """[path, shape] of the stacked tree built from the table's shapes."""
    flat = {r.flax_key: np.zeros(r.shape, np.int8) for r in rules}
    tree = stack_layers(traverse_util.unflatten_dict(flat, sep="/"))
    return sorted([k, list(v.shape)] for k, v in traverse_util.flatten_dict(tree, sep="/").items())


def current_table() -> dict:
    """{config name: {head: {"rows": [...], "stacked": [...]}}} as the code gives it now."""
    out = {}
    for name, config in CONFIGS.items():
        heads = {}
        for head in FAMILIES[_family(name)].model_classes:
            rules = table.parameter_table(config, head)
            row = {
                "rows": sorted(
                    [
                        r.flax_key,
                        list(r.shape),
                        r.hf_key,
                        r.tf_key,
                        r.kind,
                        r.vocab_rows,
                        r.n_in,
                    ]
                    for r in rules
                )
            }
            if _family(name) in SCANNED:
                row["stacked"] = _stacked(rules)
            heads[head] = row
        out[name] = heads
    return out


def _dump(table_: dict) -> str:
    """The JSON text, one table row (or stacked path) a line."""
    lines = ["{"]
    for i, (name, heads) in enumerate(sorted(table_.items())):
        lines.append(f" {json.dumps(name)}: {{")
        for j, (head, row) in enumerate(sorted(heads.items())):
            lines.append(f"  {json.dumps(head)}: {{")
            for k, (part, items) in enumerate(sorted(row.items())):
                lines.append(f"   {json.dumps(part)}: [")
                lines += [f"    {json.dumps(x)}," for x in items[:-1]]
                lines += [
                    f"    {json.dumps(items[-1])}",
                    "   ]" + ("," if k < len(row) - 1 else ""),
                ]
            lines.append("  }" + ("," if j < len(heads) - 1 else ""))
        lines.append(" }" + ("," if i < len(table_) - 1 else ""))
    return "\n".join([*lines, "}", ""])


def test_parameter_table_is_unchanged():
    assert GOLDEN.exists(), f"{GOLDEN} is missing; see this module's docstring"
    assert _dump(current_table()) == GOLDEN.read_text(), (
        "the parameter table changed (Hugging Face / TF names, shapes or layouts); every saved "
        "checkpoint depends on it"
    )


def test_every_head_of_every_family_is_covered():
    golden = json.loads(GOLDEN.read_text())
    for family in FAMILIES.values():
        assert set(golden[family.model_type]) == set(family.model_classes)


if __name__ == "__main__":
    if sys.argv[1:] == ["--regen"]:
        GOLDEN.write_text(_dump(current_table()))
        print(f"wrote {GOLDEN}")
