"""SQuAD v1.1 and v2.0: reading, windowed features, and predictions from start/end logits.

Readers: `read_squad` (the official JSON), `read_squad_tfds`, `read_squad_hub` (the Hub's Parquet
of `rajpurkar/squad` and `rajpurkar/squad_v2`, which the tasks read when `data_dir` holds no
SQuAD JSON). Features as google-research/bert's `run_squad.py`: the context cut into windows of
`max_seq_length - len(question) - 3` tokens (4 for RoBERTa's `</s></s>`), every `doc_stride`
tokens, each row laid out by `tokenization.SubwordTokenizer.build_inputs` (RoBERTa's token types
all 0):

    input_ids        int32   [F, L]   F windows (rows), L = max_seq_length
    token_type_ids   int32   [F, L]   0 for [CLS] question [SEP], 1 for the window and last [SEP]
    attention_mask   int32   [F, L]
    start_positions  int32   [F]      the first answer's first/last token in the row; 0 ([CLS])
    end_positions    int32   [F]      when unanswerable or not wholly inside this window
    example_weights  float32 [F]      1.0 (`batching.batches` adds 0.0 fillers)

beside one host-side `SquadWindow` per row (its example, the row's context tokens, their
character offsets and max-context flags). `postprocess` maps logits back to the exact context
text; `write_predictions` writes run_squad.py's files. Windows, postprocessing, bad input:
docs/finetune_data.md, "SQuAD v1.1 / v2.0".

Its modules, in the order an example passes them: `examples` (records, readers), `features`
(windows), `predictions` (logits back to text, the files); this package holds the two tasks and
names what users call.
"""

from __future__ import annotations

import os

from absl import logging

from bert_jax.finetune import metrics
from bert_jax.finetune import task as task_lib
from bert_jax.finetune.squad.examples import (
    SquadExample,
    SquadStats,
    gold_answers,
    read_squad,
    read_squad_hub,
    read_squad_tfds,
)
from bert_jax.finetune.squad.features import SquadWindow, featurize
from bert_jax.finetune.squad.predictions import SquadPredictions, postprocess, write_predictions

__all__ = [
    "SQUAD1",
    "SQUAD2",
    "SquadExample",
    "SquadPredictions",
    "SquadStats",
    "SquadWindow",
    "featurize",
    "gold_answers",
    "postprocess",
    "read_squad",
    "read_squad_hub",
    "read_squad_tfds",
    "write_predictions",
]


_FILES = {
    False: ("train-v1.1.json", "dev-v1.1.json", ""),
    True: ("train-v2.0.json", "dev-v2.0.json", ""),
}
_HUB_CONFIG = {False: "plain_text", True: "squad_v2"}  # rajpurkar/squad, rajpurkar/squad_v2


def _load(version2: bool):
    files = _FILES[version2]

    def load(ft, tokenizer):
        """TaskData of SQuAD: the JSON files in data_dir (else the Hub's Parquet layout there;
        or tensorflow-datasets), in windows."""
        windows_args = dict(
            max_seq_length=ft.max_seq_length,
            doc_stride=ft.doc_stride,
            max_query_length=ft.max_query_length,
        )

        def read(which, split):
            if ft.source == "tfds":
                name = "squad/v2.0" if version2 else "squad/v1.1"
                return read_squad_tfds(name, split, data_dir=ft.tfds_data_dir or None)
            path = task_lib.split_file(ft, which, files)
            if path.lower().endswith(".parquet"):
                return read_squad_hub([path])
            hub = [] if os.path.exists(path) else task_lib.hub_split_files(
                ft.data_dir, split, (_HUB_CONFIG[version2],)
            )  # fmt: skip
            if hub:
                return read_squad_hub(hub)
            if not path:
                raise ValueError(
                    f"{ft.name} needs config.finetune.data_dir (or train_file/dev_file)"
                )
            return read_squad(path)

        train = task_lib.subsample(read(0, "train"), ft.max_train_examples, 0)
        features, _, stats = featurize(train, tokenizer, **windows_args)
        logging.info("SQuAD train: %s", stats)
        dev = task_lib.subsample(read(1, "validation"), ft.max_eval_examples, 1)
        f, windows, s = featurize(dev, tokenizer, **windows_args)
        logging.info("SQuAD dev: %s", s)
        return task_lib.TaskData(
            "question_answering",
            2,
            None,
            features,
            [task_lib.EvalSet("dev", f, dev, True, windows)],
        )

    return load


def _score(version2: bool):
    def score(data, eval_set, outputs, ft, out_dir):
        """The official evaluate-v1.1.py / v2.0.py numbers, and the prediction files."""
        del data
        prediction = postprocess(
            eval_set.examples,
            eval_set.extra,
            outputs["start_logits"],
            outputs["end_logits"],
            n_best_size=ft.n_best_size,
            max_answer_length=ft.max_answer_length,
            version_2_with_negative=version2,
            null_score_diff_threshold=ft.null_score_diff_threshold,
        )
        scores = metrics.squad_evaluate(
            gold_answers(eval_set.examples),
            prediction.predictions,
            version="2.0" if version2 else "1.1",
            na_probs=prediction.null_odds or None,
        )
        if out_dir is not None:
            write_predictions(out_dir, prediction)
        return {k: float(v) for k, v in scores.items() if isinstance(v, (int, float))}

    return score


SQUAD1, SQUAD2 = (
    task_lib.FinetuneTask(
        f"squad{2 if v2 else 1}",
        _load(v2),
        _score(v2),
        files=_FILES[v2],
        objective="question_answering",
        num_labels=2,
    )
    for v2 in (False, True)
)
