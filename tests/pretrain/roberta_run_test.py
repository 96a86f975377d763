"""RoBERTa through the pretraining job (`configs/pretrain.py:arch=roberta`): the recipe's config,
and (marked e2e: the byte-level BPE build of the corpus takes a minute) a short run as a user runs
it that leaves the unigram plateau and exports transformers' RobertaForMaskedLM with its
tokenizer."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import tokenization
from bert_jax.models import families
from bert_jax.training import objectives
from tests.common import load_config_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_roberta_config_is_the_recipe():
    module = load_config_file("pretrain.py")
    c = module.get_config("arch=roberta")
    cfg = families.config_from_fields(c.model.to_dict())
    assert families.family_of(cfg).model_type == "roberta"
    assert families.family_of(cfg).head_for(objectives.get_objective(c.job).head) == (
        "RobertaForMaskedLM"
    )
    assert c.job == "mlm" and c.data.masked_lm_prob == 0.15 and c.data.dynamic_masking
    assert c.data.full_sentences and c.data.vocab_kind == "bpe" and not c.data.pack_sequences
    opt = c.optimizer
    assert (opt.b1, opt.b2, opt.eps, opt.weight_decay, opt.clip_norm) == (0.9, 0.98, 1e-6, 0.01, 0)
    assert opt.schedule == "linear" and opt.bias_correction
    base, large = (
        module.get_config("size=base,arch=roberta"),
        module.get_config("size=large,arch=roberta"),
    )
    assert base.data.max_seq_length == large.data.max_seq_length == 512
    assert base.global_batch_size == large.global_batch_size == 8192
    assert (base.optimizer.peak_learning_rate, base.optimizer.warmup_steps) == (6e-4, 24_000)
    assert (large.optimizer.peak_learning_rate, large.optimizer.warmup_steps) == (4e-4, 30_000)
    assert base.num_train_steps == large.num_train_steps == 500_000
    assert base.model.vocab_size == 50265 and large.model.num_hidden_layers == 24
    assert base.data.max_predictions_per_seq >= 0.15 * 512
    with pytest.raises(ValueError, match="arch=roberta has sizes"):
        module.get_config("size=mini,arch=roberta")
    with pytest.raises(ValueError, match="one phase"):
        module.get_config("size=base,arch=roberta,phase=2")


@pytest.mark.e2e
def test_roberta_pretraining_leaves_the_unigram_plateau(tmp_path):
    workdir, steps = tmp_path / "run", 200
    cmd = [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "--config=" + os.path.join(ROOT, "configs", "pretrain.py") + ":arch=roberta",
        f"--workdir={workdir}",
        f"--config.num_train_steps={steps}",
        f"--config.eval_every_steps={steps}",
        "--config.num_eval_steps=4",
        "--config.log_every_steps=20",
    ]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    evals = {r["step"]: r for r in rows if "eval/mlm_accuracy" in r}
    share = evals[0]["eval/commonest_token_share"]
    assert abs(evals[0]["eval/mlm_accuracy"] - share) < 0.01  # the unigram start
    assert evals[steps]["eval/mlm_accuracy"] > share + 0.03, (share, evals)
    hf_dir = workdir / "hf"
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["model_type"] == "roberta" and config["architectures"] == ["RobertaForMaskedLM"]
    ours = tokenization.load_tokenizer(hf_dir)
    assert isinstance(ours, tokenization.ByteLevelBPETokenizer) and ours.vocab_size == 8192

    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from bert_jax.checkpoints import hf

    model = transformers.RobertaForMaskedLM.from_pretrained(hf_dir).eval()
    theirs = transformers.AutoTokenizer.from_pretrained(hf_dir)
    text = ["Good morrow, <mask> lord.", "To be, or not to <mask>: that is the question."]
    encoded = theirs(text, padding=True, return_tensors="np")
    rows = [ours.build_inputs(ours.encode(t))[0] for t in text]
    assert [r for r in rows] == [
        list(i[m > 0]) for i, m in zip(encoded["input_ids"], encoded["attention_mask"])
    ]
    cfg, params = hf.load_pytorch(hf_dir, model="RobertaForMaskedLM")[:2]
    with torch.no_grad():
        ref = model(**{k: torch.tensor(v) for k, v in encoded.items()}).logits.numpy()
    out = families.get_model_class("RobertaForMaskedLM")(cfg).apply(
        {"params": params}, encoded["input_ids"], attention_mask=encoded["attention_mask"]
    )
    mask = encoded["attention_mask"] > 0
    np.testing.assert_allclose(np.asarray(out.logits)[mask], ref[mask], atol=1e-4)
