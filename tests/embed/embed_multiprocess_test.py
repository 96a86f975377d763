"""The embedding job on 2 real JAX processes (4 CPU devices each, gloo) trains loss for loss as
one process on one device: the in-batch negatives of every anchor are the whole global batch's,
gathered across every device and host (a per-device or per-host loss would see 1/8 or 1/2 of
them and differ), with GradCache chunks, and the dev retrieval scores agree."""

import json
import sys

import numpy as np
import pytest

from bert_jax import tokenization
from tests.embed.embed_test import WORDS, translated_pairs, write_jsonl, write_table
from tests.parallel.multiprocess_test import two_processes
from tests.train_test import ROOT, losses, run

pytestmark = pytest.mark.multiprocess


def embed_cmd(workdir, data, *extra):
    return [
        sys.executable,
        f"{ROOT}/train.py",
        f"--config={ROOT}/configs/embed.py:size=tiny",
        f"--workdir={workdir}",
        f"--config.embed.train_file={data / 'train.jsonl'}",
        f"--config.embed.dev_file={data / 'dev.csv'}",
        f"--config.embed.tokenizer={data / 'vocab'}",
        "--config.embed.pooling=mean",
        "--config.num_microbatches=2",
        "--config.log_every_steps=1",
        *extra,
    ]


# The only run of a job's dev scoring over two processes (`inference.batches.run_on_mesh`, whose
# parameters span both processes' devices): in the e2e stage, which CI runs, for the default's time.
@pytest.mark.e2e
def test_two_processes_train_as_one_device(tmp_path):
    rng = np.random.default_rng(0)
    tokenization.train_wordpiece([" ".join(WORDS)] * 3, vocab_size=100, min_frequency=1).save(
        tmp_path / "vocab"
    )
    write_jsonl(tmp_path / "train.jsonl", translated_pairs(rng, 32))
    dev = translated_pairs(rng, 8)
    write_table(
        tmp_path / "dev.csv", ["anchor", "positive"], [[r["anchor"], r["positive"]] for r in dev]
    )
    run(embed_cmd(tmp_path / "one", tmp_path), devices=1)
    two_processes(lambda flags: embed_cmd(tmp_path / "two", tmp_path, *flags), tmp_path / "logs")
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(one) == [1, 2, 3, 4]
    np.testing.assert_allclose([two[s] for s in one], [one[s] for s in one], rtol=2e-5)
    results = [json.loads((tmp_path / d / "results.json").read_text()) for d in ("one", "two")]
    np.testing.assert_allclose(
        results[1]["seeds"]["0"]["ndcg@10"], results[0]["seeds"]["0"]["ndcg@10"], rtol=1e-5
    )
    assert (tmp_path / "two" / "hf" / "modules.json").exists()
