"""The MLM-only families through the pretraining job (`configs/pretrain.py:arch=...`), as a user
runs it: the default Shakespeare corpus and the recipe's masking, rows and optimizer; the run
leaves the unigram plateau and its export is transformers' masked LM (with, for RoBERTa, its
byte-level BPE tokenizer, for XLM-R its Unigram one). The recipes' configs are checked in
`<arch>_run_test.py` (XLM-R's in `roberta_run_test.py`)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import tokenization
from bert_jax.models import families
from tests.checkpoints.model_card_test import card_metadata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# arch -> (steps, timeout in seconds, the exported head, the family's display name). On 2 cores
# ModernBERT's run takes about 67 s; RoBERTa's first builds the corpus's byte-level BPE (a minute),
# XLM-R's its Unigram vocabulary (about 15 s) before its shards.
RUNS = {
    "modernbert": (60, 900, "ModernBertForMaskedLM", "ModernBERT"),
    "roberta": (200, 1800, "RobertaForMaskedLM", "RoBERTa"),
    "xlm-roberta": (200, 1800, "XLMRobertaForMaskedLM", "XLM-RoBERTa"),
}
# The tokenizer each family's default corpus is built with (none: random ids are compared).
TOKENIZERS = {
    "roberta": tokenization.ByteLevelBPETokenizer,
    "xlm-roberta": tokenization.SentencePieceTokenizer,
}


def _inputs(arch: str, hf_dir, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """input_ids and attention_mask [B, L] to compare the export with transformers on: RoBERTa's
    and XLM-R's two padded sentences, tokenized by transformers as by bert_jax (checked),
    ModernBERT's random ids."""
    if arch not in TOKENIZERS:
        ids = np.random.RandomState(0).randint(5, vocab_size, (2, 40))
        return ids, np.ones_like(ids)
    ours = tokenization.load_tokenizer(hf_dir)
    assert isinstance(ours, TOKENIZERS[arch]) and ours.vocab_size == 8192
    import transformers

    theirs = transformers.AutoTokenizer.from_pretrained(hf_dir)
    text = ["Good morrow, <mask> lord.", "To be, or not to <mask>: that is the question."]
    encoded = theirs(text, padding=True, return_tensors="np")
    rows = [ours.build_inputs(ours.encode(t))[0] for t in text]
    assert rows == [list(i[m > 0]) for i, m in zip(encoded["input_ids"], encoded["attention_mask"])]
    return encoded["input_ids"], encoded["attention_mask"]


# A minute or more each on 2 cores: with -m full (`make test-full`), out of CI for its time. CI's
# e2e stage trains XLM-R's recipe from scratch (tests/pretrain/roberta_run_test.py) and holds the
# main job's recipe to the same plateau (tests/pretrain/recipe_test.py).
@pytest.mark.full
@pytest.mark.parametrize("arch", sorted(RUNS))
def test_mlm_pretraining_leaves_the_unigram_plateau(tmp_path, arch):
    steps, timeout, head, display_name = RUNS[arch]
    workdir = tmp_path / "run"
    cmd = [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "--config=" + os.path.join(ROOT, "configs", "pretrain.py") + f":arch={arch}",
        f"--workdir={workdir}",
        f"--config.num_train_steps={steps}",
        f"--config.eval_every_steps={steps}",
        "--config.num_eval_steps=4",
        "--config.log_every_steps=20",
    ]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
    evals = {r["step"]: r for r in rows if "eval/mlm_accuracy" in r}
    share = evals[0]["eval/commonest_token_share"]
    assert 0.02 < share < 0.2
    # The decoder bias starts at the data's log frequencies: step 0 guesses the commonest token.
    assert abs(evals[0]["eval/mlm_accuracy"] - share) < 0.01
    assert evals[steps]["eval/mlm_accuracy"] > share + 0.03, (share, evals)
    assert "eval/nsp_accuracy" not in evals[steps]  # MLM only
    hf_dir = workdir / "hf"
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["model_type"] == arch and config["architectures"] == [head]
    meta = card_metadata(hf_dir)  # the Hub card names the family and its widget
    assert meta["pipeline_tag"] == "fill-mask" and arch in meta["tags"]
    assert f"A {display_name} model ({head})" in (hf_dir / "README.md").read_text()

    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from bert_jax.checkpoints import hf

    model, info = getattr(transformers, head).from_pretrained(hf_dir, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    cfg, params = hf.load_pytorch(hf_dir, model=head)[:2]
    ids, mask = _inputs(arch, hf_dir, cfg.vocab_size)
    with torch.no_grad():
        ref = model.eval()(torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    out = families.get_model_class(head)(cfg).apply({"params": params}, ids, attention_mask=mask)
    real = mask > 0
    np.testing.assert_allclose(np.asarray(out.logits)[real], ref[real], atol=1e-4)
