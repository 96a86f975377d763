"""The job registry (`bert_jax.training.job`): train.py looks the job up, an unknown one is one
`error:` line, and a job from outside bert_jax (tests/training/toy_job/) is its folder plus its
config file."""

import json
import os
import subprocess
import sys

import pytest

from bert_jax.training import job, settings
from tests.commands_test import ROOT, clean_env
from tests.family_fixtures import load_config

TOY_CONFIG = os.path.join(ROOT, "tests", "training", "toy_job", "config.py")


def _train_py(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    """train.py run as a user runs it: a fresh HOME, no HF_* variables, from the repository."""
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), *flags],
        env=clean_env(tmp_path / "home"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_every_job_folder_is_found():
    assert {"pretraining", "mlm", "rtd", "finetune", "embed", "rerank"} <= set(job.known())
    assert job.get("embed").block == "embed" and job.get("rtd") is job.get("mlm")


def test_a_name_two_jobs_claim_is_refused():
    embed = job.get("embed")
    other = job.Job(("embed",), "mine", embed.check, lambda *a, **k: None, embed.compile)
    with pytest.raises(ValueError, match="two jobs register config.job='embed'"):
        job.register(other)
    assert job.get("embed") is embed


def test_an_unknown_job_is_one_error_line_naming_the_known_ones(tmp_path):
    proc = _train_py(
        tmp_path,
        f"--config={ROOT}/configs/pretrain.py:size=tiny",
        "--config.job=pretrain",
        f"--workdir={tmp_path / 'run'}",
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: config.job='pretrain': no such job; known jobs: embed, "), last
    assert "pretraining, rerank, rtd" in last and "'Adding a job'" in last
    assert not (tmp_path / "run").exists()


def test_a_job_is_its_folder_plus_its_config_file(tmp_path):
    """The toy job, registered by its own config file, trains two steps of the tiny model and
    writes what a job writes: settings, results, metrics, the export with its model card."""
    workdir = tmp_path / "run"
    proc = _train_py(tmp_path, f"--config={TOY_CONFIG}", f"--workdir={workdir}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "toy dev accuracy: " in proc.stdout
    results = json.loads((workdir / "results.json").read_text())
    assert results["task"] == "toy" and set(results["seeds"]) == {"0"}
    assert 0.0 <= results["seeds"]["0"]["accuracy"] <= 1.0
    assert json.loads((workdir / "settings.json").read_text())["config"]["toy.num_examples"] == 8
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 2]
    assert (workdir / "export" / "config.json").exists()
    assert (workdir / "hf" / "model.safetensors").exists()
    assert 'pipeline_tag: "text-classification"' in (workdir / "hf" / "README.md").read_text()
    assert not (workdir / "checkpoints").exists()


@pytest.mark.parametrize(
    "name,variant", [("finetune.py", "task=mrpc"), ("embed.py", ""), ("rerank.py", "")]
)
def test_a_rerun_that_adds_seeds_keeps_the_finished_ones(name, variant, tmp_path):
    """A seeded job's seed list is bookkeeping (`Job.bookkeeping`'s default): a rerun in the
    same workdir with more seeds reuses the finished one rather than refusing the workdir."""
    config = load_config(name, variant)
    block = job.get(config.job).block
    assert job.get(config.job).bookkeeping == (f"{block}.seeds",)
    settings.start_results(tmp_path, settings.run_record(config, {}, "t"), [0])
    (tmp_path / "results.json").write_text(json.dumps({"task": "t", "seeds": {"0": {"a": 1.0}}}))
    config[block].seeds = "0,1"
    rerun = settings.start_results(tmp_path, settings.run_record(config, {}, "t"), [0, 1])
    assert rerun["seeds"] == {"0": {"a": 1.0}}
