"""The embedding job: pairs -> an encoder from a checkpoint -> contrastive training per seed ->
dev retrieval scores and a sentence-transformers directory.

    train_and_evaluate(config, workdir)         # train.py --config=configs/embed.py:...

The model is the starting checkpoint's encoder (`init_from`, either family; or `config.model`
from scratch), pooled as its sentence-transformers directory says (mean or CLS; CLS for a plain
checkpoint, as `python -m bert_jax.inference embed`). It trains on `embed.train_file`'s pairs
with the contrastive objective (`contrastive.contrastive_objective`: in-batch negatives over the
whole global batch, GradCache chunks with `num_microbatches` > 1, Matryoshka dims), the texts
of each batch packed several to a row with `embed.pack` (`packing`).

With `embed.pooling=splade` (`configs/embed.py:model=splade`) the same run trains a SPLADE
model: the family's masked-LM head, its logits max-pooled to sparse vectors over the vocabulary
(`models.pooling.splade_pool`), with the SPLADE objective (`training.splade`: in-batch and hard
negatives by dot product, FLOPS regularization of queries and documents), scored by dot product
on dev and exported as a sentence-transformers SparseEncoder directory.

For each seed of `embed.seeds` the run trains `embed.num_epochs` epochs in `<workdir>/seed_<s>`
(the workdir itself for one seed), scores dev retrieval (`embed.evaluation`), exports the final
model to `hf/` (`save_sentence_transformer`) and removes its training checkpoints; what it writes
and when: docs/embeddings.md, "What the run does and writes".
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from absl import logging

from bert_jax import batch_layout, tokenization
from bert_jax.checkpoints import pretrained
from bert_jax.checkpoints.sentence_transformers import (
    read_sentence_transformer,
    read_static_queries,
    resolve_prompt,
    save_sentence_transformer,
)
from bert_jax.data import batching
from bert_jax.embed import evaluation
from bert_jax.models import families
from bert_jax.models.inference_free import DOCUMENTS, QUERY_WEIGHT
from bert_jax.models.pooling import SENTENCE_POOLINGS, SPARSE_POOLINGS
from bert_jax.parallel import aot
from bert_jax.paths import as_path
from bert_jax.retrieval import pairs
from bert_jax.retrieval.pairs import Pairs
from bert_jax.training import compile_report, contrastive, experiment, flops, seed_run, splade
from bert_jax.training.export import training_section, write_from_process_0
from bert_jax.training.job import Job, register
from bert_jax.training.start import architecture, job_tokenizer
from bert_jax.training.summaries import MetricView
from bert_jax.training.text_job import TextJob

VIEW = MetricView(
    console=("eval/", "loss", "mnrl_accuracy", "learning_rate"),
    summary=("loss", "mnrl_accuracy", "ndcg@10", "mrr@10", "recall@1", "recall@10"),
    progress=("train/loss", "train/mnrl_accuracy", "eval/ndcg@10", "train/tokens_per_s"),
    curves_accuracy=("eval/ndcg@10", "eval/recall@1"),
    curves_accuracy_title="in-batch accuracy, dev nDCG@10 and Recall@1",
)
DEFAULT_MAX_SEQ_LENGTH = 128  # a checkpoint that says none (sentence-transformers says its own)
BOOLEANS = {"true": True, "false": False}
QUERY_ENCODERS = ("model", "static")  # embed.query_encoder: "static" = inference-free SPLADE


# ---- Settings ----
@dataclasses.dataclass(frozen=True)
class EmbedSettings(TextJob):
    """The job's block (`config.embed`), typed and checked once (`check_config`): the settings
    every text job has (`TextJob`: seeds, epochs, length, packing), and its own.

    Attributes:
      train_file, dev_file: the pairs files (`retrieval.pairs`; dev "" = none).
      max_train_examples, max_eval_examples: the first this many pairs of each (0: all).
      tokenizer: a vocab.txt / tokenizer.json ("": the one beside init_from).
      pooling: "auto", "mean", "cls" or "splade"; normalize: "auto", "true" or "false".
      scale, symmetric: the in-batch loss's (`contrastive.contrastive_objective`).
      matryoshka_dims: the prefix sizes whose losses add (() = the full size only).
      query_regularizer_weight, document_regularizer_weight: SPLADE's FLOPS weights;
        regularizer_warmup ("quadratic", "linear" or "none") and regularizer_warmup_ratio: how
        they rise from 0 over that share of the updates (`splade.SpladeObjective`).
      query_prompt, document_prompt: "auto" (the starting directory's), "" or the text.
      query_encoder: "model" (queries run through the model) or "static" (SPLADE only: an
        inference-free model, `splade.InferenceFreeObjective`); query_learning_rate: the
        static query weights' peak learning rate.
    """

    train_file: str
    dev_file: str
    max_train_examples: int
    max_eval_examples: int
    tokenizer: str
    pooling: str
    normalize: str
    scale: float
    symmetric: bool
    matryoshka_dims: tuple[int, ...]
    query_regularizer_weight: float
    document_regularizer_weight: float
    regularizer_warmup: str
    regularizer_warmup_ratio: float
    query_prompt: str
    document_prompt: str
    query_encoder: str
    query_learning_rate: float

    def checked_dims(self, hidden_size: int) -> tuple[int, ...]:
        """`matryoshka_dims`, each at most `hidden_size` (ValueError naming the key)."""
        if any(d > hidden_size for d in self.matryoshka_dims):
            raise ValueError(
                f"embed.matryoshka_dims={','.join(map(str, self.matryoshka_dims))!r}: expected "
                f"comma-separated whole numbers >= 1 <= the hidden size {hidden_size}"
            )
        return self.matryoshka_dims


def check_config(config, reads_data: bool = True) -> EmbedSettings:
    """Refuses, before any data is read, settings that could only fail later: counts
    (`experiment.check_experiment_config`), an unknown pooling or normalize, a scale <= 0,
    Matryoshka dims that are not positive whole numbers, SPLADE with normalize=true,
    Matryoshka dims or a negative regularizer weight, no train_file (unless the run
    `reads_data`: --mode=compile does not), the shared settings (`TextJob.parse`: epochs,
    packing, seeds). Returns the block, parsed."""
    experiment.check_experiment_config(config)
    e = config.embed
    if e.pooling not in ("auto", *SENTENCE_POOLINGS, *SPARSE_POOLINGS):
        raise ValueError(f"embed.pooling={e.pooling!r}; expected auto, mean, cls or splade")
    if e.pooling in SPARSE_POOLINGS:
        _check_splade(e)
    if e.query_encoder not in QUERY_ENCODERS:
        raise ValueError(f"embed.query_encoder={e.query_encoder!r}; expected model or static")
    if e.query_encoder == "static" and e.pooling not in SPARSE_POOLINGS:
        raise ValueError(
            f"embed.query_encoder=static with embed.pooling={e.pooling}: inference-free query "
            "weights are a SPLADE model's (set embed.pooling=splade, configs/embed.py:"
            "model=inference_free)"
        )
    if e.normalize not in ("auto", *BOOLEANS):
        raise ValueError(f"embed.normalize={e.normalize!r}; expected auto, true or false")
    if isinstance(e.scale, bool) or not isinstance(e.scale, (int, float)) or not e.scale > 0:
        raise ValueError(f"embed.scale={e.scale!r}; expected a number > 0")
    if reads_data and not e.train_file:
        raise ValueError("set --config.embed.train_file (pairs: .jsonl, .csv or .tsv)")
    for key in ("max_train_examples", "max_eval_examples"):
        if isinstance(e[key], bool) or not isinstance(e[key], int) or e[key] < 0:
            raise ValueError(f"config.embed.{key}={e[key]!r}: expected an integer >= 0")
    block = TextJob.parse(config, "embed")
    own = {f.name for f in dataclasses.fields(EmbedSettings)} - {
        f.name for f in dataclasses.fields(TextJob)
    }
    values = {name: e[name] for name in own}
    values["matryoshka_dims"] = matryoshka_dims(e.matryoshka_dims)
    return EmbedSettings(**dataclasses.asdict(block), **values)


def _check_splade(e) -> None:
    """The settings a SPLADE run (`embed.pooling=splade`) cannot take."""
    if e.normalize == "true":
        raise ValueError("embed.normalize=true: SPLADE vectors are not normalized; set auto")
    if str(e.matryoshka_dims).strip():
        raise ValueError("embed.matryoshka_dims: SPLADE vectors have no Matryoshka prefixes")
    for name in ("query_regularizer_weight", "document_regularizer_weight"):
        if not e[name] >= 0:
            raise ValueError(f"embed.{name}={e[name]!r}; expected a number >= 0")
    if e.regularizer_warmup not in splade.RAMPS:
        raise ValueError(
            f"embed.regularizer_warmup={e.regularizer_warmup!r}; expected quadratic, linear or none"
        )
    rate = e.query_learning_rate
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise ValueError(f"embed.query_learning_rate={rate!r}; expected a number > 0")
    ratio = e.regularizer_warmup_ratio
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ValueError(f"embed.regularizer_warmup_ratio={ratio!r}; expected a number in (0, 1]")


def matryoshka_dims(text) -> tuple[int, ...]:
    """`embed.matryoshka_dims` ("768,512,256") as sizes (() = the full size only); ValueError
    naming the key unless each is a positive whole number."""
    text = str(text)
    try:
        dims = tuple(int(d) for d in text.split(",") if d.strip())
    except ValueError:
        dims = (0,)
    if any(d < 1 for d in dims):
        raise ValueError(
            f"embed.matryoshka_dims={text!r}: expected comma-separated whole numbers >= 1"
        )
    return dims


@dataclasses.dataclass(frozen=True)
class Starting:
    """What the run starts from.

    Attributes:
      model_config: the encoder's architecture (any family's config).
      pooling: "mean" or "cls", or "splade" (a SPLADE model); normalize: the export's
        Normalize module (never for splade).
      max_seq_length: tokens a text keeps.
      tokenizer: the vocabulary.
      query_prompt, document_prompt: put before each anchor, and each positive and negative.
      prompts, default_prompt_name: the export's (the starting directory's, with the query and
        document prompts where they differ from its own).
      query_module: an inference-free start's `SparseStaticEmbedding` folder (its query
        weights start the run's), else None.
    """

    model_config: Any
    pooling: str
    normalize: bool
    max_seq_length: int
    tokenizer: tokenization.SubwordTokenizer
    query_prompt: str = ""
    document_prompt: str = ""
    prompts: Mapping[str, str] = dataclasses.field(default_factory=dict, hash=False)
    default_prompt_name: str | None = None
    query_module: str | None = None

    def prompted(self, texts: Pairs) -> Pairs:
        """`texts` with the query prompt before each anchor and the document prompt before each
        positive and hard negative."""
        q, d = self.query_prompt, self.document_prompt
        return dataclasses.replace(
            texts,
            anchors=[q + t for t in texts.anchors],
            positives=[d + t for t in texts.positives],
            negatives=[tuple(d + t for t in negs) for negs in texts.negatives],
        )


def starting_point(config, e: EmbedSettings) -> Starting:
    """The architecture, pooling, normalization, length, tokenizer and prompts of the run: the
    settings' (`e`) where they say, else the starting sentence-transformers directory's, else
    CLS pooling (what `python -m bert_jax.inference embed` pools), normalized, 128 tokens."""
    source = config.init_from
    tokenizer = job_tokenizer(config, "embed")
    model_config, st = architecture(config, tokenizer.vocab_size), None
    if source:
        folder = pretrained.resolve(source)
        if as_path(folder).is_dir():
            st = read_sentence_transformer(folder)
    query_module = getattr(st, "query_module", None)
    if query_module and e.query_encoder != "static":
        raise ValueError(
            f"init_from={source} is an inference-free SparseEncoder (a Router: its queries are "
            "weights of a SparseStaticEmbedding); continue it with embed.query_encoder=static "
            "(configs/embed.py:model=inference_free), or start from its document encoder "
            f"({st.transformer_path}) to train a SPLADE model of both"
        )
    tokenizer.check_model_vocab_size(model_config.vocab_size)
    pooling = e.pooling
    if pooling == "auto":
        pooling = getattr(st, "pooling", None) or "cls"
        if pooling not in SENTENCE_POOLINGS + SPARSE_POOLINGS:
            raise ValueError(
                f"{source} pools by {pooling!r}; the embedding job trains mean, cls or splade: "
                "set --config.embed.pooling"
            )
    normalize = BOOLEANS.get(e.normalize)
    if pooling in SPARSE_POOLINGS:
        normalize = False
    elif normalize is None:
        normalize = getattr(st, "normalize", None)
        normalize = True if normalize is None else bool(normalize)
    length = e.max_seq_length or getattr(st, "max_seq_length", None) or DEFAULT_MAX_SEQ_LENGTH
    length = min(length, model_config.max_sequence_length)
    logging.info("pooling %s, normalize %s, max_seq_length %d", pooling, normalize, length)
    return Starting(
        model_config, pooling, normalize, length, tokenizer, **_prompts(e, st),
        query_module=query_module,
    )  # fmt: skip


def _prompts(e, st) -> dict[str, Any]:
    """The run's query and document prompts (`embed.query_prompt`, `embed.document_prompt`;
    "auto": the ones the starting directory `st`'s encode_query / encode_document use) and the
    export's prompts, as `Starting` fields."""
    prompts = dict(getattr(st, "prompts", {}))
    chosen = {}
    for task, key in (("query", "query_prompt"), ("document", "document_prompt")):
        own = resolve_prompt(st, task=task)
        given = getattr(e, key)
        chosen[key] = own if given == "auto" else given
        if chosen[key] != own:
            prompts[task] = chosen[key]
    if any(chosen.values()):
        logging.info("prompts: query %r, document %r", *chosen.values())
    default = getattr(st, "default_prompt_name", None)
    return {**chosen, "prompts": prompts, "default_prompt_name": default}


def build_experiment(
    config,
    e: EmbedSettings,
    start: Starting,
    num_train_steps: int,
    devices=None,
    texts_per_pair: int = 2,
):
    """The Experiment every seed trains in: the family's encoder with the contrastive objective
    of the settings, or its masked-LM model with the SPLADE objective (pooling "splade"),
    taking packed batches of `global_batch_size` pairs of `texts_per_pair` texts with
    `embed.pack`."""
    packed = (config.global_batch_size, texts_per_pair) if e.pack else None
    if start.pooling in SPARSE_POOLINGS:
        # SparseEncoderTrainer's count of the warmup's updates:
        warmup_steps = max(1, int(num_train_steps * e.regularizer_warmup_ratio))
        factor = None  # the static query weights' rate over the optimizer's
        if e.query_encoder == "static":
            factor = e.query_learning_rate / config.optimizer.peak_learning_rate
        objective = splade.splade_objective(
            e.query_regularizer_weight,
            e.document_regularizer_weight,
            e.scale,
            e.symmetric,
            packed_shape=packed,
            warmup_steps=warmup_steps,
            ramp=e.regularizer_warmup,
            query_learning_rate_factor=factor,
        )
    else:
        objective = contrastive.contrastive_objective(
            start.pooling,
            e.scale,
            e.symmetric,
            e.checked_dims(start.model_config.hidden_size),
            packed_shape=packed,
        )
    head = families.head_in_family(start.model_config, objective.role)
    return experiment.Experiment.build(
        config, start.model_config, head, objective, num_train_steps, devices
    )


def compile_for_topology(
    config, topology: str, *, num_slices: int = 1, hlo_out: str | None = None
) -> int:
    """Compiles the train step for `topology` (TPU slice or GPUs, `parallel.aot`; one slice:
    `num_slices` is not read) without data:
    a batch of `global_batch_size` pairs [B, 2, L] (L = max_seq_length, 128 by default) in
    `num_microbatches` GradCache chunks; with `embed.pack`, its 2 B texts packed at the most rows
    packing can take (one text a row: [2 B, L], the memory any packed step stays within; an
    inference-free model's B documents, its anchors [B, L] beside them). Prints the report,
    returns the exit status."""
    e = check_config(config, reads_data=False)
    model_config = architecture(config)
    pooling = "mean" if e.pooling == "auto" else e.pooling
    length = e.max_seq_length or DEFAULT_MAX_SEQ_LENGTH
    start = Starting(model_config, pooling, True, length, None)
    exp = build_experiment(config, e, start, 1, aot.topology_devices(topology))
    rows, slots, apart = config.global_batch_size, e.max_segments, exp.objective.anchors_apart
    texts = (1 if apart else 2) * rows  # the texts that run through the model
    layout = batch_layout.contrastive_layout(e.pack, apart)
    batch = batch_layout.abstract_batch(layout, B=rows, T=2, L=length, R=texts, S=slots)
    # A SPLADE model's masked-LM logits: V outputs a token (the head's transform aside).
    outputs = model_config.vocab_size if pooling in SPARSE_POOLINGS else 0
    model_flops = flops.classification_step_flops(
        model_config, [length] * texts, outputs, pooled=False
    )
    return compile_report.report_compiled_step(
        exp, batch, model_flops=model_flops, topology=topology, task="embed", hlo_out=hlo_out
    )


# ---- The run ----
def train_and_evaluate(config, workdir: str | None, mode: str = "train") -> dict[str, Any]:
    """Trains an embedder for every seed of `embed.seeds` (mode "train") or prints the
    shardings ("shardings"; --mode=compile: `compile_for_topology`, through `JOB.run`).

    Flow: settings checked -> starting point (architecture, pooling, tokenizer) -> pairs read and
    featurized -> one Experiment for every seed -> per seed: state from init_from -> step-0 dev
    scores -> Trainer with hooks -> final dev scores -> export.

    Returns:
      {"task": "embed", "seeds": {seed: final and start_ dev scores}, "mean", "std"}.
    """
    e = check_config(config)
    start = starting_point(config, e)
    train, dev, data_files = seed_run.read_train_dev(e, pairs.read_pairs)
    features = pairs.featurize_pairs(start.prompted(train), start.tokenizer, start.max_seq_length)
    dev_set = (
        None
        if dev is None
        else evaluation.retrieval_set(start.prompted(dev), start.tokenizer, start.max_seq_length)
    )
    seed_run.check_batch(config, batching.num_rows(features), f"training pairs of {e.train_file}")
    steps_per_epoch = seed_run.group_batches(config, e, features, e.seeds[0]).steps_per_epoch
    exp = build_experiment(
        config,
        e,
        start,
        steps_per_epoch * e.num_epochs,
        texts_per_pair=features["input_ids"].shape[1],
    )

    args = (config, e, exp, start, features, dev_set)
    return seed_run.run_seeds(
        config, workdir, exp, mode=mode, task="embed", data_files=data_files,
        seeds=list(e.seeds), one_seed=functools.partial(train_seed, *args, num_pairs=len(train)),
    )  # fmt: skip


def train_seed(
    config, block: EmbedSettings, exp, start: Starting, features, dev_set, seed, seed_dir, num_pairs
):
    """One seed (`seed_run.train_seed`, `seed_run.export_plan`): train, score dev retrieval at
    step 0 and at the end, export `seed_dir/hf` as a sentence-transformers directory. Returns the
    final and start_ scores, or None when a signal stopped the run before its last step."""
    plan = seed_run.export_plan(
        config,
        seed_dir,
        view=VIEW,
        score_fn=None
        if dev_set is None
        else lambda params: evaluation.score(
            exp, params, dev_set, block.eval_batch_size, block.max_segments if block.pack else 0
        ),
        card_fn=lambda num_steps, begin, end: model_card(
            config, block, start, exp, num_steps, num_pairs, begin, end
        ),
        export_fn=lambda params, directory, card: export(params, directory, exp, start, card),
    )
    batches = seed_run.group_batches(config, block, features, seed, exp)
    init_values = None  # an inference-free start's query weights, beside its masked LM
    if start.query_module:
        init_values = lambda: {(QUERY_WEIGHT,): read_static_queries(start.query_module)[0]}  # noqa: E731
    return seed_run.train_seed(
        config, exp, batches, block.num_epochs, seed, seed_dir, plan, init_from=config.init_from,
        init_values=init_values,
    )  # fmt: skip


def export(params, directory, exp, start: Starting, card: str) -> str:
    """Writes the model as a sentence-transformers directory (a SparseEncoder's for splade;
    every process gathers the parameters; process 0 writes). Returns where it went."""

    def write(host_params):  # an inference-free model's: its masked LM and query weights
        weights = host_params.get(QUERY_WEIGHT) if isinstance(host_params, Mapping) else None
        save_sentence_transformer(  # the tokenizer writes its own files
            directory,
            exp.model_config,
            host_params if weights is None else host_params[DOCUMENTS],
            tokenizer_dir=start.tokenizer,
            pooling=start.pooling,
            normalize=start.normalize,
            max_seq_length=start.max_seq_length,
            prompts=start.prompts,
            default_prompt_name=start.default_prompt_name,
            card=card,
            query_weights=weights,
        )

    write_from_process_0(params, write)
    kind = "SparseEncoder" if start.pooling in SPARSE_POOLINGS else "SentenceTransformer"
    return f"{directory} (sentence-transformers {kind})"


def model_card(
    config, e: EmbedSettings, start: Starting, exp, num_steps, num_pairs, begin, end
) -> str:
    """The model card's account of the training (markdown): data, loss, batch, pooling,
    schedule, and the dev scores of the starting and the trained model."""
    objective, opt = exp.objective, config.optimizer
    loss = f"MultipleNegatives{'Symmetric' if objective.symmetric else ''}RankingLoss"
    similarity = "cosine similarity"
    if start.pooling in SPARSE_POOLINGS:
        loss = (
            f"SpladeLoss(Sparse{loss}, query_regularizer_weight={objective.query_weight:g}, "
            f"document_regularizer_weight={objective.document_weight:g}: FLOPS"
            + (f", rising ({objective.ramp}) over the first {objective.warmup_steps} steps"
               if objective.warmup_steps else "") + ")"
        )  # fmt: skip
        similarity = "dot product"
    if hasattr(objective, "query_learning_rate_factor"):
        loss += (
            "; inference-free: each query's vector is a weight of each of its tokens, trained at "
            f"peak learning rate {e.query_learning_rate:g} (sentence-transformers' "
            "SparseStaticEmbedding)"
        )
    chunks = config.num_microbatches
    items = [
        f"loss: in-batch negatives softmax ({loss}), {similarity} x {objective.scale:g}; "
        "the negatives of each anchor: every other positive and hard negative of the global "
        f"batch of {config.global_batch_size} pairs"
        + (f" (GradCache, {chunks} chunks)" if chunks > 1 else ""),
        f"pooling: {start.pooling}; normalized: {start.normalize}; max_seq_length: "
        f"{start.max_seq_length}",
        f"{num_steps} steps ({e.num_epochs} epoch(s)), {opt.name} at peak learning rate "
        f"{opt.peak_learning_rate:g}, {opt.schedule} schedule, seed {config.seed}",
    ]
    if objective.dims:
        items.insert(1, f"Matryoshka dimensions: {', '.join(map(str, objective.dims))}")
    if start.query_prompt or start.document_prompt:
        items.insert(1, f"prompts: {start.query_prompt!r} before each query (anchor), "
                        f"{start.document_prompt!r} before each document")  # fmt: skip
    dev = None
    if end:
        title = f"Dev retrieval (`{e.dev_file}`: each anchor's positive among every dev document):"
        rows = [(k, f"{begin.get(k, float('nan')):.4f}", f"{v:.4f}") for k, v in end.items()]
        dev = (title, ("metric", "start", "trained"), rows)
    data = f"{num_pairs:,} pairs of `{e.train_file}`"
    lines = training_section("embedding job", config, data, items, dev)
    return "\n".join(lines) + "\n"


JOB = register(Job(("embed",), "embed", check_config, train_and_evaluate, compile_for_topology))
