"""Model cards: the README.md a Hugging Face Hub repository shows, for every exported model.

    model_card.for_run(run_dir / "hf", model_config, head, config, run_dir)   # training.export
    python -m bert_jax.convert SRC DST --model-card --datasets wikipedia --license mit

The card starts with the Hub's metadata header (YAML between `---` lines: license, library_name,
pipeline_tag, tags, datasets, base_model, and a `model-index` holding the held-out metrics), then
says what the model is, its held-out numbers, its architecture and how it was trained. Everything
comes from the run's own records: `metrics.jsonl` (the last `final/*` metrics of a fine-tuning
run, or its `kept/*` ones where it kept an earlier model, else the last `eval/*` row of
pretraining), the experiment config, and the model's config.
The header is written as JSON scalars inside YAML, which every YAML parser reads unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from bert_jax.models.config import EncoderConfig
from bert_jax.models.families import family_of
from bert_jax.paths import as_path

CARD_NAME = "README.md"
DEFAULT_LICENSE = "apache-2.0"  # BERT's own; set config.model_card.license for your data's terms
# The Hub's pipeline tag of each head's role (the widget the Hub shows): BertForMaskedLM and
# ModernBertForMaskedLM are both "ForMaskedLM".
PIPELINE_TAGS = {
    "Model": "feature-extraction",
    "ForPreTraining": "fill-mask",
    "ForMaskedLM": "fill-mask",
    "ForNextSentencePrediction": "text-classification",
    "ForSequenceClassification": "text-classification",
    "ForMultipleChoice": "multiple-choice",
    "ForTokenClassification": "token-classification",
    "ForQuestionAnswering": "question-answering",
}


def pipeline_tag(head: str) -> str:
    """The Hub's pipeline tag of a head class of any family ("ModernBertForMaskedLM" ->
    "fill-mask"); "feature-extraction" for the encoder."""
    role = head[head.index("For") :] if "For" in head else "Model"
    return PIPELINE_TAGS.get(role, "feature-extraction")


@dataclasses.dataclass(frozen=True)
class RunRecords:
    """What a run directory records about how its model was trained.

    Attributes:
      experiment: the experiment config as a dict (`config.json` of the run), or None.
      metrics: held-out metrics of the last evaluation, {"eval/mlm_accuracy": 0.25, ...} or
        {"final/accuracy": 0.9, ...} (fine-tuning's final dev and test scores), or
        {"kept/accuracy": 0.9, ...} (those of an earlier model fine-tuning kept: the export).
      step: the training step they were measured at (None: no evaluation recorded).
    """

    experiment: dict[str, Any] | None = None
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    step: int | None = None


def read_run(run_dir: str | os.PathLike | None, experiment: Any = None) -> RunRecords:
    """The records of `run_dir` (its metrics.jsonl and config.json, or the parent's config.json
    for a fine-tuning seed directory); `experiment` (a ConfigDict or dict) takes the place of the
    config file. Missing files give empty records."""
    if experiment is not None and hasattr(experiment, "to_dict"):
        experiment = experiment.to_dict()
    if run_dir is None:
        return RunRecords(experiment)
    folder = as_path(run_dir)
    if experiment is None:
        for candidate in (folder / "config.json", folder.parent / "config.json"):
            if candidate.is_file():
                experiment = json.loads(candidate.read_text())
                break
    last_eval, final, kept, step = {}, {}, {}, None
    log = folder / "metrics.jsonl"
    for line in log.read_text().splitlines() if log.is_file() else ():
        row = json.loads(line)
        held_out = {k: v for k, v in row.items() if k.startswith(("eval/", "final/", "kept/"))}
        if any(k.startswith("kept/") for k in held_out):  # the exported model, when not the final
            kept, step = {k: v for k, v in held_out.items() if k.startswith("kept/")}, row["step"]
        elif kept:
            continue
        elif any(k.startswith("final/") for k in held_out):
            final, step = held_out, row.get("step")
        elif held_out and not final:
            last_eval, step = held_out, row.get("step")
    return RunRecords(experiment, kept or final or last_eval, step)


def _yaml(value: Any, indent: int = 0) -> list[str]:
    """YAML lines of nested dicts and lists with JSON scalars."""
    pad = " " * indent
    lines = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(v, (Mapping, list)) and v:
                lines.append(f"{pad}{k}:")
                lines += _yaml(v, indent + 2)
            else:
                lines.append(f"{pad}{k}: {json.dumps(v)}")
        return lines
    for item in value:
        sub = _yaml(item, indent + 2) if isinstance(item, (Mapping, list)) else None
        if sub:
            lines.append(f"{pad}- {sub[0].lstrip()}")
            lines += sub[1:]
        else:
            lines.append(f"{pad}- {json.dumps(item)}")
    return lines


def _get(tree: Mapping | None, dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(tree, Mapping) or key not in tree:
            return None
        tree = tree[key]
    return tree


# Experiment-config fields that say how a model was trained, in the order the card lists them.
_TRAINING_FIELDS = (
    ("job", "job"),
    ("task", "finetune.name"),
    ("started from", "init_from"),
    ("training data", "data.paths"),
    ("training steps", "num_train_steps"),
    ("epochs", "finetune.num_epochs"),
    ("seeds", "finetune.seeds"),
    ("global batch size (sequences)", "global_batch_size"),
    ("gradient accumulation (microbatches)", "num_microbatches"),
    ("max sequence length (tokens)", "data.max_seq_length"),
    ("max sequence length (tokens)", "finetune.max_seq_length"),
    ("masked LM probability", "data.masked_lm_prob"),
    ("optimizer", "optimizer.name"),
    ("peak learning rate", "optimizer.peak_learning_rate"),
    ("learning rate schedule", "optimizer.schedule"),
    ("warmup steps", "optimizer.warmup_steps"),
    ("weight decay", "optimizer.weight_decay"),
    ("compute dtype", "runtime.dtype"),
    ("seed", "seed"),
)
_ARCHITECTURE_FIELDS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "type_vocab_size",
    "hidden_act",
    "num_labels",
)


def render(
    model_config: EncoderConfig,
    head: str,
    records: RunRecords = RunRecords(),
    *,
    name: str = "",
    license: str = DEFAULT_LICENSE,  # noqa: A002 - the Hub's field name
    datasets: Sequence[str] = (),
    language: Sequence[str] = (),
    base_model: str = "",
) -> str:
    """The card's text: the metadata header, then the description, metrics, architecture and
    training sections. `name` titles it (default: the head)."""
    name = name or head
    task_name = _get(records.experiment, "finetune.name")
    header: dict[str, Any] = {"license": license, "library_name": "transformers"}
    if language:
        header["language"] = list(language)
    header["pipeline_tag"] = pipeline_tag(head)
    family = model_config.model_type
    header["tags"] = [family, "bert-jax", "jax", "flax", *([task_name] if task_name else [])]
    if datasets:
        header["datasets"] = list(datasets)
    if base_model:
        header["base_model"] = base_model
    if records.metrics:
        dataset = datasets[0] if datasets else (task_name or "held-out data")
        header["model-index"] = _model_index(name, pipeline_tag(head), dataset, records.metrics)
    lines = ["---", *_yaml(header), "---", "", f"# {name}", ""]
    lines += _description(model_config, head, records)
    return "\n".join(lines) + "\n"


def _model_index(name: str, pipeline: str, dataset: str, metrics: Mapping) -> list[dict]:
    """The header's `model-index`: the held-out metrics as the Hub reads them."""
    results = {
        "task": {"type": pipeline},
        "dataset": {"name": dataset, "type": dataset},
        "metrics": [
            {"type": key.split("/", 1)[1], "value": float(value), "name": key}
            for key, value in metrics.items()
        ],
    }
    return [{"name": name, "results": [results]}]


def _description(model_config: EncoderConfig, head: str, records: RunRecords) -> list[str]:
    """The card's body lines: what it is, its metrics, architecture and training."""
    job = _get(records.experiment, "job")
    lines = [
        f"A {model_config.display_name} model ({head}) trained with bert-jax (JAX/Flax), "
        "exported as a "
        "transformers directory: `transformers.AutoModel.from_pretrained(DIR)` or "
        f'`bert_jax.from_pretrained(DIR, head="{head}")` loads it.'
        + (f" Job: {job}." if job else "")
    ]
    if records.metrics:
        where = f" at step {records.step}" if records.step is not None else ""
        lines += ["", f"## Held-out metrics{where}", "", "| metric | value |", "| --- | --- |"]
        lines += [f"| {k} | {float(v):.4f} |" for k, v in records.metrics.items()]
    hf = model_config.to_hf_dict(head)
    lines += ["", "## Architecture", "", "| field | value |", "| --- | --- |"]
    lines += [f"| {k} | {hf[k]} |" for k in _ARCHITECTURE_FIELDS if k in hf]
    if records.experiment:
        lines += ["", "## Training", ""]
        lines += [
            f"- {label}: {value}"
            for label, key in _TRAINING_FIELDS
            if (value := _get(records.experiment, key)) not in (None, "")
        ]
        dumped = json.dumps(records.experiment, indent=2, sort_keys=True, default=str)
        lines += ["", "<details><summary>The run's full config</summary>", "", "```json"]
        lines += [dumped, "```", "", "</details>"]
    return lines


def render_sentence_transformer(
    model_config: EncoderConfig,
    body: str,
    *,
    pooling: str,
    normalize: bool,
    max_seq_length: int,
    name: str = "",
    license: str = DEFAULT_LICENSE,  # noqa: A002 - the Hub's field name
    base_model: str = "",
    inference_free: bool = False,
) -> str:
    """The card of a sentence-transformers directory: the Hub's header for an embedder
    (library_name sentence-transformers, pipeline_tag sentence-similarity; a SPLADE model's,
    `pooling="splade"`: a SparseEncoder, feature-extraction; `inference_free`: one whose queries
    are static token weights), how to load it, how it embeds, its architecture, then `body`
    (markdown: how it was trained, its scores)."""
    sparse = pooling == "splade"
    kind = "SPLADE sparse encoder" if sparse else "sentence embedder"
    kind = f"inference-free {kind}" if inference_free else kind
    name = name or f"{model_config.display_name} {kind}"
    tags = ["sparse-encoder", "splade"] if sparse else ["sentence-similarity"]
    tags += ["asymmetric", "inference-free"] if inference_free else []
    header: dict[str, Any] = {
        "license": license,
        "library_name": "sentence-transformers",
        "pipeline_tag": "feature-extraction" if sparse else "sentence-similarity",
        "tags": [
            "sentence-transformers",
            *tags,
            "feature-extraction",
            model_config.model_type,
            "bert-jax",
            "jax",
        ],
    }
    if base_model:
        header["base_model"] = base_model
    cls, flag = ("SparseEncoder", " --sparse") if sparse else ("SentenceTransformer", "")
    lines = ["---", *_yaml(header), "---", "", f"# {name}", ""]
    lines += [
        f"A {model_config.display_name} {kind} trained with bert-jax (JAX/Flax), "
        "saved as a sentence-transformers directory:",
        "",
        "```python",
        f"from sentence_transformers import {cls}",
        f'embeddings = {cls}("DIR").encode(["a sentence", "another"])',
        "```",
        "",
        f"or `python -m bert_jax.inference embed{flag} --model DIR --input texts.txt --output "
        "emb.npy` (the same embeddings).",
        "",
    ]
    lines += _embedding_items(model_config, pooling, normalize, inference_free)
    lines.append(f"- max_seq_length: {max_seq_length} tokens (longer texts are truncated)")
    hf = model_config.to_hf_dict(family_of(model_config).base_model)
    lines += ["", "## Architecture", "", "| field | value |", "| --- | --- |"]
    lines += [f"| {k} | {hf[k]} |" for k in _ARCHITECTURE_FIELDS if k in hf and k != "num_labels"]
    return "\n".join(lines) + "\n\n" + body.strip() + "\n"


def _embedding_items(
    model_config: EncoderConfig, pooling: str, normalize: bool, inference_free: bool
) -> list[str]:
    """The card's lines on what an embedding is: an inference-free model's a query's and a
    document's (`encode_query`, `encode_document`), else one."""
    item = _embedding_item(model_config, pooling, normalize)
    if not inference_free:
        return [item]
    return [
        "Queries and documents embed differently (`encode_query`, `encode_document`; "
        "`embed --task query` or `--task document`):",
        "",
        "- query: the weight of each of its tokens (a `SparseStaticEmbedding`, no model)",
        item.replace("- embedding:", "- document:"),
    ]


def _embedding_item(model_config: EncoderConfig, pooling: str, normalize: bool) -> str:
    """The card's line on what an embedding is (a SPLADE model's: a weight per vocabulary entry)."""
    if pooling == "splade":
        return (
            "- embedding: max over the tokens of log(1 + relu(masked-LM logits)), "
            f"{model_config.vocab_size} dimensions (one a vocabulary entry), mostly zero; dot "
            "product"
        )
    return (
        f"- embedding: {pooling} pooling of the last hidden states, {model_config.hidden_size} "
        f"dimensions, {'normalized to unit length' if normalize else 'not normalized'}; cosine "
        "similarity"
    )


def write(out_dir: str | os.PathLike, text: str) -> str:
    """Writes `text` as `out_dir/README.md`; returns its path."""
    path = as_path(out_dir) / CARD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return os.fspath(path)


def _names(value: Any) -> list[str]:
    """A comma-separated string (or a sequence) as a list of names."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    return [s.strip() for s in items if s.strip()]


def for_run(out_dir, model_config: EncoderConfig, head: str, config, run_dir) -> str:
    """The card of a job's export in `out_dir`, from the run directory's records and the
    experiment config's `model_card` block (license, datasets, language; defaults without it)."""
    options = config.get("model_card") or {}
    records = read_run(run_dir, config)
    text = render(
        model_config,
        head,
        records,
        name=options.get("name") or os.path.basename(os.path.normpath(os.fspath(run_dir))),
        license=options.get("license") or DEFAULT_LICENSE,
        datasets=_names(options.get("datasets")),
        language=_names(options.get("language")),
        base_model=config.get("init_from") or "",
    )
    return write(out_dir, text)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The model-card options of `python -m bert_jax.convert`."""
    group = parser.add_argument_group("model card (README.md for the Hugging Face Hub)")
    group.add_argument("--model-card", action="store_true", help="write DST/README.md")
    group.add_argument("--license", default=DEFAULT_LICENSE, help="the card's license")
    group.add_argument("--datasets", default="", help="comma-separated training datasets")
    group.add_argument("--language", default="", help="comma-separated language codes")


def write_from_flags(args: argparse.Namespace, model_config: EncoderConfig, head: str, fmt: str):
    """The card of a converted checkpoint: the records of the run it came from when SRC is a
    train.py run directory or an export inside one (`<run>/export`, `<run>/hf`)."""
    src = as_path(args.src)
    run_dir = src if fmt == "train" else src.parent
    if not (run_dir / "metrics.jsonl").is_file():
        run_dir = None
    text = render(
        model_config,
        head,
        read_run(run_dir),
        name=as_path(args.dst).name,
        license=args.license,
        datasets=_names(args.datasets),
        language=_names(args.language),
    )
    return write(args.dst, text)
