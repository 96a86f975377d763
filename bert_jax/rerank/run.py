"""The reranker job: (query, passage) rows -> a cross-encoder from a checkpoint -> training per
seed -> dev reranking scores and a sentence-transformers CrossEncoder directory.

    train_and_evaluate(config, workdir)         # train.py --config=configs/rerank.py:...

The model is the family's sequence-classification head with one output (`num_labels=1`) on the
starting checkpoint's encoder (`init_from`, any family, any format `pretrained.load` reads; a
reranker's own head is kept, another head is started afresh), or `config.model` from scratch.
Each pair is laid out as the family's tokenizer lays out a sentence pair
(`[CLS] query [SEP] passage [SEP]`). It trains on `rerank.train_file`'s rows
(`bert_jax.rerank.data`) with `rerank.loss` (`training.reranking.rerank_objective`): binary
cross-entropy on pointwise rows, the listwise softmax over a positive and its negatives, or
margin-MSE distillation from teacher scores.

For each seed of `rerank.seeds` the run trains `rerank.num_epochs` epochs in
`<workdir>/seed_<s>` (the workdir itself for one seed), reranks the dev queries
(`rerank.evaluation`: nDCG@10 and MRR@10, and the file order's as `base_`) at step 0, every
`eval_every_steps` and at the end, exports the final model to `hf/` (`save_cross_encoder`) and
removes its training checkpoints. `<workdir>/results.json` holds each finished seed's final
scores and its starting model's (`start_ndcg@10`, ...), with mean and std; `<workdir>/settings.json`
what decides them (`training.settings`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

import jax
from absl import logging

from bert_jax import batch_layout, tokenization
from bert_jax.checkpoints import pretrained
from bert_jax.checkpoints.cross_encoder import save_cross_encoder
from bert_jax.models import families
from bert_jax.models.families import Role
from bert_jax.parallel import aot
from bert_jax.rerank import data, evaluation
from bert_jax.training import compile_report, experiment, flops, reranking, seed_run
from bert_jax.training.export import training_section, write_from_process_0
from bert_jax.training.job import Job, register
from bert_jax.training.objective import Objective
from bert_jax.training.start import architecture, graft, job_tokenizer
from bert_jax.training.summaries import MetricView
from bert_jax.training.text_job import TextJob

VIEW = MetricView(
    console=("eval/", "loss", "rerank_accuracy", "learning_rate"),
    summary=("loss", "rerank_accuracy", "ndcg@10", "mrr@10", "base_ndcg@10"),
    progress=("train/loss", "eval/ndcg@10", "train/tokens_per_s"),
    curves_accuracy=("eval/ndcg@10", "eval/mrr@10"),
    curves_accuracy_title="dev nDCG@10 and MRR@10 of the reranked candidates",
)
DEFAULT_MAX_SEQ_LENGTH = 256  # pairs: a query and a passage
PER_GROUP_KEYS = ("labels", "example_weights", "teacher_scores")  # [B] / [B, G] of a batch


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RerankSettings(TextJob):
    """The job's block (`config.rerank`), typed and checked once (`check_config`): the
    settings every text job has (`TextJob`: seeds, epochs, length, packing), and its own.

    Attributes:
      train_file, dev_file: the rows files (`bert_jax.rerank.data`; dev "" = none).
      max_train_examples, max_eval_examples: the first this many rows of each (0: all).
      loss: "auto" (the rows' layout chooses: `with_loss`), "bce", "listwise" or "margin_mse".
      activation, scale: the listwise loss's logits (`training.reranking.rerank_objective`).
      compile_group: --mode=compile's pairs a row (0: 1 for bce, else 4).
    """

    train_file: str
    dev_file: str
    max_train_examples: int
    max_eval_examples: int
    loss: str
    activation: str
    scale: float
    compile_group: int

    def pair_length(self, model_config) -> int:
        """Tokens a pair keeps: max_seq_length (0: `DEFAULT_MAX_SEQ_LENGTH`), within the
        model's positions."""
        return min(self.max_seq_length or DEFAULT_MAX_SEQ_LENGTH, model_config.max_sequence_length)


def check_config(config, reads_data: bool = True) -> RerankSettings:
    """Refuses, before any data is read, settings that could only fail later: counts
    (`experiment.check_experiment_config`), an unknown loss or activation, a scale <= 0, no
    train_file, the shared settings (`TextJob.parse`: epochs, packing, seeds). Returns the
    block, parsed."""
    experiment.check_experiment_config(config)
    r = config.rerank
    if r.loss not in ("auto", *reranking.RERANK_LOSSES):
        known = ("auto", *reranking.RERANK_LOSSES)
        raise ValueError(f"rerank.loss={r.loss!r}; expected one of {known}")
    if r.activation not in reranking.RERANK_ACTIVATIONS:
        raise ValueError(
            f"rerank.activation={r.activation!r}; expected one of {reranking.RERANK_ACTIVATIONS}"
        )
    if isinstance(r.scale, bool) or not isinstance(r.scale, (int, float)) or not r.scale > 0:
        raise ValueError(f"rerank.scale={r.scale!r}; expected a number > 0")
    if reads_data and not r.train_file:
        raise ValueError("set --config.rerank.train_file (rows: .jsonl, .csv, .tsv or .parquet)")
    block = TextJob.parse(config, "rerank")
    if not isinstance(r.compile_group, int) or r.compile_group < 0:
        group = r.compile_group
        raise ValueError(f"config.rerank.compile_group={group!r}: expected an integer >= 0")
    for key in ("max_train_examples", "max_eval_examples"):
        if isinstance(r[key], bool) or not isinstance(r[key], int) or r[key] < 0:
            raise ValueError(f"config.rerank.{key}={r[key]!r}: expected an integer >= 0")
    if block.pack and config.num_microbatches > 1:
        raise ValueError(
            f"rerank.pack packs a whole batch's pairs; num_microbatches="
            f"{config.num_microbatches} would split its rows from its labels: set "
            "num_microbatches=1 or rerank.pack=false"
        )
    return RerankSettings(
        **dataclasses.asdict(block), train_file=r.train_file, dev_file=r.dev_file,
        max_train_examples=r.max_train_examples, max_eval_examples=r.max_eval_examples,
        loss=r.loss, activation=r.activation, scale=float(r.scale), compile_group=r.compile_group,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Starting:
    """What the run starts from.

    Attributes:
      model_config: the reranker's architecture (any family's config, num_labels 1).
      params: a reranker's own host parameters, head and all (None: see `encoder`).
      encoder: the family's encoder's host parameters, under a new head drawn from each seed
        (`training.start.graft`); None with `params` None: from scratch.
      max_seq_length: tokens a pair keeps.
      tokenizer: the vocabulary.
    """

    model_config: Any
    params: Any
    encoder: Any
    max_seq_length: int
    tokenizer: tokenization.SubwordTokenizer


def starting_point(config, rr: RerankSettings) -> Starting:
    """The architecture, starting weights, pair length and tokenizer of the run.

    With `init_from`: its encoder, and its one-output sequence-classification head where it is
    a reranker already (else a new one-output head, drawn from each seed's key); the tokenizer
    beside it unless `rerank.tokenizer` names one."""
    source = config.init_from
    tokenizer = job_tokenizer(config, "rerank")
    params = encoder = None
    if source:
        read = pretrained.read_config(source)
        head = families.family_of(read).head_for(Role.SEQUENCE_CLASSIFICATION)
        reranker = read.num_labels == 1
        loaded = pretrained.load(
            source,
            head if reranker else Role.ENCODER,
            allow_new_heads=True,
            with_tokenizer=False,
        )
        model_config = loaded.config
        params, encoder = (loaded.params, None) if reranker else (None, loaded.params)
        if loaded.report is not None and loaded.report.newly_initialized:
            logging.info("init_from lacks %s: initialized", loaded.report.newly_initialized)
    else:
        model_config = architecture(config, tokenizer.vocab_size)
    model_config = model_config.replace(num_labels=1, label_names=None)
    tokenizer.check_model_vocab_size(model_config.vocab_size)
    return Starting(model_config, params, encoder, rr.pair_length(model_config), tokenizer)


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------
def train_and_evaluate(config, workdir: str | None, mode: str = "train") -> dict[str, Any]:
    """Trains a reranker for every seed of `rerank.seeds` (mode "train") or prints the
    shardings ("shardings"; --mode=compile: `compile_for_topology`, through `JOB.run`).

    Flow: settings checked -> starting point -> rows read and featurized -> one Experiment for
    every seed -> per seed: state -> step-0 dev scores -> Trainer with hooks -> final dev
    scores -> CrossEncoder export.

    Returns:
      {"task": "rerank", "seeds": {seed: final and start_ dev scores}, "mean", "std"}.
    """
    rr = check_config(config)
    start = starting_point(config, rr)
    train, dev, data_files = seed_run.read_train_dev(rr, data.read_rows)
    config, rr = with_loss(config, rr, data.loss_for_rows(rr.loss, train), train.layout)
    has_scores = train.teacher_scores is not None
    data.check_rows(rr.loss, train.layout, train.group_size, has_scores, train.path)
    features = data.featurize(train, start.tokenizer, start.max_seq_length)
    if rr.loss != "margin_mse":
        features.pop("teacher_scores", None)
    dev_set = (
        None
        if dev is None
        else evaluation.dev_set(data.dev_queries(dev), start.tokenizer, start.max_seq_length)
    )
    seed_run.check_batch(config, len(train), f"training rows of {rr.train_file}")
    steps_per_epoch = _train_batches(config, rr, features, rr.seeds[0]).steps_per_epoch
    objective = rerank_objective(config, rr, features["input_ids"].shape[1])
    head = families.head_in_family(start.model_config, objective.role)
    exp = experiment.Experiment.build(
        config, start.model_config, head, objective, steps_per_epoch * rr.num_epochs
    )

    args = (config, rr, exp, start, features, dev_set)
    return seed_run.run_seeds(
        config, workdir, exp, mode=mode, task="rerank", data_files=data_files,
        seeds=list(rr.seeds), one_seed=functools.partial(train_seed, *args, num_rows=len(train)),
    )  # fmt: skip


def with_loss(config, rr: RerankSettings, loss: str, layout: str):
    """(config, rr) with `rerank.loss` set to `loss` (what "auto" chose for `layout` rows:
    copies, said on one line; the config's is what settings.json records), or both as they
    are where they name that loss already."""
    if rr.loss == loss:
        return config, rr
    logging.info("rerank.loss=auto: %s, the loss for %s rows", loss, layout)
    config = copy.deepcopy(config)
    config.rerank.loss = loss
    return config, dataclasses.replace(rr, loss=loss)


def compile_batch(
    config, rr: RerankSettings, group: int, length: int
) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of a training batch of `global_batch_size` rows of `group` pairs of
    `length` tokens, as `_train_batches` makes it: with `rerank.pack`, at the most rows packing
    can take (one pair a row: [B G, L], the memory any packed step stays within)."""
    rows = config.global_batch_size
    layout = batch_layout.rerank_layout(rr.loss, packed=rr.pack)
    sizes = dict(B=rows, G=group, L=length, R=rows * group, S=rr.max_segments)
    return batch_layout.abstract_batch(layout, **sizes)


def compile_for_topology(
    config, topology: str, *, num_slices: int = 1, hlo_out: str | None = None
) -> int:
    """Compiles the train step for `topology` (TPU slice or GPUs, `parallel.aot`; one slice:
    `num_slices` is not read) without data:
    `global_batch_size` rows of `rerank.compile_group` pairs (`compile_batch`) of
    max_seq_length tokens (256 by default). Prints the report, returns the exit status."""
    rr = check_config(config, reads_data=False)
    if rr.loss == "auto":  # no rows to tell: pointwise, unless groups are asked for
        loss = "listwise" if rr.compile_group > 1 else "bce"
        config, rr = with_loss(config, rr, loss, "compiled")
    model_config = architecture(config).replace(num_labels=1, label_names=None)
    length = rr.pair_length(model_config)
    group = rr.compile_group or (1 if rr.loss == "bce" else 4)
    objective = rerank_objective(config, rr, group)
    head = families.head_in_family(model_config, objective.role)
    exp = experiment.Experiment.build(
        config, model_config, head, objective, 1, aot.topology_devices(topology)
    )
    pairs = config.global_batch_size * group
    model_flops = flops.classification_step_flops(model_config, [length] * pairs, 1)
    return compile_report.report_compiled_step(
        exp,
        compile_batch(config, rr, group, length),
        model_flops=model_flops,
        topology=topology,
        task="rerank",
        hlo_out=hlo_out,
    )


def rerank_objective(config, rr: RerankSettings, group: int) -> Objective:
    """The objective of `rerank.loss` for training batches of `global_batch_size` groups of
    `group` pairs, packed with `rerank.pack` (`_train_batches`)."""
    packed = (config.global_batch_size, group) if rr.pack else None
    return reranking.rerank_objective(rr.loss, rr.scale, rr.activation, packed_shape=packed)


def _train_batches(config, block: TextJob, features, seed: int, exp=None):
    """One seed's batches for `exp` (`seed_run.group_batches`; None: the plan, to count steps),
    packed with `rerank.pack` as the embedding job packs its texts (the labels, weights and
    teacher scores stay [B])."""
    keep = tuple(k for k in PER_GROUP_KEYS if k in features)
    return seed_run.group_batches(config, block, features, seed, exp, keep)


def train_seed(
    config, rr: RerankSettings, exp, start: Starting, features, dev_set, seed, seed_dir, num_rows
):
    """One seed (`seed_run.train_seed`, `seed_run.export_plan`): train, rerank dev at step 0 and
    at the end, export `seed_dir/hf` as a CrossEncoder directory. Returns the final and start_
    scores, or None when a signal stopped the run before its last step."""
    plan = seed_run.export_plan(
        config,
        seed_dir,
        view=VIEW,
        score_fn=None
        if dev_set is None
        else lambda params: evaluation.score(exp, params, dev_set, rr.eval_batch_size),
        card_fn=lambda num_steps, begin, end: model_card(
            config, rr, exp, start, num_steps, num_rows, begin, end
        ),
        export_fn=lambda params, directory, card: export(params, directory, exp, start, card),
    )
    batches = _train_batches(config, rr, features, seed, exp)
    scores = seed_run.train_seed(
        config,
        exp,
        batches,
        rr.num_epochs,
        seed,
        seed_dir,
        plan,
        init_params=initial_params(exp, start, seed),
    )
    warn_if_worse(scores, seed)
    return scores


def warn_if_worse(scores: dict[str, float] | None, seed: int) -> None:
    """Says so when the trained reranker orders the dev candidates worse than the file's (the
    first stage's) order: reranking with it would lower the ranking it is meant to raise."""
    if not scores or "base_ndcg@10" not in scores:
        return
    mine, base = scores["ndcg@10"], scores["base_ndcg@10"]
    if mine < base:
        logging.warning(
            "seed %d: the trained reranker orders the dev candidates worse than the first stage "
            "did (nDCG@10 %.4f against the file order's %.4f): reranking with it would lower the "
            "ranking; train more steps or at a higher learning rate (docs/rerank.md, 'A recipe "
            "that learns')",
            seed,
            mine,
            base,
        )


def initial_params(exp, start: Starting, seed: int):
    """The host parameters a seed starts from: a reranker's own, or the encoder under a new head
    drawn from `seed` (`training.start.graft`); None from scratch."""
    if start.encoder is None:
        return start.params
    return graft(exp.model_config, exp.head, start.encoder, seed)[0]


def export(params, directory, exp, start: Starting, card: str) -> str:
    """Writes the model as a CrossEncoder directory (every process gathers the parameters;
    process 0 writes). Returns where it went."""
    write_from_process_0(
        params,
        lambda host_params: save_cross_encoder(
            directory,
            exp.model_config,
            host_params,
            tokenizer=start.tokenizer,
            max_seq_length=start.max_seq_length,
            activation="sigmoid",  # CrossEncoder's default for one output: scores in (0, 1)
            card=card,
        ),
    )
    return f"{directory} (sentence-transformers CrossEncoder)"


LOSS_NAMES = {
    "bce": "BinaryCrossEntropyLoss: binary cross-entropy on the logit",
    "listwise": "the positive's softmax cross-entropy among its negatives (MultipleNegativesRanking"
    "Loss with the row's own negatives)",
    "margin_mse": "MarginMSELoss: the margins s(q, p) - s(q, n) against the teacher's",
}


def model_card(
    config, rr: RerankSettings, exp, start: Starting, num_steps, num_rows, begin, end
) -> str:
    """README.md of the export (markdown): the usage, the data, loss, schedule, and the dev
    reranking scores of the starting and the trained model."""
    r, opt = rr, config.optimizer
    lines = [
        "---",
        "library_name: sentence-transformers",
        "pipeline_tag: text-ranking",
        "tags:",
        "- sentence-transformers",
        "- cross-encoder",
        "- reranker",
        "---",
        "",
        f"# A {exp.model_config.display_name} reranker",
        "",
        "```python",
        "from sentence_transformers import CrossEncoder",
        "",
        'model = CrossEncoder("path/to/this/folder")',
        'scores = model.predict([("a query", "a passage"), ("a query", "another passage")])',
        "```",
        "",
    ]
    items = [
        f"loss: {LOSS_NAMES[r.loss]}",
        f"max_seq_length: {start.max_seq_length} (a query and a passage)",
        f"{num_steps} steps ({r.num_epochs} epoch(s)) of {config.global_batch_size} rows, "
        f"{opt.name} at peak learning rate {opt.peak_learning_rate:g}, {opt.schedule} schedule",
    ]
    dev = None
    if end:
        title = f"Dev reranking (`{r.dev_file}`: each query's candidates in the file's order):"
        rows = [
            (k, f"{end.get('base_' + k, float('nan')):.4f}", f"{begin.get(k, float('nan')):.4f}",
             f"{v:.4f}")
            for k, v in end.items()
            if not k.startswith("base_")
        ]  # fmt: skip
        dev = (title, ("metric", "file order", "start", "trained"), rows)
    data = f"{num_rows:,} rows of `{r.train_file}`"
    lines += training_section("reranker job", config, data, items, dev)
    return "\n".join(lines) + "\n"


JOB = register(Job(("rerank",), "rerank", check_config, train_and_evaluate, compile_for_topology))
