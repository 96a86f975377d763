"""Every model family of the registry (`bert_jax.models.families.FAMILIES`) through every job and
command, as users run them, on the family's fixture (tests/family_fixtures.py: a tiny model with
its tokenizer, saved as transformers saves them). A family added to the registry is tested here
with no test edited: it adds its row to `family_fixtures.FIXTURES`.

  jobs        `train.py` (its main, in this process) for two steps from the fixture: pretraining
              with the family's recipe (`configs/pretrain.py:arch=<model_type>`), fine-tuning of
              each kind of task the registry has (`FINETUNING`), and the embedding job, whose
              sentence-transformers export `SentenceTransformer` encodes as `python -m
              bert_jax.inference embed` does
  commands    `python -m bert_jax.inference` embed, predict, attention and fill-mask, each
              output against the family's model applied directly to the saved weights
  compile     `train.py --mode=compile` of fine-tuning for a GPU card and a TPU slice (-m e2e)
  layers      the stack scanned and rematerialized against the loop (or refused where the
              family never scans); the texts packed several to a row against one a row
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Callable

import jax
import numpy as np
import pytest

from bert_jax import convert, inference, tokenization
from bert_jax.checkpoints import pretrained, table
from bert_jax.data.sentence_features import encode_texts
from bert_jax.finetune import tasks
from bert_jax.inference.__main__ import main as inference_main
from bert_jax.models import families
from bert_jax.models.config import RuntimeConfig
from bert_jax.models.params import stack_layers, unstack_layers
from tests import family_fixtures
from tests.embed.embed_test import translated_pairs, write_jsonl, write_table
from tests.finetune import run_test as finetune_data

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXTS = [
    "When shall we three meet again in thunder, lightning, or in rain?",
    "Fair is foul, and foul is fair.",
    "Hover through the fog and filthy air.",
]
LABELS = ("comedy", "history", "tragedy")
STEPS = 2


# EuroBERT's slow rows (its pretraining, fine-tuning, embedding, packing, scan, predict and
# fill-mask runs: 215 s of its 275 s on 2 cores) run out of the default stage: ModernBERT runs the
# same rotary, packed, no-token-type code by default, tests/models/toy_family_test.py the pre-norm
# stack scanned, and tests/models/eurobert_test.py its packed rows. Jina-embeddings-v3's slow rows
# (103 s of its 118 s on 2 cores) run out of it too: XLM-R's runs the same tokenizer and heads by
# default, ModernBERT's rotary positions, and tests/models/jina_embeddings_v3_test.py every head
# against transformers, its packed rows and its scanned layers. The families added last: most of
# their rows run with -m e2e or -m full (each use says where the same code runs by default).
LATEST = ("nomic_bert", "gte", "eurobert", "mpnet", "jina_embeddings_v3")
# CI's two stages hold each check on families of every stack (post-LayerNorm, disentangled,
# relative buckets, pre- and post-norm rotary); the rest of the matrix is marked `full` and runs
# with `make test-full` (docs/development.md): `family_fixtures.family_params`.
family_params = family_fixtures.family_params


@pytest.fixture(scope="module", params=list(families.FAMILIES))
def fam(request, tmp_path_factory) -> family_fixtures.FamilyDir:
    """The family's fixture directory: its masked LM and tokenizer."""
    return family_fixtures.make_family_dir(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def classifier(fam, tmp_path_factory) -> family_fixtures.FamilyDir:
    """The family's sequence classifier (3 named labels), randomly initialized and saved."""
    config = fam.config.replace(num_labels=len(LABELS), label_names=LABELS)
    head = family_fixtures.head_of(config, "classification")
    out = tmp_path_factory.mktemp(f"{fam.model_type}_classifier")
    params = family_fixtures.save_model(config, fam.tokenizer, head, out, seed=1)
    return dataclasses.replace(fam, config=config, head=head, params=params, path=out)


# --------------------------------------------------------------------------------------------
# Every head against transformers
# --------------------------------------------------------------------------------------------
# Full rows and right-padded ones (4 rows of 9 tokens: 2 x 2 as multiple-choice's choices).
MASK = np.array([[1] * 9, [1] * 5 + [0] * 4, [1] * 7 + [0] * 2, [1] * 9])


# The families whose own tests (tests/models/<family>_test.py) hold every head to transformers
# on more variants than here run with -m full, for CI's time.
@pytest.mark.torch
@pytest.mark.parametrize(
    "fam",
    family_params(full=LATEST),
    indirect=True,
)
def test_every_head_equals_transformers(fam):
    """Each class of the family's row (`Family.roles`) on the fixture's odd config, converted
    from transformers' class of the same name: logits, hidden states and attention maps within
    1e-5 at real tokens, with no weight missing or unused. A class transformers lacks (DeBERTa-v3's
    replaced-token detector, whose head is microsoft/DeBERTa's) is converted from transformers'
    encoder of its family: its hidden states and maps equal, only its head's weights new."""
    import transformers

    from bert_jax.checkpoints import hf, verify
    from bert_jax.inference import loading

    for role, cls in fam.family.roles.items():
        head = cls.__name__
        config = fam.config.replace(num_labels=2 if role == families.Role.QUESTION_ANSWERING else 3)
        own = not hasattr(transformers, head)  # a class of this project's: its encoder compared
        reference = family_fixtures.transformers_model(
            config, fam.family.base_model if own else head
        )
        rng = np.random.default_rng(0)
        ids = np.where(
            MASK == 1, rng.integers(5, config.vocab_size, MASK.shape), config.pad_token_id
        )
        types = (
            (np.arange(9) >= 4).astype(np.int64)
            * MASK
            % max(1, getattr(config, "type_vocab_size", 1))
        )
        model = cls(config)
        inputs = {
            "input_ids": ids,
            "attention_mask": MASK,
            **loading.token_type_inputs(model, types),
        }
        choices = role == families.Role.MULTIPLE_CHOICE
        if choices:  # [2, 2, L]: the rows paired as choices
            inputs = {k: v.reshape(2, 2, 9) for k, v in inputs.items()}
        state = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
        params, report = hf.hf_state_to_params(config, state, head, allow_new_heads=own)
        assert not report.unused, (head, report.summary())
        structural = re.compile(fam.family.conversion.structural)
        new = [k for k in report.newly_initialized if not own or structural.search(k)]
        assert not new, (head, report.summary())
        ours = jax.jit(
            lambda p, x, model=model: model.apply(
                {"params": p}, **x, output_hidden_states=True, output_attentions=True
            )
        )(params, inputs)
        ours, theirs = verify.named_outputs(ours), verify.torch_outputs(reference, inputs)
        if own:  # the encoder's states and maps; the head's logits one per token
            assert ours.pop("logits").shape == MASK.shape, head
            theirs.pop("last_hidden_state")
        assert set(ours) == set(theirs), (head, sorted(ours), sorted(theirs))
        assert len(theirs) >= (not own) + 3 + 2, (head, sorted(theirs))  # output, states, maps
        real = MASK.astype(bool)
        for name, value in theirs.items():
            a = ours[name]
            if a.ndim >= 2 and a.shape[:2] == MASK.shape:  # per token: its real ones
                a, value = a[real], value[real]
            elif a.ndim == 4 and a.shape[0] == MASK.shape[0]:  # attention maps: real queries
                a, value = a.transpose(0, 2, 1, 3)[real], value.transpose(0, 2, 1, 3)[real]
            np.testing.assert_allclose(a, value, atol=1e-5, err_msg=f"{head} {name}")


# --------------------------------------------------------------------------------------------
# train.py's jobs
# --------------------------------------------------------------------------------------------
def train_py(config_arg: str, workdir, **overrides) -> None:
    """`python train.py --config=configs/<config_arg> --workdir=<workdir> --config.K=V ...` in
    this process: train.py's flags parsed, each override set on the parsed config as its
    `--config.K=V` flag sets it (type-checked, the config locked), then train.py's main. No
    persistent compilation cache: it would stay on for the rest of this process."""
    import train

    flags = train.FLAGS
    was_parsed = flags.is_parsed()  # absl logs to stderr past a progress bar while unparsed
    config = f"--config={ROOT / 'configs' / config_arg}"
    flags(["train.py", config, f"--workdir={workdir}", "--compilation_cache_dir=off"])
    try:
        for key, value in overrides.items():
            node = flags.config
            *path, last = key.split(".")
            for name in path:
                node = node[name]
            node[last] = value
        assert train.main([]) is None
    finally:
        flags.unparse_flags()  # the overrides' values go; the process's parsed state stays
        if was_parsed:
            flags.mark_as_parsed()


def train_rows(workdir) -> dict[int, dict]:
    """metrics.jsonl's training rows by step."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    return {r["step"]: r for r in rows if "train/loss" in r}


def check_export(fam, hf_dir, objective: str) -> None:
    """`hf_dir` is a transformers directory of the family's head for `objective`, with the
    fixture's tokenizer beside it, and `pretrained.load` reads it back."""
    written = json.loads((pathlib.Path(hf_dir) / "config.json").read_text())
    assert written["model_type"] == fam.model_type, written
    assert written["architectures"] == [family_fixtures.head_of(fam.config, objective)], written
    exported = tokenization.load_tokenizer(hf_dir)
    assert type(exported) is type(fam.tokenizer)
    assert exported.fingerprint() == fam.tokenizer.fingerprint()
    loaded = pretrained.load(str(hf_dir))
    assert type(loaded.config) is type(fam.config)


# ELECTRA's, BERT's and RoBERTa's runs out of the default stage, for the suite's time:
# DeBERTa-v3's runs the same replaced-token detection job (rtd_test checks ELECTRA's tied
# embeddings in the loss), `make pretrain` runs BERT's recipe in tests/pretrain/main_job_test.py,
# and XLM-R's runs RoBERTa's model with the harder tokenizer (and RoBERTa's recipe, which MPNet's
# is). CI runs ELECTRA's and GTE's (post-norm rotary) beside the default rows; -m full the rest:
# NomicBERT's stack is GTE's, EuroBERT's ModernBERT's, Jina-v3's XLM-R's.
@pytest.mark.parametrize(
    "fam",
    family_params(
        e2e=("electra", "gte"),
        full=("bert", "roberta", "nomic_bert", "eurobert", "mpnet", "jina_embeddings_v3"),
    ),
    indirect=True,
)
def test_pretraining_with_the_familys_recipe(fam, tmp_path):
    """`configs/pretrain.py:arch=<model_type>`, its data built with the fixture's tokenizer as
    the recipe makes its examples (NSP pairs, full sentences, dynamic masking), two steps from
    the fixture (init_from) with a held-out evaluation, exported as the recipe's head."""
    from bert_jax.pretrain.data import build

    recipe = family_fixtures.load_config("pretrain.py", f"arch={fam.model_type}")
    options = build.PretrainingOptions(
        max_seq_length=32,
        max_predictions_per_seq=5,
        masked_lm_prob=recipe.data.masked_lm_prob,
        next_sentence_prediction=recipe.job == "pretraining",  # NSP pairs for BERT's job only
        static_masking=not recipe.data.dynamic_masking,
        dupe_factor=1,
        full_sentences=recipe.data.get("full_sentences", False),
    )
    data = tmp_path / "data"
    build.build_pretraining_shards(
        family_fixtures.documents(), data, fam.tokenizer, options, num_shards=2, num_workers=1,
        progress=False,
    )  # fmt: skip
    model = {f"model.{k}": v for k, v in families.model_fields(fam.config).items()}
    train_py(
        f"pretrain.py:arch={fam.model_type}",
        tmp_path / "run",
        init_from=str(fam.path),
        **model,
        **{"data.source": "records", "data.paths": str(data)},
        **{"data.max_seq_length": 32, "data.max_predictions_per_seq": 5},
        global_batch_size=8,
        num_train_steps=STEPS,
        eval_every_steps=STEPS,
        num_eval_steps=1,
        log_every_steps=1,
        checkpoint_every_steps=STEPS,
    )
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows if "eval/mlm_accuracy" in r] == [0, STEPS]
    rows = train_rows(tmp_path / "run")
    assert sorted(rows) == [1, 2] and all(math.isfinite(r["train/loss"]) for r in rows.values())
    check_export(fam, tmp_path / "run" / "hf", recipe.job)


@dataclasses.dataclass(frozen=True)
class FinetuneCase:
    """A task of one kind (its objective): the task, the writer of its files into a directory,
    and its settings."""

    task: str
    write: Callable[[pathlib.Path], None]
    settings: dict


def _squad(folder: pathlib.Path) -> None:
    rng = np.random.default_rng(3)
    finetune_data.squad_file(folder / "train-v1.1.json", rng, 16)
    finetune_data.squad_file(folder / "dev-v1.1.json", rng, 8)


def _conll(folder: pathlib.Path) -> None:
    rng = np.random.default_rng(2)
    finetune_data.conll_file(folder / "train.txt", rng, 16)
    finetune_data.conll_file(folder / "valid.txt", rng, 8)


# One task of each kind (the objectives of `tasks.TASKS`), on small files of its format.
FINETUNING = {
    "classification": FinetuneCase("custom", finetune_data.sentiment_files, {}),
    "regression": FinetuneCase(
        "custom",
        lambda folder: finetune_data.regression_files(folder, np.random.default_rng(1)),
        {"finetune.regression": True, "finetune.label_column": "score"},
    ),
    "token_classification": FinetuneCase("conll2003", _conll, {}),
    "question_answering": FinetuneCase(
        "squad1", _squad, {"finetune.doc_stride": 16, "finetune.max_query_length": 8}
    ),
    "multiple_choice": FinetuneCase(
        "swag", lambda folder: finetune_data.swag_files(folder, np.random.default_rng(4)), {}
    ),
}


def test_every_kind_of_task_is_fine_tuned_here():
    kinds = {t.objective for t in tasks.TASKS.values() if t.objective}
    assert kinds <= set(FINETUNING), f"add a task of each kind to FINETUNING: {kinds}"


# Sequence classification for every family in the default suite but these, out of it: BERT
# (its every kind trains in tests/finetune/run_test.py by default), MPNet (its classifier is
# RoBERTa's), EuroBERT (ModernBERT's pre-norm rotary job runs by default) and NomicBERT and
# Jina-v3 (GTE's runs by default: the one post-norm rotary family, prenorm.py's stack, whose
# job runs there; tests/models/gte_test.py holds its heads to transformers and its packed rows):
# -m full, for CI's time.
CLASSIFIED_IN_FULL = ("bert", "nomic_bert", "eurobert", "mpnet", "jina_embeddings_v3")
# Each other kind of task, out of the default stage, on one family each, every kind on families of
# different stacks (post-LayerNorm, disentangled, relative buckets, pre-norm rotary, post-norm
# rotary): the heads are shared classes (`models.heads`) that test_every_head_equals_transformers
# holds to transformers in every family. BERT trains every kind in tests/finetune/run_test.py by
# default, ModernBERT its token, question-answering and multiple-choice heads in
# tests/finetune/modernbert_test.py. A new family names its kind here (the test below says so).
OTHER_KIND = {
    "roberta": "multiple_choice",
    "xlm-roberta": "question_answering",
    "electra": "token_classification",
    "deberta-v2": "multiple_choice",
    "mpnet": "question_answering",
    "modernbert": "regression",
    "eurobert": "token_classification",
    "gte": "regression",
    "nomic_bert": "token_classification",
    "jina_embeddings_v3": "question_answering",
}
# CI runs each kind once, on families of four stacks; the second family of each kind, -m full.
OTHER_KIND_IN_CI = ("deberta-v2", "xlm-roberta", "nomic_bert", "gte")


def test_every_family_fine_tunes_another_kind_and_every_kind_two_families():
    assert set(OTHER_KIND) == set(families.FAMILIES) - {"bert"}
    kinds = collections.Counter(OTHER_KIND.values())
    assert set(kinds) == set(FINETUNING) - {"classification"} and min(kinds.values()) >= 2, kinds
    assert sorted(OTHER_KIND[f] for f in OTHER_KIND_IN_CI) == sorted(kinds)  # each kind in CI


@pytest.mark.parametrize(
    "fam, objective",
    [
        pytest.param(f, "classification", marks=[pytest.mark.full] if f in CLASSIFIED_IN_FULL else [],
                     id=f"classification-{f}")
        for f in families.FAMILIES
    ]
    + [pytest.param(f, k, marks=pytest.mark.e2e if f in OTHER_KIND_IN_CI else pytest.mark.full,
                    id=f"{k}-{f}") for f, k in OTHER_KIND.items()],
    indirect=["fam"],
)  # fmt: skip
def test_finetuning(fam, tmp_path, objective):
    """Two steps of 8 rows from the fixture (its tokenizer found beside it), the evaluation and
    the prediction files, exported as the family's head of the task's kind."""
    if family_fixtures.objective_role(objective) not in fam.family.roles:
        pytest.skip(f"{fam.model_type} has no head for {objective} (transformers has none)")
    case = FINETUNING[objective]
    case.write(tmp_path)
    train_py(
        f"finetune.py:task={case.task}",
        tmp_path / "run",
        init_from=str(fam.path),
        global_batch_size=8,
        log_every_steps=1,
        **{"finetune.data_dir": str(tmp_path), "finetune.max_seq_length": 32},
        **{"finetune.num_epochs": 1, "finetune.max_train_examples": 8 * STEPS},
        **{"finetune.max_eval_examples": 8},
        **case.settings,
    )
    # A question's context may take two windows of 32 tokens: a step or two more.
    rows = train_rows(tmp_path / "run")
    assert sorted(rows) == list(range(1, len(rows) + 1)) and len(rows) >= STEPS
    assert all(math.isfinite(r["train/loss"]) for r in rows.values())
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["mean"] and all(math.isfinite(v) for v in results["mean"].values()), results
    assert any((tmp_path / "run" / "predictions").iterdir())
    check_export(fam, tmp_path / "run" / "hf", objective)


def train_py_command(config_arg: str, workdir, tmp_path, **overrides) -> None:
    """`python train.py --config=configs/<config_arg> --workdir=<workdir> --config.K=V ...` as a
    user starts it: a process of its own, no HF_* variable, a fresh HOME (`commands_test`)."""
    from tests.commands_test import clean_env

    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    cmd = [sys.executable, str(ROOT / "train.py"), f"--config={ROOT / 'configs' / config_arg}",
           f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in overrides.items())]  # fmt: skip
    proc = subprocess.run(
        cmd, env=clean_env(home), cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


# ELECTRA's, RoBERTa's and BERT's runs out of the default stage, for the suite's time: XLM-R's
# runs RoBERTa's model with the harder tokenizer, tests/embed/embed_test.py runs BERT's job and
# export, and exports_test loads every family's export in sentence-transformers (MPNet's and
# DeBERTa-v3's too; DeBERTa-v3's run, 18 s, is e2e as well: its encoder trains in its pretraining
# row). CI's e2e stage runs the job on GTE (post-norm rotary), MPNet (relative buckets) and
# Jina-v3 (its adapters) beside the default rows; -m full the rest.
@pytest.mark.parametrize(
    "fam",
    family_params(
        e2e=("gte", "mpnet", "jina_embeddings_v3"),
        full=("electra", "roberta", "bert", "deberta-v2", "nomic_bert", "eurobert"),
    ),
    indirect=True,
)
def test_embedding_job_exports_a_sentence_transformer(fam, tmp_path):
    """Two contrastive steps from the fixture, dev retrieval scored, the command run as a user
    starts it; the export's `SentenceTransformer(DIR).encode` equals `python -m
    bert_jax.inference embed --model DIR`."""
    st = pytest.importorskip("sentence_transformers")
    rng = np.random.default_rng(0)
    write_jsonl(tmp_path / "train.jsonl", translated_pairs(rng, 8 * STEPS))
    dev = translated_pairs(rng, 8)
    write_table(tmp_path / "dev.csv", ["anchor", "positive"], [[r["anchor"], r["positive"]] for r in dev])  # fmt: skip
    workdir = tmp_path / "run"
    train_py_command(
        "embed.py:size=tiny",
        workdir,
        tmp_path,
        init_from=str(fam.path),
        global_batch_size=8,
        log_every_steps=1,
        **{"embed.train_file": str(tmp_path / "train.jsonl")},
        **{"embed.dev_file": str(tmp_path / "dev.csv"), "embed.max_seq_length": 32},
    )
    rows = train_rows(workdir)
    assert sorted(rows) == [1, 2] and all(math.isfinite(r["train/loss"]) for r in rows.values())
    assert json.loads((workdir / "results.json").read_text())["mean"]["ndcg@10"] >= 0
    ours = _embed_command(workdir / "hf", tmp_path)
    theirs = st.SentenceTransformer(str(workdir / "hf"), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)


# --------------------------------------------------------------------------------------------
# python -m bert_jax.inference
# --------------------------------------------------------------------------------------------
def _texts_file(tmp_path) -> str:
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return str(path)


def _embed_command(model_dir, tmp_path, *flags) -> np.ndarray:
    out = tmp_path / "embeddings.npy"
    argv = ["embed", "--model", str(model_dir), "--input", _texts_file(tmp_path)]
    assert inference_main([*argv, "--output", str(out), *flags]) == 0
    return np.load(out)


def _ids(fam, text: str) -> np.ndarray:
    """The token ids [1, n] of `text` alone, as the commands lay out a row of the family."""
    features, _ = encode_texts(fam.tokenizer, [text], None, 64)
    return features["input_ids"][:, : int(features["attention_mask"].sum())]


def _apply(fam, head: str | None, text: str, **kwargs):
    """The family's `head` (None: its encoder, on the head's encoder weights) applied to `text`."""
    family = fam.family
    if head is None:
        model = families.get_model_class(family.base_model)(fam.config, add_pooling_layer=False)
        params = fam.params[family.encoder_name]
    else:
        model, params = families.get_model_class(head)(fam.config), fam.params
    return model.apply({"params": params}, _ids(fam, text), **kwargs)


# XLM-R's run out of the default stage here and below, for the suite's time: RoBERTa's runs the
# same model; MPNet's too (tests/models/mpnet_test.py checks its packed rows against rows alone).
# BERT's too, here: tests/inference/inference_test.py checks its embed command the same way; and
# DeBERTa-v3's (26 s): tests/models/deberta_test.py holds its encoder's output to transformers',
# and ModernBERT's row runs the command on a family without token types. CI's e2e stage:
# DeBERTa-v3's, MPNet's and Jina-v3's; -m full the rest.
@pytest.mark.parametrize(
    "fam",
    family_params(
        e2e=("deberta-v2", "mpnet", "jina_embeddings_v3"),
        full=("xlm-roberta", "bert", "nomic_bert", "gte", "eurobert"),
    ),
    indirect=True,
)
def test_embed_equals_the_encoder_applied_directly(fam, tmp_path):
    """Mean and CLS pooling, and the hidden states of chosen layers, of the fixture's encoder."""
    states = [_apply(fam, None, t, output_hidden_states=True).hidden_states for t in TEXTS]
    mean = _embed_command(fam.path, tmp_path, "--pooling", "mean", "--batch_size", "2")
    np.testing.assert_allclose(mean, [s[-1][0].mean(0) for s in states], atol=2e-5)
    cls = _embed_command(fam.path, tmp_path, "--layers", "0,-1")
    assert cls.shape == (len(TEXTS), 2, fam.config.hidden_size) and cls.dtype == np.float32
    np.testing.assert_allclose(cls[:, 0], [s[0][0, 0] for s in states], atol=2e-5)
    np.testing.assert_allclose(cls[:, 1], [s[-1][0, 0] for s in states], atol=2e-5)


def _texts_of_two_row_lengths(n: int = 9) -> list[str]:
    """`n` texts of 3 to 64 tokens (one truncated): most share packed rows of
    `batches.ROW_TOKENS`, the longer get rows of their own length bucket, and a batch of 3 leaves
    a last one part full."""
    words = " ".join(TEXTS).split()
    return [" ".join(words[i : i + 1 + (i * 4) % 13]) for i in range(n - 2)] + [
        " ".join(words + words)[:150], " ".join(words)[:130]
    ]  # fmt: skip


# MPNet's out of the default stage too: tests/models/mpnet_test.py checks its scanned and
# rematerialized layers against the loop (XLM-R's: see above). CI's e2e stage: GTE's and
# Jina-v3's; -m full the rest (tests/models/toy_family_test.py scans the pre-norm stack by
# default).
@pytest.mark.parametrize(
    "fam",
    family_params(
        e2e=("gte", "jina_embeddings_v3"), full=("xlm-roberta", "nomic_bert", "eurobert", "mpnet")
    ),
    indirect=True,
)
def test_scanned_and_rematerialized_layers_equal_the_loop(fam):
    """The stack scanned over the stacked tree and rematerialized (`scan_layers`,
    `remat_policy="full"`) gives the loop's multiple-choice logits and gradients within 1e-5,
    where the family's row names a scanned layer; a family that never scans refuses it. A
    family without a multiple-choice head (EuroBERT) is checked on its sequence classifier."""
    choices = families.Role.MULTIPLE_CHOICE in fam.family.roles
    head = family_fixtures.head_of(fam.config, "multiple_choice" if choices else "classification")
    model_class = families.get_model_class(head)
    if families.FAMILIES[fam.model_type].scanned_layer is None:
        with pytest.raises(ValueError, match="scan_layers"):
            model_class(fam.config, RuntimeConfig(scan_layers=True)).init(
                jax.random.PRNGKey(0), np.ones((1, 2, 5), np.int32)
            )
        return
    params = family_fixtures.random_params(fam.config, head, seed=2)
    params = jax.tree_util.tree_map(  # biases and norm scales off their initial values too
        lambda x: x + np.random.default_rng(x.size).normal(0, 0.1, x.shape).astype(x.dtype), params
    )
    ids = np.random.default_rng(0).integers(5, fam.config.vocab_size, MASK.shape)
    inputs = dict(input_ids=ids, attention_mask=MASK)
    if getattr(fam.config, "type_vocab_size", 0) > 1:
        inputs["token_type_ids"] = (np.arange(MASK.shape[1]) >= 5) * MASK
    inputs = {k: v.reshape(2, 2, -1) if choices else v for k, v in inputs.items()}
    inputs = {k: v.astype(np.int32) for k, v in inputs.items()}

    def loss_and_grad(runtime, p):
        model = model_class(fam.config, runtime)
        loss = lambda p: model.apply({"params": p}, **inputs).logits.sum()  # noqa: E731
        return jax.jit(jax.value_and_grad(loss))(p)

    loss, grad = loss_and_grad(RuntimeConfig(), params)
    scanned = RuntimeConfig(scan_layers=True, remat_policy="full")
    loss2, grad2 = loss_and_grad(scanned, stack_layers(params))
    np.testing.assert_allclose(loss, loss2, rtol=1e-5)
    assert table.max_difference(grad, unstack_layers(grad2)) < 1e-5


# CI's e2e stage: NomicBERT's and Jina-v3's; -m full the rest (tests/models/gte_test.py,
# eurobert_test.py and mpnet_test.py check their packed rows against rows alone).
@pytest.mark.parametrize(
    "fam",
    family_params(
        e2e=("nomic_bert", "jina_embeddings_v3"), full=("xlm-roberta", "gte", "eurobert", "mpnet")
    ),
    indirect=True,
)
def test_packed_rows_equal_one_text_a_row(fam, classifier):
    """CLS (normalized), mean and the pooler where the family has one, chosen layers, and a
    classifier's logits of pairs: the texts packed several to a row (the default) equal them
    one a row within 1e-5, and a row length holds texts of at most its length
    (`batches.row_groups`)."""
    texts = _texts_of_two_row_lengths()
    encoded = inference.batches.features(fam.tokenizer, texts, None, 64)
    lengths = encoded["attention_mask"].sum(1)
    groups = inference.batches.row_groups(lengths, inference.inference_buckets(64))
    assert sorted(np.concatenate(list(groups.values()))) == list(range(9))
    assert all(lengths[texts].max() <= length for length, texts in groups.items())
    assert len(groups[inference.batches.ROW_TOKENS]) >= 4 and max(groups) == 64
    model = (classifier.config, classifier.params, classifier.tokenizer)  # its pooler too
    poolings = ["cls", "mean"] + ["pooler"] * (fam.model_type == "bert")  # others read [CLS]
    for pooling in poolings:
        kwargs = dict(
            pooling=pooling,
            layers=[0, -1] if pooling == "mean" else None,
            normalize=pooling == "cls",
            batch_size=3,
            max_seq_length=64,
        )
        packed = inference.embed(*model, texts, **kwargs)
        padded = inference.embed(*model, texts, pack=False, bucket_lengths=False, **kwargs)
        np.testing.assert_allclose(packed, padded, atol=1e-5, err_msg=pooling)
    head = (classifier.config, classifier.params, classifier.head, classifier.tokenizer)
    kwargs = dict(batch_size=3, max_seq_length=64)
    packed = inference.predict(*head, texts, texts[::-1], **kwargs)
    padded = inference.predict(*head, texts, texts[::-1], pack=False, bucket_lengths=False, **kwargs)  # fmt: skip
    for a, b in zip(packed, padded, strict=True):
        assert a["label"] == b["label"]
        np.testing.assert_allclose(list(a["probabilities"].values()), list(b["probabilities"].values()), atol=1e-5)  # fmt: skip


def test_texts_longer_than_the_models_positions_are_cut_to_them(fam, classifier):
    """`embed` and `predict` at their default max_seq_length (128) on a model of fewer
    positions: a longer text is cut to the model's `max_sequence_length`, as `fill_mask` and the
    bulk job cut it, rather than failing inside the model."""
    limit = fam.config.max_sequence_length
    long = " ".join(" ".join(TEXTS).split() * 4)
    whole = inference.batches.features(fam.tokenizer, [long], None, 512)["attention_mask"].sum()
    assert whole > 128 > limit
    ids = inference.batches.features(fam.tokenizer, [long], None, limit)["input_ids"]
    family = fam.family
    encoder = families.get_model_class(family.base_model)(fam.config, add_pooling_layer=False)
    hidden = encoder.apply({"params": classifier.params[family.encoder_name]}, ids)
    model = (classifier.config, classifier.params, classifier.tokenizer)
    embedded = inference.embed(*model, [long, TEXTS[0]], pooling="mean")
    np.testing.assert_allclose(embedded[0], hidden.last_hidden_state[0].mean(0), atol=2e-5)
    rows = inference.predict(*model[:2], classifier.head, classifier.tokenizer, [long, TEXTS[0]])
    assert [sorted(r["probabilities"]) for r in rows] == [sorted(LABELS)] * 2


# BERT's out of the default stage, for the suite's time: tests/inference/inference_test.py runs a
# BERT classifier through the same command; MPNet's, whose classifier is RoBERTa's. All -m full:
# six families run the command by default.
@pytest.mark.parametrize(
    "fam", family_params(full=("bert", "nomic_bert", "gte", "eurobert", "mpnet")), indirect=True
)
def test_predict_gives_the_classifier_labels(classifier, tmp_path):
    out = tmp_path / "out.jsonl"
    argv = ["predict", "--model", str(classifier.path), "--input", _texts_file(tmp_path)]
    assert inference_main([*argv, "--output", str(out), "--batch_size", "2"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["text"] for r in rows] == TEXTS
    for text, row in zip(TEXTS, rows, strict=True):
        probs = np.asarray(jax.nn.softmax(_apply(classifier, classifier.head, text).logits[0]))
        assert row["label"] == LABELS[int(np.argmax(probs))]
        np.testing.assert_allclose([row["probabilities"][k] for k in LABELS], probs, atol=1e-5)


def test_predict_refuses_a_model_without_a_classifier(fam, classifier, tmp_path, capsys):
    argv = ["predict", "--model", str(fam.path), "--input", _texts_file(tmp_path)]
    assert inference_main([*argv, "--output", str(tmp_path / "o.jsonl")]) == 1
    err = capsys.readouterr().err
    assert f"predict needs a sequence classifier ({classifier.head}), not {fam.head}" in err


def test_attention_map_is_the_encoders(fam, tmp_path):
    out = tmp_path / "map.png"
    argv = ["attention", "--model", str(fam.path), "--text", TEXTS[0]]
    assert inference_main([*argv, "--layer", "1", "--head", "2", "--output", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config, params, _, tokenizer = inference.load(str(fam.path))
    probs = inference.attention_map(config, params, tokenizer, TEXTS[0], 1, 2, str(out))
    expected = np.asarray(_apply(fam, None, TEXTS[0], output_attentions=True).attentions[1][0, 2])
    assert probs.shape == expected.shape and probs.shape[0] > 8
    np.testing.assert_allclose(probs, expected, atol=1e-6)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)


def _queries(mask: str) -> list[str]:
    """Two texts with `mask`: one, then two of them."""
    return [f"fair is {mask}, and foul is fair", f"{mask} shall we three {mask} again"]


# BERT's out of the default stage, for the suite's time: tests/inference/fill_mask_test.py checks
# a BERT's fill-mask against transformers' pipeline, and tests/pretrain/main_job_test.py the main
# job's; MPNet's, whose <mask> and MLM head are RoBERTa's. CI's e2e stage: EuroBERT's and
# Jina-v3's tokenizers; -m full the rest.
@pytest.mark.parametrize(
    "fam",
    family_params(
        e2e=("eurobert", "jina_embeddings_v3"), full=("bert", "nomic_bert", "gte", "mpnet")
    ),
    indirect=True,
)
@pytest.mark.parametrize("spelling", ["own", "[MASK]"], ids=["its-mask-token", "MASK-placeholder"])
def test_fill_mask_gives_the_masked_lm_top_tokens(fam, capsys, spelling):
    """The texts spell the mask as the family's tokenizer does ("[MASK]", "<mask>"), or as the
    command documents it for every family ("[MASK]")."""
    own = fam.tokenizer.tokenizer.id_to_token(fam.tokenizer.mask_id)
    if spelling == own:
        pytest.skip(f"{fam.model_type}'s own mask token is {own}: the its-mask-token case")
    queries = _queries(own if spelling == "own" else spelling)
    argv = ["fill-mask", "--model", str(fam.path), "--json", "--top_k", "3"]
    assert inference_main([*argv, *queries]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == queries and [len(r["masks"]) for r in rows] == [1, 2]
    for text, row in zip(_queries(own), rows, strict=True):
        probs = np.asarray(jax.nn.softmax(_apply(fam, fam.head, text).logits[0]))
        positions = np.flatnonzero(_ids(fam, text)[0] == fam.tokenizer.mask_id)
        for position, candidates in zip(positions, row["masks"], strict=True):
            top = np.argsort(-probs[position])[:3]
            assert [c["token_id"] for c in candidates] == top.tolist()
            tokens = [fam.tokenizer.tokenizer.id_to_token(int(t)) for t in top]
            assert [c["token"] for c in candidates] == tokens
            np.testing.assert_allclose([c["score"] for c in candidates], probs[position, top], atol=1e-5)  # fmt: skip


def test_fill_mask_refuses_a_model_without_a_masked_lm_head(fam, classifier, capsys):
    directory = str(classifier.path)
    assert inference_main(["fill-mask", "--model", directory, _queries("[MASK]")[0]]) == 1
    err = capsys.readouterr().err
    assert f"{directory} has no masked-LM head (it holds a {classifier.head})" in err
    assert fam.head in err


# --------------------------------------------------------------------------------------------
# python -m bert_jax.convert and inference rerank on the jobs' exports, as users start them
# --------------------------------------------------------------------------------------------
def command(module: str, *argv, tmp_path) -> subprocess.CompletedProcess:
    """`python -m <module> ARGV` as a user starts it: a process of its own, no HF_* variable, a
    fresh HOME (`commands_test.clean_env`), run to its end."""
    from tests.commands_test import clean_env

    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", module, *map(str, argv)]
    return subprocess.run(
        cmd, env=clean_env(home), cwd=tmp_path, capture_output=True, text=True, timeout=600
    )


def other_family(fam) -> families.Family:
    """A family of the registry other than `fam`'s (the first: BERT, or DeBERTa-v2 for BERT)."""
    return next(f for f in families.FAMILIES.values() if f.model_type != fam.model_type)


@pytest.fixture(scope="module")
def pretraining_run(fam, tmp_path_factory) -> family_fixtures.FamilyDir:
    """A run directory holding what the family's pretraining recipe (`configs/pretrain.py:
    arch=<model_type>`) exports as the run's model, randomly initialized: `export/` in
    bert_jax's format with the fixture's tokenizer (DeBERTa-v3's replaced-token detector,
    ELECTRA's discriminator, BERT's pretraining heads, the others' masked LM)."""
    recipe = family_fixtures.load_config("pretrain.py", f"arch={fam.model_type}")
    head = family_fixtures.head_of(fam.config, recipe.job)
    run = tmp_path_factory.mktemp(f"{fam.model_type}_pretraining_run")
    params = family_fixtures.random_params(fam.config, head, seed=2)
    convert.save_pretrained(run / "export", fam.config, params, head)
    fam.tokenizer.save(run / "export")
    return dataclasses.replace(fam, head=head, params=params, path=run)


def _verified(proc: subprocess.CompletedProcess) -> float:
    """The worst difference `--verify` printed, after checking the command ended well."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    worst = re.search(r"verify: worst max abs difference (\S+) over (\d+) outputs", proc.stdout)
    assert worst and int(worst[2]) >= 1 + 3 + 2, proc.stdout  # logits, states, maps
    return float(worst[1])


# DeBERTa-v3's in the default stage: its replaced-token detector is the head transformers has no
# class for. The others' heads are transformers' own classes, whose --verify the family's
# convert tests run in this process (convert_test, roberta_test, electra_test, ...): -m e2e.
# CI's e2e stage runs ELECTRA's (its discriminator), ModernBERT's, MPNet's and Jina-v3's
# (its adapters); -m full the rest. The two refusals below: ModernBERT's and MPNet's in CI.
REFUSED_IN_E2E = ("modernbert", "mpnet")
CONVERTED_IN_E2E = (*REFUSED_IN_E2E, "electra", "jina_embeddings_v3")
CONVERTED_IN_FULL = ("bert", "roberta", "xlm-roberta", "nomic_bert", "gte", "eurobert")
REFUSED_IN_FULL = (*CONVERTED_IN_FULL, "electra", "jina_embeddings_v3")


@pytest.mark.parametrize(
    "fam", family_params(e2e=CONVERTED_IN_E2E, full=CONVERTED_IN_FULL), indirect=True
)
def test_convert_verifies_the_pretraining_export_both_ways(pretraining_run, tmp_path, capsys):
    """`python -m bert_jax.convert RUN OUT --to hf --verify` on the run's export, then OUT back
    with --verify (`convert.main`): both compared with PyTorch (for a head transformers lacks:
    its family's base model, and the head's logits computed from the written weights), within
    1e-5."""
    import transformers

    run, head = pretraining_run.path, pretraining_run.head
    proc = command("bert_jax.convert", run, "hf", "--to", "hf", "--verify", tmp_path=tmp_path)
    assert _verified(proc) < 1e-5, proc.stdout
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["architectures"] == [head], written
    compared = next(line for line in proc.stdout.splitlines() if line.startswith("verify: "))
    if hasattr(transformers, head):
        assert compared == f"verify: bert_jax's {head} against transformers' {head}", compared
    else:
        base = pretraining_run.family.base_model
        assert f"against transformers' {base} (it has no {head}" in compared, compared
    # Its hf/ back, in this process for the suite's time (the same comparison, from SRC).
    assert convert.main([str(tmp_path / "hf"), str(tmp_path / "back"), "--verify"]) == 0
    worst = re.search(r"verify: worst max abs difference (\S+)", capsys.readouterr().out)
    assert worst and float(worst[1]) < 1e-5
    loaded = pretrained.load(str(tmp_path / "back"))
    assert loaded.head == head
    jax.tree_util.tree_map(np.testing.assert_array_equal, loaded.params, pretraining_run.params)


# DeBERTa-v3's in the default stage (the class names cross the same way in every family,
# `Family.head_for`; test_from_pretrained_refuses_a_head_of_another_family runs every family).
@pytest.mark.parametrize(
    "fam", family_params(e2e=REFUSED_IN_E2E, full=REFUSED_IN_FULL), indirect=True
)
def test_convert_refuses_a_model_of_another_family(pretraining_run, tmp_path):
    """`convert RUN OUT --model <another family's classifier>`: status 1, one `error:` line
    naming the family and its own class for the head, nothing written."""
    family = pretraining_run.family
    theirs = other_family(pretraining_run).head_for(families.Role.SEQUENCE_CLASSIFICATION)
    ours = family.head_for(families.Role.SEQUENCE_CLASSIFICATION)
    argv = (pretraining_run.path, "out", "--model", theirs)
    proc = command("bert_jax.convert", *argv, tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr
    assert sum(line.startswith("error:") for line in lines) == 1, proc.stderr
    display = f"{family.config_class.display_name} ({family.model_type})"
    assert f"{theirs} is a class of " in lines[-1] and f"this model is {display}" in lines[-1]
    assert f"its sequence_classification head is {ours}; pass that" in lines[-1], lines[-1]
    assert not (tmp_path / "out").exists()


# DeBERTa-v3's in the default stage: the report is the same record for every family.
@pytest.mark.parametrize(
    "fam", family_params(e2e=REFUSED_IN_E2E, full=REFUSED_IN_FULL), indirect=True
)
def test_convert_lists_unused_weights_once(pretraining_run, tmp_path):
    """`convert RUN OUT --model <the family's encoder> --allow-new-heads` (a masked LM has no
    pooler): the pretraining head's weights are listed as unused, and any new pooler's as newly
    initialized, each once (the report, not a warning besides it)."""
    family = pretraining_run.family
    argv = (pretraining_run.path, "enc", "--model", family.base_model, "--allow-new-heads")
    proc = command("bert_jax.convert", *argv, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stdout + proc.stderr
    unused = re.search(r"^unused source weights \((\d+)\):\n((?:  \S+\n)+)", proc.stdout, re.M)
    assert unused and len(unused[2].split()) == int(unused[1]), printed
    listed = re.findall(r"^  (\S+)$", proc.stdout, re.M)  # the report's lists
    assert all(printed.count(k) == 1 for k in listed), printed  # each printed once
    assert "stored entries" not in printed, printed  # nothing skipped but buffers


def test_from_pretrained_refuses_a_head_of_another_family(fam, tmp_path):
    """`bert_jax.from_pretrained(DIR, head=<another family's class>)` raises ValueError naming the
    family and its own class for the head (no weights read); a role stands for the family's."""
    import bert_jax

    other = other_family(fam)
    for role in (families.Role.ENCODER, families.Role.SEQUENCE_CLASSIFICATION):
        ours = fam.family.head_for(role)
        with pytest.raises(ValueError, match=f"its {role.value} head is {ours}; pass that"):
            bert_jax.from_pretrained(str(fam.path), head=other.head_for(role))
    assert bert_jax.from_pretrained(str(fam.path), head="masked_lm").head == fam.head


# BERT's in the default stage: every family reads config.json alike (`EncoderConfig.from_hf_dict`)
# and the reranker job's export the same way (`checkpoints.cross_encoder`).
# CI's e2e stage: DeBERTa-v3's, ModernBERT's and Jina-v3's; -m full the rest.
RERANK_IN_FULL = ("roberta", "xlm-roberta", "electra", "nomic_bert", "gte", "eurobert", "mpnet")


@pytest.mark.parametrize(
    "fam",
    family_params(e2e=("deberta-v2", "modernbert", "jina_embeddings_v3"), full=RERANK_IN_FULL),
    indirect=True,
)
def test_rerank_reads_the_reranker_jobs_export_in_silence(fam, tmp_path):
    """`python -m bert_jax.inference rerank --model DIR` on a CrossEncoder directory as the
    reranker job exports it (`save_cross_encoder`: config.json's `sentence_transformers` block
    among its keys): the scores, and no warning about config.json's keys or skipped entries."""
    from bert_jax.checkpoints.cross_encoder import save_cross_encoder

    config = fam.config.replace(num_labels=1, label_names=None)
    head = fam.family.head_for(families.Role.SEQUENCE_CLASSIFICATION)
    params = family_fixtures.random_params(config, head, seed=3)
    model = tmp_path / "reranker"
    save_cross_encoder(model, config, params, tokenizer=fam.tokenizer, max_seq_length=64)
    assert "sentence_transformers" in json.loads((model / "config.json").read_text())
    (tmp_path / "pairs.txt").write_text(f"{TEXTS[0]}\t{TEXTS[1]}\n{TEXTS[0]}\t{TEXTS[2]}\n")
    argv = ["rerank", "--model", model, "--input", "pairs.txt", "--output", "scores.npy"]
    proc = command("bert_jax.inference", *argv, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert np.load(tmp_path / "scores.npy").shape == (2,)
    for said in ("not used by bert_jax", "sentence_transformers", "stored entries"):
        assert said not in proc.stdout + proc.stderr, proc.stderr[-3000:]


# --------------------------------------------------------------------------------------------
# train.py --mode=compile, without the device
# --------------------------------------------------------------------------------------------
def _require_compiler(topology: str) -> None:
    """Skips where the compiler for `topology` is absent (`make setup` installs both)."""
    if not topology.startswith("gpu:"):
        pytest.importorskip("libtpu", reason="needs the tpu extra (libtpu)")
        return
    from bert_jax.parallel import aot

    plugin = os.path.join(aot.CUDA_COMPILE_DIR, "jax_plugins", "xla_cuda12")
    if not (aot.cuda_plugin_installed() or os.path.isdir(plugin)):
        pytest.skip("needs JAX's CUDA plugin (make setup installs it)")


# Each family's step compiled for one target, each target compiling families of every stack
# (DeBERTa-v3's disentangled attention for both): a compile of 15-30 s in a process of its own.
TARGETS = {"gpu:h100": "NVIDIA H100 80GB HBM3", "v5e:2x2": "TPU v5 lite"}
COMPILED_FOR = {
    "gpu:h100": ("bert", "electra", "deberta-v2", "gte", "modernbert", "mpnet"),
    "v5e:2x2": ("roberta", "xlm-roberta", "deberta-v2", "jina_embeddings_v3", "eurobert", "nomic_bert"),
}  # fmt: skip


# CI's e2e stage: BERT for the H100, DeBERTa-v3 and EuroBERT for the v5e; -m full the
# rest (tests/models/roberta_test.py compiles a RoBERTa directory for both in CI).
COMPILED_IN_CI = {"gpu:h100": ("bert",), "v5e:2x2": ("deberta-v2", "eurobert")}


def test_every_family_compiles_for_a_target():
    assert {f for fams in COMPILED_FOR.values() for f in fams} == set(families.FAMILIES)
    assert all(set(fams) <= set(COMPILED_FOR[t]) for t, fams in COMPILED_IN_CI.items())


@pytest.mark.parametrize(
    "fam, topology, device_kind",
    [
        pytest.param(
            f, t, TARGETS[t], marks=pytest.mark.e2e if f in COMPILED_IN_CI[t] else pytest.mark.full
        )
        for t, fams in COMPILED_FOR.items()
        for f in fams
    ],
    indirect=["fam"],
)
def test_finetuning_compiles_without_the_device(fam, topology, device_kind):
    """`train.py --mode=compile` of MRPC from the fixture: the family's classifier step, in
    bfloat16, compiled for an H100 and for a TPU v5e 2x2 slice (its batch sharded over the
    chips), fits."""
    _require_compiler(topology)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), f"--config={ROOT}/configs/finetune.py:task=mrpc",
         f"--config.init_from={fam.path}", "--config.finetune.max_seq_length=32",
         "--mode=compile", f"--topology={topology}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["fits"] is True and report["device_kind"] == device_kind, report
    assert (report["task"], report["batch"], report["dtype"]) == ("mrpc", [32, 32], "bfloat16")
    assert report["model_flops_per_device"] > 0 and report["eval_hbm_gib"] > 0
