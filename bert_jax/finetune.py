"""Fine-tuning runs: task data -> model from a checkpoint -> training per seed -> metrics,
prediction files and an exported model.

Task families (the head and loss follow from the task):

    classification / regression   GLUE, custom CSV/TSV/JSONL, the Shakespeare genre task
    question_answering            SQuAD v1.1 / v2.0 (windows; official EM/F1)
    token_classification          CoNLL-2003 NER (entity-level F1)
    multiple_choice               SWAG

For each seed in `finetune.seeds` the run trains `num_epochs` epochs in `<workdir>/seed_<s>`,
evaluates on the dev set after every epoch, writes the dev (and test) predictions in the task's
official format, and exports the fine-tuned model (bert_jax format and a transformers directory).
`<workdir>/results.json` holds every seed's final dev metrics (and `test_<metric>` where the test
set is labelled) and their mean and std.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax import convert, metrics, sharding, trainer
from bert_jax.config import BertConfig
from bert_jax.data import batching, glue, ner, shakespeare, squad, swag, tokenization
from bert_jax.model import get_model_class, init_params
from bert_jax.writers import MetricWriter

HEADS = {
    "classification": "BertForSequenceClassification",
    "regression": "BertForSequenceClassification",
    "token_classification": "BertForTokenClassification",
    "question_answering": "BertForQuestionAnswering",
    "multiple_choice": "BertForMultipleChoice",
}
_FILES = {  # standard file names per task: (train, dev, test)
    "squad1": ("train-v1.1.json", "dev-v1.1.json", ""),
    "squad2": ("train-v2.0.json", "dev-v2.0.json", ""),
    "conll2003": ("train.txt", "valid.txt", "test.txt"),
    "swag": ("train.csv", "val.csv", "test.csv"),
    "custom": ("train.csv", "dev.csv", "test.csv"),
}


@dataclasses.dataclass
class EvalSet:
    """A split to evaluate: its features, examples and the host-side metadata to decode them."""

    name: str
    features: dict[str, np.ndarray]
    examples: list
    labelled: bool
    extra: Any = None  # SQuAD windows, NER rows


@dataclasses.dataclass
class TaskData:
    kind: str  # a train_lib task name
    num_labels: int
    label_names: tuple[str, ...] | None
    train: dict[str, np.ndarray]
    evals: list[EvalSet]
    glue_task: Any = None
    metric_names: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------
def find_tokenizer(config) -> tokenization.WordPieceTokenizer:
    """config.finetune.tokenizer, else the vocabulary beside init_from (or in its hf/, data/)."""
    if config.finetune.tokenizer:
        return tokenization.load_tokenizer(config.finetune.tokenizer)
    base = config.init_from
    if not base:
        raise ValueError("set config.finetune.tokenizer (no init_from to take the vocabulary from)")
    for folder in (base, os.path.join(base, "hf"), os.path.join(base, "data")):
        for name in ("tokenizer.json", "vocab.txt"):
            if os.path.isfile(os.path.join(folder, name)):
                return tokenization.load_tokenizer(os.path.join(folder, name))
    raise FileNotFoundError(
        f"no tokenizer.json or vocab.txt in {base} (or its hf/, data/); "
        "set config.finetune.tokenizer"
    )


def _file(ft, which: int) -> str:
    explicit = (ft.train_file, ft.dev_file, ft.test_file)[which]
    if explicit:
        return explicit
    name = _FILES.get(ft.name, ("", "", ""))[which]
    return os.path.join(ft.data_dir, name) if name and ft.data_dir else ""


def _has_column(path: str, column: str) -> bool:
    """Whether a CSV/TSV header (or the first JSONL record) has `column` (test files may not)."""
    with glue.open_text(path) as f:
        first = f.readline()
    if path.endswith((".jsonl", ".ndjson", ".json")):
        return column in json.loads(first or "{}")
    sep = "\t" if path.endswith(".tsv") else ","
    return column in next(csv.reader([first], delimiter=sep), [])


def _subsample(examples: list, limit: int, seed: int) -> list:
    if not limit or len(examples) <= limit:
        return examples
    keep = np.sort(np.random.default_rng(seed).choice(len(examples), limit, replace=False))
    logging.info("using %d of %d examples", limit, len(examples))
    return [examples[i] for i in keep]


def _sequence_task(ft, tokenizer) -> TaskData:
    if ft.name == "shakespeare":
        splits = shakespeare.load_splits()
        task = shakespeare.TASK
    elif ft.name == "custom":
        columns = tuple(c.strip() for c in ft.text_columns.split(",") if c.strip())
        train_path = _file(ft, 0)
        if not train_path:
            raise ValueError("task=custom needs config.finetune.train_file (or data_dir/train.csv)")
        labels = None if ft.regression else glue.collect_label_names(train_path, ft.label_column)
        task = glue.custom_task(
            "custom",
            columns,
            label_column=ft.label_column,
            label_names=labels,
            regression=ft.regression,
        )
        splits = {"train": glue.read_records(train_path, task)}
        for i, split in ((1, "dev"), (2, "test")):
            path = _file(ft, i)
            if path and os.path.exists(path):
                labelled = _has_column(path, ft.label_column)
                splits[split] = glue.read_records(path, task, labelled=labelled)
    else:
        task = glue.get_task(ft.name)
        splits = {}
        for split in ("train", "dev", "test"):
            if ft.source == "tfds":
                splits[split] = glue.read_glue_tfds(task, split, data_dir=ft.tfds_data_dir or None)
            else:
                path = glue.glue_file(task, ft.data_dir, split)
                if split == "train" or os.path.exists(path):
                    splits[split] = glue.read_glue(task, ft.data_dir, split)
    train = _subsample(splits["train"], ft.max_train_examples, 0)
    features, stats = glue.featurize(train, tokenizer, task, ft.max_seq_length)
    stats.log()
    evals = []
    for split in ("dev", "test"):
        if split in splits and splits[split]:
            examples = _subsample(splits[split], ft.max_eval_examples, 1)
            f, s = glue.featurize(examples, tokenizer, task, ft.max_seq_length)
            s.log()
            labelled = all(e.label is not None for e in examples)
            evals.append(EvalSet(split, f, examples, labelled))
    kind = "regression" if task.is_regression else "classification"
    labels = None if task.is_regression else tuple(task.label_names)
    return TaskData(
        kind,
        1 if task.is_regression else task.num_labels,
        labels,
        features,
        evals,
        glue_task=task,
        metric_names=tuple(task.metrics),
    )


def _squad_task(ft, tokenizer) -> TaskData:
    version2 = ft.name == "squad2"
    windows_args = dict(
        max_seq_length=ft.max_seq_length,
        doc_stride=ft.doc_stride,
        max_query_length=ft.max_query_length,
    )

    def read(which, split):
        if ft.source == "tfds":
            name = "squad/v2.0" if version2 else "squad/v1.1"
            return squad.read_squad_tfds(name, split, data_dir=ft.tfds_data_dir or None)
        path = _file(ft, which)
        if not path:
            raise ValueError(f"{ft.name} needs config.finetune.data_dir (or train_file/dev_file)")
        return squad.read_squad(path)

    train = _subsample(read(0, "train"), ft.max_train_examples, 0)
    features, _, stats = squad.featurize(train, tokenizer, **windows_args)
    logging.info("SQuAD train: %s", stats)
    dev = _subsample(read(1, "validation"), ft.max_eval_examples, 1)
    f, windows, s = squad.featurize(dev, tokenizer, **windows_args)
    logging.info("SQuAD dev: %s", s)
    return TaskData(
        "question_answering", 2, None, features, [EvalSet("dev", f, dev, True, windows)]
    )


def _ner_task(ft, tokenizer) -> TaskData:
    def read(which, split):
        if ft.source == "tfds":
            return ner.read_conll_tfds(split, data_dir=ft.tfds_data_dir or None)
        path = _file(ft, which)
        return ner.read_conll(path) if path and os.path.exists(path) else None

    train = read(0, "train")
    if train is None:
        raise ValueError("conll2003 needs config.finetune.data_dir (train.txt) or train_file")
    train = _subsample(train, ft.max_train_examples, 0)
    labels = ner.collect_labels(train)
    features, _, stats = ner.featurize(train, tokenizer, labels, ft.max_seq_length)
    logging.info("NER train: %s", stats)
    evals = []
    for which, split in ((1, "validation"), (2, "test")):
        examples = read(which, split)
        if examples:
            examples = _subsample(examples, ft.max_eval_examples, 1)
            f, rows, _ = ner.featurize(examples, tokenizer, labels, ft.max_seq_length)
            evals.append(EvalSet("dev" if which == 1 else "test", f, examples, True, rows))
    return TaskData("token_classification", len(labels), tuple(labels), features, evals)


def _swag_task(ft, tokenizer) -> TaskData:
    train = _subsample(swag.read_swag(_file(ft, 0)), ft.max_train_examples, 0)
    features, _ = swag.featurize(train, tokenizer, ft.max_seq_length)
    evals = []
    for which, split in ((1, "dev"), (2, "test")):
        path = _file(ft, which)
        if path and os.path.exists(path):
            examples = _subsample(swag.read_swag(path), ft.max_eval_examples, 1)
            f, _ = swag.featurize(examples, tokenizer, ft.max_seq_length)
            evals.append(EvalSet(split, f, examples, all(e.label is not None for e in examples)))
    num_choices = features["input_ids"].shape[1]
    return TaskData("multiple_choice", num_choices, None, features, evals)


def load_task(config, tokenizer) -> TaskData:
    """Reads and featurizes the task named by config.finetune.name."""
    name = config.finetune.name
    if name.startswith("squad"):
        return _squad_task(config.finetune, tokenizer)
    if name == "conll2003":
        return _ner_task(config.finetune, tokenizer)
    if name == "swag":
        return _swag_task(config.finetune, tokenizer)
    return _sequence_task(config.finetune, tokenizer)


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------
def predict_split(exp: trainer.Experiment, params, eval_set: EvalSet, batch_size: int, buckets):
    """Model outputs for every row of `eval_set`, in feature order (fillers dropped)."""
    if batch_size % sharding.data_parallel_size(exp.mesh):
        raise ValueError(f"eval_batch_size={batch_size} must split over the data-parallel devices")
    predict = exp.predict_fn()
    rows = sharding.host_batch_rows(exp.mesh, batch_size)
    outputs, indices = [], []
    with jax.set_mesh(exp.mesh):
        for batch, idx in batching.batches(
            eval_set.features,
            batch_size,
            bucket_boundaries=buckets,
            group_by_length=buckets is not None,  # short rows together: padded to their bucket
            return_indices=True,
        ):
            local = {k: v[rows] for k, v in batch.items()}
            out = predict(params, sharding.global_batch_from_local(local, exp.mesh))
            out = jax.device_get(
                jax.tree_util.tree_map(
                    lambda x: multihost_utils.process_allgather(x, tiled=True), out
                )
            )
            outputs.append(out)
            indices.append(idx)
    n = batching.num_rows(eval_set.features)
    fields = [
        f.name for f in dataclasses.fields(outputs[0]) if getattr(outputs[0], f.name) is not None
    ]
    fields = [f for f in fields if f not in ("hidden_states", "attentions")]
    return {f: batching.unbatch([getattr(o, f) for o in outputs], indices, n) for f in fields}


def score(
    data: TaskData, eval_set: EvalSet, outputs: Mapping[str, np.ndarray], ft, out_dir: str | None
) -> dict[str, float]:
    """The task's official metrics on `eval_set` (if labelled), writing the prediction files."""
    write = out_dir is not None and jax.process_index() == 0
    if write:
        os.makedirs(out_dir, exist_ok=True)
    result: dict[str, float] = {}
    if data.kind in ("classification", "regression"):
        logits = outputs["logits"]
        preds = logits[:, 0] if data.kind == "regression" else np.argmax(logits, -1)
        if eval_set.labelled:
            labels = np.array([e.label for e in eval_set.examples])
            result = metrics.compute(data.metric_names, labels, preds)
        if write:
            _write_rows(
                os.path.join(out_dir, f"{eval_set.name}_predictions.tsv"),
                [(e.guid, e.label, p) for e, p in zip(eval_set.examples, preds)],
                data.label_names,
            )
            if (
                eval_set.name == "test"
                and data.glue_task is not None
                and data.glue_task.name in glue.GLUE_TASKS
            ):
                glue.write_submission(out_dir, data.glue_task, eval_set.examples, preds)
    elif data.kind == "multiple_choice":
        preds = np.argmax(outputs["logits"], -1)
        if eval_set.labelled:
            result = {"accuracy": metrics.accuracy([e.label for e in eval_set.examples], preds)}
        if write:
            _write_rows(
                os.path.join(out_dir, f"{eval_set.name}_predictions.tsv"),
                [(e.guid, e.label, p) for e, p in zip(eval_set.examples, preds)],
                None,
            )
    elif data.kind == "token_classification":
        tags = ner.decode(
            np.argmax(outputs["logits"], -1), eval_set.features, eval_set.extra, data.label_names
        )
        gold = [list(e.tags) for e in eval_set.examples]
        result = {"entity_f1": metrics.entity_f1(gold, tags)}
        if write:
            with open(os.path.join(out_dir, f"{eval_set.name}_predictions.txt"), "w") as f:
                for example, predicted in zip(eval_set.examples, tags):
                    for word, g, p in zip(example.words, example.tags, predicted):
                        f.write(f"{word} {g} {p}\n")
                    f.write("\n")
    else:
        prediction = squad.postprocess(
            eval_set.examples,
            eval_set.extra,
            outputs["start_logits"],
            outputs["end_logits"],
            n_best_size=ft.n_best_size,
            max_answer_length=ft.max_answer_length,
            version_2_with_negative=ft.name == "squad2",
            null_score_diff_threshold=ft.null_score_diff_threshold,
        )
        scores = metrics.squad_evaluate(
            squad.gold_answers(eval_set.examples),
            prediction.predictions,
            version="2.0" if ft.name == "squad2" else "1.1",
            na_probs=prediction.null_odds or None,
        )
        result = {k: float(v) for k, v in scores.items() if isinstance(v, (int, float))}
        if write:
            squad.write_predictions(out_dir, prediction)
    _require_finite(result, eval_set.name)
    return result


def _require_finite(scores: Mapping[str, float], split: str) -> None:
    """Stops the run on a NaN metric rather than reporting or averaging a meaningless score."""
    bad = sorted(k for k, v in scores.items() if not np.isfinite(v))
    if bad:
        raise FloatingPointError(
            f"{split} metric(s) {', '.join(bad)} are NaN ({scores}): the predictions hold NaN or "
            "are constant, or the labels are; stopping"
        )


def _write_rows(path: str, rows: Sequence[tuple], label_names) -> None:
    def name(value):
        if label_names is not None and isinstance(value, (int, np.integer)) and value >= 0:
            return label_names[int(value)]
        return "" if value is None else (f"{value:.6g}" if isinstance(value, float) else str(value))

    with open(path, "w", encoding="utf-8") as f:
        f.write("id\tlabel\tprediction\n")
        for guid, label, pred in rows:
            f.write(f"{guid}\t{name(label)}\t{name(pred)}\n")


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------
def starting_point(config, data: TaskData, tokenizer):
    """(BertConfig of the fine-tuned model, encoder params or None for random init)."""
    overrides = dict(num_labels=data.num_labels, label_names=data.label_names)
    if data.kind == "multiple_choice":
        overrides = dict(num_labels=2, label_names=None)  # the choice head has one output
    if not config.init_from:
        fields = config.model.to_dict()
        fields["vocab_size"] = fields["vocab_size"] or tokenizer.vocab_size  # 0: the tokenizer's
        cfg = BertConfig(**fields).replace(**overrides)
        encoder = None
    else:
        cfg, encoder, _, report = convert.load_any(config.init_from, "BertModel")
        logging.info("encoder from %s: %s", config.init_from, report.summary())
        cfg = cfg.replace(**overrides)
        if config.finetune.random_init:
            encoder = None
    if cfg.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"the model's vocab_size={cfg.vocab_size} differs from the tokenizer's "
            f"{tokenizer.vocab_size} tokens; use the checkpoint's own vocabulary"
        )
    return cfg, encoder


def graft(cfg: BertConfig, head: str, encoder, seed: int):
    """Head parameters: `encoder` (BertModel params) under `bert`, new head weights (seeded).

    Returns (params, names of the newly initialized weights).
    """
    params = jax.device_get(
        jax.tree_util.tree_map(
            np.asarray, init_params(get_model_class(head)(cfg), jax.random.PRNGKey(seed))
        )
    )
    params = nn.meta.unbox(params)
    bert = dict(encoder)
    if "pooler" not in params["bert"]:
        bert.pop("pooler", None)
    elif "pooler" not in bert:
        bert["pooler"] = params["bert"]["pooler"]
    new = sorted(f"{k}/..." for k in params if k != "bert")
    params = {**params, "bert": bert}
    convert.check_params(cfg, params, head)
    return params, new


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------
def run(config, workdir: str, mode: str = "train") -> dict[str, Any]:
    """Fine-tunes for every seed.

    Returns:
      {"task", "seeds": {seed: final dev (and labelled test) metrics}, "mean", "std"}.
    """
    ft = config.finetune
    tokenizer = find_tokenizer(config)
    data = load_task(config, tokenizer)
    cfg, encoder = starting_point(config, data, tokenizer)
    head = HEADS[data.kind]
    train_features = data.train
    if ft.pack:
        if data.kind not in ("classification", "regression", "token_classification"):
            raise ValueError(f"packing is for sequence and token tasks, not {data.kind}")
        train_features, info = batching.pack(
            data.train, max_segments=ft.max_segments, max_seq_length=ft.max_seq_length
        )
        logging.info(
            "packed %d examples into %d rows (%.1f%% real tokens)",
            batching.num_rows(data.train),
            batching.num_rows(train_features),
            100 * info.efficiency,
        )
    buckets = batching.length_buckets(ft.max_seq_length) if ft.bucket_lengths else None
    seeds = [int(s) for s in str(ft.seeds).split(",") if s.strip()]
    results: dict[str, Any] = {"task": ft.name, "seeds": {}}
    exp = None  # one Experiment for every seed: its compiled steps serve them all
    mesh = sharding.make_mesh(config.mesh.to_dict())  # the one the Experiment builds
    for seed in seeds:
        seed_dir = os.path.join(workdir, f"seed_{seed}") if len(seeds) > 1 else workdir
        with config.unlocked():
            config.seed = seed
        train_iter = batching.EpochIterator(
            train_features,
            config.global_batch_size,
            num_epochs=ft.num_epochs,
            seed=seed,
            bucket_boundaries=None if ft.pack else buckets,
            group_by_length=bool(buckets) and not ft.pack,
            host_rows=sharding.host_batch_rows(mesh, config.global_batch_size),
        )
        num_steps = train_iter.steps_per_epoch * ft.num_epochs  # the same for every seed
        if exp is None:
            exp = trainer.Experiment.build(config, cfg, head, data.kind, num_steps)
        if mode == "shardings":
            print("\n".join(sharding.describe(exp.abstract.params, exp.mesh, exp.rules)))
            return results
        params = None
        if encoder is not None:
            params, new = graft(cfg, head, encoder, seed)
            logging.info("newly initialized head weights: %s", new)
        ckpt = trainer.checkpointer(seed_dir, config)
        state, start = exp.create_or_restore(ckpt, train_iter, init_params=params, seed=seed)
        writer = MetricWriter(seed_dir, num_steps, start)
        dev = next((e for e in data.evals if e.name == "dev" and e.labelled), None)

        def evaluate(params, step, exp=exp, dev=dev):
            del step
            outputs = predict_split(exp, params, dev, ft.eval_batch_size, buckets)
            return score(data, dev, outputs, ft, None)

        state, step, stopped = exp.run(
            state,
            start,
            train_iter,
            ckpt,
            writer,
            num_train_steps=num_steps,
            log_every_steps=config.log_every_steps,
            checkpoint_every_steps=min(config.checkpoint_every_steps, train_iter.steps_per_epoch),
            eval_every_steps=config.eval_every_steps or train_iter.steps_per_epoch,
            evaluate=evaluate if dev is not None else None,
            data_iterator=train_iter,
        )
        ckpt.close()
        if stopped or step < num_steps:
            writer.close()
            logging.warning(
                "seed %d stopped at step %d of %d; rerun to resume", seed, step, num_steps
            )
            return results
        final = {}
        for eval_set in data.evals:
            if eval_set.name == "test" and not ft.evaluate_test:
                continue
            outputs = predict_split(exp, state.params, eval_set, ft.eval_batch_size, buckets)
            scores = score(data, eval_set, outputs, ft, os.path.join(seed_dir, "predictions"))
            if eval_set.name == "dev":
                final.update(scores)
            else:  # a labelled test set (the Shakespeare task's plays) is scored too
                final.update({f"{eval_set.name}_{k}": v for k, v in scores.items()})
        writer.write(step, {f"final/{k}": v for k, v in final.items()})
        writer.close()
        results["seeds"][str(seed)] = final
        if config.export_hf_at_end:
            exp.export(state.params, seed_dir)
            if jax.process_index() == 0:
                tokenizer.save(os.path.join(seed_dir, "hf"))
    per_seed = list(results["seeds"].values())
    if per_seed:
        keys = per_seed[0].keys()
        results["mean"] = {k: float(np.mean([r[k] for r in per_seed])) for k in keys}
        results["std"] = {k: float(np.std([r[k] for r in per_seed])) for k in keys}
        if jax.process_index() == 0:
            with open(os.path.join(workdir, "results.json"), "w") as f:
                json.dump(results, f, indent=2)
            for k in keys:
                split = "" if k.startswith("test_") else "dev "
                print(
                    f"{ft.name} {split}{k}: {results['mean'][k]:.4f} +- {results['std'][k]:.4f} "
                    f"over {len(per_seed)} seed(s)"
                )
    return results
